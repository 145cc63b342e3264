"""Generation backends for actor ranks: ``hf`` (transformers, CPU/GPU) and ``vllm`` (GPU, stub)."""

from __future__ import annotations


def vllm_usable() -> bool:
    """True when vllm is importable and a CUDA GPU is present."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def make_engine(backend: str, model, tokenizer, stop_ids: list[int], device: str = "cpu",
                model_path: str | None = None):
    """Build a ``GenerationEngine``. ``backend``: 'auto' (vllm when usable, else hf) | 'hf' | 'vllm'.

    Raises ValueError when 'vllm' is requested but not usable.
    """
    if backend == "auto":
        backend = "vllm" if vllm_usable() else "hf"
    if backend == "hf":
        from posttrain.rl.engines.hf import HFEngine

        return HFEngine(model, tokenizer, stop_ids, device=device)
    if backend == "vllm":
        if not vllm_usable():
            raise ValueError("rl.backend='vllm' needs the vllm package and a CUDA GPU; set rl.backend=hf or auto")
        from posttrain.rl.engines.vllm import VLLMEngine

        return VLLMEngine(model_path, tokenizer, stop_ids, sync_param_names=[n for n, _ in model.named_parameters()])
    raise ValueError(f"rl.backend={backend!r}: use 'auto', 'hf' or 'vllm'")
