"""Policy-gradient losses on token log-probs. Flat tensor/float arguments, documented shapes.

Notation (per completion token t): ``logp`` log pi_theta (current policy, with grad), ``behaviour_logp`` the
actor's log-prob of the sampled token under the sampling distribution, ``proximal_logp`` the proximal policy
(AReaL, Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning").

Objective (per token, to *minimise*):

    loss_t = - w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)

- ``correction="none"``: PPO (Schulman et al. 2017) with the behaviour policy as the old policy:
  ``r = pi_theta / pi_behaviour``, ``w = 1``.
- ``correction="tis"``: truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"): ``r = pi_theta / pi_prox``, ``w = min(pi_prox / pi_behaviour, C)``
  (w carries no gradient).
- ``correction="decoupled"``: AReaL's decoupled PPO: ``r = pi_theta / pi_prox``, ``w = pi_prox / pi_behaviour``;
  tokens with ``w > C`` are masked out (``w = 0``, AReaL's ``behav_imp_weight_cap``) instead of truncated. With
  ``pi_prox == pi_behaviour`` it is exactly PPO. (Uncapped, a few tokens with weights in the hundreds collapse
  a fast-moving policy; measured on stories260K.)

Clip-higher (``eps_high > eps_low``) is from DAPO (Yu et al. 2025).

Aggregation (``agg``):
- ``"token"``: sum over all valid tokens of the *whole* batch / number of valid tokens (DAPO; Dr. GRPO's
  length-unbiased form up to a constant).
- ``"sequence"``: per-sequence token mean, then mean over sequences (GRPO paper).
For gradient accumulation the caller passes the full batch's ``num_tokens`` / ``num_sequences`` so that the
sum of micro-batch losses equals the full-batch loss exactly.

KL to the reference (``kl_k3``): Schulman's k3 estimator ``exp(ref - logp) - (ref - logp) - 1`` (>= 0, unbiased
for KL(pi_theta || pi_ref) under samples from pi_theta), as in GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass

CORRECTIONS = ("none", "tis", "decoupled")


def aggregate(per_token, mask, agg: str, num_tokens: float | None = None, num_sequences: float | None = None):
    """Reduce a ``[batch, T]`` per-token quantity to a scalar.

    mask: ``[batch, T]`` (1 = valid token). ``num_tokens`` / ``num_sequences``: denominators of the full batch
    (default: this batch's). Raises ValueError for an unknown ``agg``.
    """
    mask = mask.to(per_token.dtype)
    if agg == "token":
        denom = float(num_tokens) if num_tokens is not None else mask.sum().clamp(min=1.0)
        return (per_token * mask).sum() / denom
    if agg == "sequence":
        per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        denom = float(num_sequences) if num_sequences is not None else max(per_token.shape[0], 1)
        return per_seq.sum() / denom
    raise ValueError(f"agg={agg!r}: use 'token' or 'sequence'")


@dataclass
class PolicyLossStats:
    """Diagnostics of one policy-loss call (plain floats, over valid tokens)."""

    clip_fraction: float
    iw_mean: float
    iw_max: float
    ratio_mean: float
    n_tokens: int


def policy_loss(logp, behaviour_logp, advantages, mask, *, proximal_logp=None, correction: str = "tis",
                eps_low: float = 0.2, eps_high: float = 0.2, tis_cap: float = 2.0, agg: str = "token",
                num_tokens: float | None = None, num_sequences: float | None = None):
    """Clipped surrogate policy loss with off-policy correction. Returns ``(loss, PolicyLossStats)``.

    logp (with grad), behaviour_logp, mask: ``[batch, T]``; advantages: ``[batch, T]`` or ``[batch]`` (broadcast
    over tokens); proximal_logp: ``[batch, T]`` or None (= ``logp.detach()``, exact when the learner takes one
    optimizer step per batch of rollouts). Raises ValueError for an unknown ``correction``.
    """
    import torch

    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r}: use one of {list(CORRECTIONS)}")
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    prox = logp.detach() if proximal_logp is None else proximal_logp.detach()
    behaviour_logp = behaviour_logp.detach()
    if correction == "none":
        anchor, w = behaviour_logp, torch.ones_like(logp)
    else:
        anchor = prox
        w = torch.exp(prox - behaviour_logp)
        w = w.clamp(max=tis_cap) if correction == "tis" else torch.where(w > tis_cap, torch.zeros_like(w), w)
    ratio = torch.exp(logp - anchor)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -w * torch.minimum(ratio * advantages, clipped * advantages)
    loss = aggregate(per_token, mask, agg, num_tokens, num_sequences)
    return loss, _stats(ratio, clipped, advantages, w, mask)


def _stats(ratio, clipped, advantages, w, mask) -> PolicyLossStats:
    with __import__("torch").no_grad():
        m = mask.bool()
        n = int(m.sum())
        if n == 0:
            return PolicyLossStats(0.0, 1.0, 1.0, 1.0, 0)
        # a token is clipped when the clipped branch is the active (smaller) one and differs from the unclipped
        is_clipped = (clipped * advantages < ratio * advantages) & (clipped != ratio)
        return PolicyLossStats(
            clip_fraction=float(is_clipped[m].float().mean()),
            iw_mean=float(w[m].mean()), iw_max=float(w[m].max()),
            ratio_mean=float(ratio[m].mean()), n_tokens=n,
        )


def kl_k3(logp, ref_logp):
    """Per-token k3 estimate of KL(pi_theta || pi_ref). logp, ref_logp: ``[batch, T]``. Returns ``[batch, T]``."""
    d = ref_logp.detach() - logp
    return d.exp() - d - 1.0


def value_loss(values, returns, mask, agg: str = "token", num_tokens=None, num_sequences=None):
    """PPO critic loss ``0.5 * (V - R)^2``. values (with grad), returns, mask: ``[batch, T]``. Returns a scalar."""
    per_token = 0.5 * (values - returns.detach()) ** 2
    return aggregate(per_token, mask, agg, num_tokens, num_sequences)


def entropy_from_logits(logits):
    """Per-position entropy in nats of ``softmax(logits)``. logits: ``[..., vocab]`` -> ``[...]``."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
