"""Model construction shared by learner and actor ranks (identical trainable-parameter layout on both)."""

from __future__ import annotations


def wrap_lora(model, lora_spec):
    """PEFT-wrap ``model`` when ``lora_spec.enabled`` (adapters trainable, base frozen); else return it as is.

    Learner and actors call this with the same spec, so ``weights.synced_parameters`` lists the same tensors
    in the same order on both sides.
    """
    from posttrain.models import lora_config

    cfg = lora_config(lora_spec)
    if cfg is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, cfg)


def value_head(model):
    """A linear critic ``hidden -> 1`` for PPO, zero-initialised (values start at 0)."""
    import torch

    hidden = model.config.hidden_size if hasattr(model, "config") else model.base_model.config.hidden_size
    head = torch.nn.Linear(hidden, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head
