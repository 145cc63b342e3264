"""Collate ``RolloutBatch``es into padded learner tensors, rows of one prompt group contiguous."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainBatch:
    """Padded tensors for one learner step (``B`` rows, groups contiguous, ``n`` rows per group).

    prompt_ids/prompt_mask ``[B, P]`` (left-padded), completion_ids/completion_mask/behaviour_logp ``[B, T]``
    (right-padded), rewards ``[B]``, versions ``[B]`` (policy_version of each row), n (group size).
    """

    prompt_ids: object
    prompt_mask: object
    completion_ids: object
    completion_mask: object
    behaviour_logp: object
    rewards: object
    versions: object
    n: int

    @property
    def num_rows(self) -> int:
        return int(self.rewards.shape[0])

    def rows(self, idx) -> "TrainBatch":
        """A row subset (``idx``: slice or index tensor), trimmed to its own longest prompt and completion."""
        pm, cm = self.prompt_mask[idx], self.completion_mask[idx]
        p_keep = int(pm.sum(dim=1).max())
        t_keep = max(int(cm.sum(dim=1).max()), 1)
        P = self.prompt_ids.shape[1]
        return TrainBatch(self.prompt_ids[idx][:, P - p_keep:], pm[:, P - p_keep:],
                          self.completion_ids[idx][:, :t_keep], cm[:, :t_keep],
                          self.behaviour_logp[idx][:, :t_keep], self.rewards[idx], self.versions[idx], self.n)


def collate(batches, pad_id: int) -> TrainBatch:
    """Concatenate batches (each already group-contiguous with equal group size). Raises ValueError if group
    sizes differ between batches."""
    import torch

    ns = {_group_size(b) for b in batches}
    if len(ns) != 1:
        raise ValueError(f"rollout batches have different group sizes {sorted(ns)}; "
                         "all actors must use rl.num_generations")
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.completion_ids.shape[1] for b in batches)

    def pad(t, width, value, left):
        extra = width - t.shape[1]
        if extra == 0:
            return t
        fill = torch.full((t.shape[0], extra), value, dtype=t.dtype)
        return torch.cat([fill, t] if left else [t, fill], dim=1)

    return TrainBatch(
        prompt_ids=torch.cat([pad(b.prompt_ids, P, pad_id, True) for b in batches]),
        prompt_mask=torch.cat([pad(b.prompt_mask, P, 0, True) for b in batches]),
        completion_ids=torch.cat([pad(b.completion_ids, T, pad_id, False) for b in batches]),
        completion_mask=torch.cat([pad(b.completion_mask, T, 0, False) for b in batches]),
        behaviour_logp=torch.cat([pad(b.behaviour_logp, T, 0.0, False) for b in batches]),
        rewards=torch.cat([b.rewards.float() for b in batches]),
        versions=torch.cat([torch.full((b.num_samples,), b.policy_version, dtype=torch.long) for b in batches]),
        n=ns.pop(),
    )


def _group_size(b) -> int:
    ids = b.group_ids.tolist()
    n = ids.count(ids[0])
    if any(ids[i] != ids[(i // n) * n] for i in range(len(ids))) or len(ids) % n:
        raise ValueError("rollout batch rows are not group-contiguous with equal group sizes")
    return n
