"""Typed messages between actor and learner ranks.

``RolloutBatch`` is what an actor sends: a batch of scored completions of several prompt groups, generated
with weights of one ``policy_version``. On the wire it is ``torch.save`` of a plain dict of tensors and scalars
(loaded back with ``weights_only=True``, so a message can carry no code), preceded by its byte length.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class RolloutBatch:
    """Scored rollouts of ``groups`` prompts x ``n`` completions (``B = groups * n`` rows).

    prompt_ids / prompt_mask: ``[B, P]`` long, left-padded (mask 1 on real tokens).
    completion_ids / completion_mask: ``[B, T]`` long, right-padded; mask 1 on generated tokens up to and
    including the stop token.
    behaviour_logp: ``[B, T]`` float32, log-prob of each sampled token under the distribution it was sampled
    from (temperature and top-p applied).
    rewards: ``[B]`` float32 total reward; group_ids: ``[B]`` long (rows of one prompt share an id).
    reward_parts: name -> ``[B]`` float32 per-component rewards (for metrics).
    policy_version: learner version of the weights that generated the batch.
    gen_seconds: wall seconds the actor spent generating + scoring this batch; wait_seconds: seconds it was
    blocked (backpressure or sending) since its previous batch. probe_logp: log-prob of a fixed probe text under
    the actor's weights (``logprobs.probe_logprob``), to check weight syncs end to end.
    """

    policy_version: int
    actor_rank: int
    batch_index: int
    prompt_ids: Any
    prompt_mask: Any
    completion_ids: Any
    completion_mask: Any
    behaviour_logp: Any
    rewards: Any
    group_ids: Any
    reward_parts: dict = field(default_factory=dict)
    gen_seconds: float = 0.0
    wait_seconds: float = 0.0
    completions_text: list = field(default_factory=list)
    probe_logp: float = 0.0

    @property
    def num_samples(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_generated_tokens(self) -> int:
        return int(self.completion_mask.sum())

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        import torch

        torch.save({f.name: getattr(self, f.name) for f in fields(self)}, buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "RolloutBatch":
        import torch

        d = torch.load(io.BytesIO(data), weights_only=True)
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
