"""Rewards: verifiable GSM8K correctness and format rewards, and a trained reward-model scorer."""

from posttrain.rewards.reward_model import RewardModelScorer
from posttrain.rewards.verifiable import (
    COMPONENTS,
    combined_reward,
    extract_answer,
    format_reward,
    gsm8k_correct,
    normalize_number,
    strip_calculator,
)

__all__ = ["COMPONENTS", "RewardModelScorer", "combined_reward", "extract_answer", "format_reward",
           "gsm8k_correct", "normalize_number", "strip_calculator"]
