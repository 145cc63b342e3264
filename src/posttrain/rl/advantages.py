"""Advantage estimators: GRPO, RLOO, GAE.

All functions take tensors and floats, never the recipe.

- GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (r_i - mean(r)) / (std(r) + eps)`` within a group of
  completions of the same prompt. ``scale=False`` drops the std division (Dr. GRPO, Liu et al. 2025).
  std is the *sample* standard deviation (Bessel-corrected, ``torch.std`` default), as in TRL's GRPOTrainer.
- RLOO (Ahmadian et al. 2024): ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean(r))``.
- GAE (Schulman et al. 2016): ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``,
  returns ``= A + V``; ``V`` after the last valid token is 0 (the episode ends).
"""

from __future__ import annotations


def grpo_advantages(rewards, scale: bool = True, eps: float = 1e-6):
    """Group-normalised advantages.

    rewards: ``[groups, n]`` float (n completions per prompt). Returns ``[groups, n]``.
    Raises ValueError if n < 2 (no comparison possible).
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, n>=2], got shape {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def rloo_advantages(rewards):
    """Leave-one-out baseline. rewards: ``[groups, n]`` (n >= 2). Returns ``[groups, n]``."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, n>=2], got shape {tuple(rewards.shape)}")
    n = rewards.shape[1]
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)
    return rewards - baseline


def gae(rewards, values, mask, gamma: float, lam: float):
    """Generalised advantage estimation over right-padded token sequences.

    rewards, values, mask: ``[batch, T]`` (mask 1 on valid completion tokens, a contiguous prefix).
    Returns ``(advantages, returns)``, both ``[batch, T]``, zero where mask is 0.
    """
    import torch

    mask = mask.to(rewards.dtype)
    values = values * mask
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        adv[:, t] = last
    return adv, (adv + values) * mask


def zero_std_fraction(rewards, tol: float = 1e-8) -> float:
    """Fraction of groups whose rewards are all equal (no learning signal). rewards: ``[groups, n]``."""
    if rewards.numel() == 0:
        return 0.0
    return float((rewards.std(dim=1) <= tol).float().mean()) if rewards.shape[1] > 1 else 1.0
