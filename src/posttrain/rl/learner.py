"""The learner: turns scored rollouts into one optimizer step (``Learner.train_step``).

One optimizer step per learner step; its batch is split into ``grad_accum`` micro-batches whose losses use the
full batch's denominators, so accumulation does not change the loss or the gradient. Because there is exactly
one optimizer step per batch, the proximal policy of the decoupled/TIS objectives (the weights before this
step) is ``logp.detach()`` of the same forward pass: recomputed by the learner, never taken from the actor.

Departures from the papers, on purpose:
- PPO's critic is a linear value head on the policy's last hidden state (shared trunk), trained jointly;
  the reward is given at the last completion token, old values come from a no-grad pass before the step,
  and there is no value clipping (one step per batch makes it inactive).
- The KL to the reference is a loss term (k3, as in GRPO) for every algorithm, not a reward penalty.
The main loop (``run_learner``) lives in ``learner_loop.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class LearnerConfig:
    algorithm: str = "grpo"          # grpo | rloo | ppo
    temperature: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    correction: str = "tis"          # none | tis | decoupled
    tis_cap: float = 2.0
    scale_rewards: bool = True
    loss_agg: str = "token"
    kl_coef: float = 0.0
    gamma: float = 1.0
    gae_lambda: float = 0.95
    vf_coef: float = 0.5
    grad_accum: int = 1
    max_grad_norm: float = 1.0


class Learner:
    """Holds the policy (optionally PEFT-wrapped), the reference, the PPO value head and the optimizer."""

    def __init__(self, model, cfg: LearnerConfig, lr: float, ref_model=None, value_head=None, group=None):
        """``group``: torch.distributed group of all learner ranks (None or size 1 = a single learner)."""
        import torch

        self.model, self.cfg, self.ref_model, self.value_head = model, cfg, ref_model, value_head
        self.group = group if group is not None and _group_size(group) > 1 else None
        params = [p for p in model.parameters() if p.requires_grad]
        if value_head is not None:
            params += list(value_head.parameters())
        self.params = params
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    # ------------------------------------------------------------------ advantages
    def advantages(self, batch):
        """``[B]`` sequence advantages (GRPO/RLOO) or ``[B, T]`` token advantages + returns (PPO)."""
        import torch

        from posttrain.rl import advantages as adv

        if self.cfg.algorithm in ("grpo", "rloo"):
            grouped = batch.rewards.view(-1, batch.n)
            a = adv.grpo_advantages(grouped, self.cfg.scale_rewards) if self.cfg.algorithm == "grpo" \
                else adv.rloo_advantages(grouped)
            return a.reshape(-1), None
        with torch.no_grad():
            values = self._values(batch)
        mask = batch.completion_mask.float()
        last = (mask.sum(dim=1) - 1).clamp(min=0).long()
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(mask.shape[0]), last] = batch.rewards
        return adv.gae(token_rewards, values, mask, self.cfg.gamma, self.cfg.gae_lambda)

    def _values(self, batch):
        from posttrain.rl.logprobs import forward_logprobs

        _, _, hidden = forward_logprobs(self.model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                        batch.completion_mask, self.cfg.temperature, with_hidden=True)
        return self.value_head(hidden.float()).squeeze(-1)

    # ------------------------------------------------------------------ loss
    def micro_loss(self, mb, adv, returns, num_tokens: float, num_sequences: float):
        """Loss of one micro-batch with full-batch denominators. Returns ``(loss, stats dict)``."""
        from posttrain.rl.logprobs import forward_logprobs
        from posttrain.rl.losses import aggregate, kl_k3, policy_loss, value_loss

        c = self.cfg
        need_hidden = self.value_head is not None
        logp, ent, hidden = forward_logprobs(self.model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                             mb.completion_mask, c.temperature, with_entropy=True,
                                             with_hidden=need_hidden)
        agg = dict(agg=c.loss_agg, num_tokens=num_tokens, num_sequences=num_sequences)
        if adv.dim() == 2:
            adv = adv[:, :logp.shape[1]]
        pl, st = policy_loss(logp, mb.behaviour_logp, adv, mb.completion_mask, correction=c.correction,
                             eps_low=c.eps_low, eps_high=c.eps_high, tis_cap=c.tis_cap, **agg)
        loss, stats = pl, {"policy_loss": float(pl.detach()), "clip_fraction": st.clip_fraction * st.n_tokens,
                           "iw_mean": st.iw_mean * st.n_tokens, "iw_max": st.iw_max,
                           "entropy": float((ent * mb.completion_mask).sum()), "tokens": st.n_tokens}
        if c.kl_coef > 0 and self.ref_model is not None:
            kl = aggregate(kl_k3(logp, self._ref_logp(mb)), mb.completion_mask, **agg)
            loss = loss + c.kl_coef * kl
            stats["kl"] = float(kl.detach())
        if need_hidden:
            v = self.value_head(hidden.float()).squeeze(-1)
            vl = value_loss(v, returns[:, :v.shape[1]], mb.completion_mask, **agg)
            loss = loss + c.vf_coef * vl
            stats["value_loss"] = float(vl.detach())
        return loss, stats

    def _ref_logp(self, mb):
        import torch

        from posttrain.rl.logprobs import forward_logprobs

        with torch.no_grad():
            if self.ref_model == "adapter-disabled":
                with self.model.disable_adapter():
                    return forward_logprobs(self.model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                            mb.completion_mask, self.cfg.temperature)[0]
            return forward_logprobs(self.ref_model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                    mb.completion_mask, self.cfg.temperature)[0]

    # ------------------------------------------------------------------ step
    def accumulate(self, batch):
        """Forward/backward over ``grad_accum`` micro-batches (no optimizer step). Returns summed stats."""
        import torch

        self.model.train()
        adv, returns = self.advantages(batch)
        B = batch.num_rows
        num_tokens, num_seqs = self._all_sum([float(batch.completion_mask.sum()), float(B)])
        num_tokens = max(num_tokens, 1.0)
        chunks = torch.arange(B).chunk(min(self.cfg.grad_accum, B))
        total: dict = {"loss": 0.0}
        for idx in chunks:
            mb = batch.rows(idx)
            a = adv[idx] if returns is None else adv[idx][:, :mb.completion_ids.shape[1]]
            r = None if returns is None else returns[idx][:, :mb.completion_ids.shape[1]]
            loss, st = self.micro_loss(mb, a, r, num_tokens, num_seqs)
            loss.backward()
            total["loss"] += float(loss.detach())
            for k, v in st.items():
                total[k] = max(total.get(k, 0.0), v) if k == "iw_max" else total.get(k, 0.0) + v
        return total

    def train_step(self, batch) -> dict:
        """One optimizer step on ``batch`` (a ``TrainBatch``). Returns metrics (floats)."""
        import torch

        from posttrain.rl.advantages import zero_std_fraction

        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        st = self.accumulate(batch)
        st = self._sync_grads_and_stats(st)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        # A batch without learning signal (every group zero-std, no KL/value term) has a zero gradient. Adam would
        # still move the weights along its momentum, drifting the policy with nothing to learn from; skip it.
        skipped = float(grad_norm) == 0.0
        if not skipped:
            self.optimizer.step()
        n = max(st.pop("tokens"), 1)
        grouped = batch.rewards.view(-1, batch.n)
        r = batch.rewards.double()
        zero = zero_std_fraction(grouped) * grouped.shape[0]
        rs, rsq, rn, zs, ng = self._all_sum([float(r.sum()), float((r * r).sum()), float(r.numel()), zero,
                                             float(grouped.shape[0])])
        var = max(rsq / rn - (rs / rn) ** 2, 0.0) * rn / max(rn - 1, 1)
        out = {"loss": st["loss"], "policy_loss": st["policy_loss"], "clip_fraction": st["clip_fraction"] / n,
               "iw_mean": st["iw_mean"] / n, "iw_max": st["iw_max"], "entropy": st["entropy"] / n,
               "kl": st.get("kl", 0.0), "grad_norm": float(grad_norm), "reward_mean": rs / rn,
               "reward_std": var ** 0.5, "zero_std_groups": zs / ng, "samples": int(rn), "tokens": int(n),
               "skipped_step": float(skipped), "train_s": time.perf_counter() - t0}
        if "value_loss" in st:
            out["value_loss"] = st["value_loss"]
        return out

    # ------------------------------------------------------------------ several learners
    def _all_sum(self, values: list[float]) -> list[float]:
        """Sum ``values`` over the learner group (identity for one learner)."""
        if self.group is None:
            return values
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.group)
        return t.tolist()

    def _sync_grads_and_stats(self, st: dict) -> dict:
        """Sum gradients (each learner's loss already uses global denominators) and loss stats over learners."""
        if self.group is None:
            return st
        import torch
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        off = 0
        for p, g in zip(self.params, grads):
            p.grad = flat[off:off + g.numel()].view_as(g).clone()
            off += g.numel()
        keys = sorted(k for k in st if k != "iw_max")
        summed = dict(zip(keys, self._all_sum([st[k] for k in keys])))
        mx = torch.tensor([st.get("iw_max", 0.0)], dtype=torch.float64)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=self.group)
        return {**summed, "iw_max": float(mx)}


    def param_spread(self) -> float:
        """max - min over learners of the sum of all trainable parameters (0.0 when they are in step)."""
        if self.group is None:
            return 0.0
        import torch
        import torch.distributed as dist

        with torch.no_grad():
            total = float(sum(p.double().sum() for p in self.params))
        t = torch.tensor([total, -total], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t[0] + t[1])


def _group_size(group) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)
