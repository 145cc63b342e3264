"""posttrain: LLM post-training pipeline (SFT -> reward model -> async RL or DPO -> evaluate -> register -> push)."""

__version__ = "0.1.0"
