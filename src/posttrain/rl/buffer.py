"""Staleness filter (learner side) and backpressure rule (actor side). Pure Python, no torch.

Versions: the learner's ``policy_version`` is the number of optimizer steps it has taken (0 = initial weights).
A rollout generated with weights of version ``v`` and trained on at learner version ``t`` has staleness
``t - v``. With ``max_staleness = s``:

- the learner drops rollouts with ``t - v > s`` and counts them (``StalenessFilter``);
- an actor that has produced ``j`` batches (its next batch is number ``j``, 0-based) and whose weights have
  version ``v`` may generate only if ``j - v <= s`` (``Backpressure``). Each learner step consumes one batch per
  actor, so batch ``j`` is trained at learner version ``>= j`` and the rule keeps the expected staleness
  ``<= s`` without dropping anything (AReaL's staleness control, Fu et al. 2025). ``s = 0`` is lock-step.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Backpressure:
    """Actor-side rule: may the actor start its next batch? Scripted-sequence testable."""

    max_staleness: int
    produced: int = 0

    def may_generate(self, actor_version: int) -> bool:
        """True if batch number ``produced`` may be generated with weights of ``actor_version``."""
        return self.produced - actor_version <= self.max_staleness

    def version_needed(self) -> int:
        """The lowest weights version that lets the next batch start."""
        return max(0, self.produced - self.max_staleness)

    def record_batch(self) -> None:
        self.produced += 1


@dataclass
class StalenessFilter:
    """Learner-side filter: keep rollouts at most ``max_staleness`` versions old; count the rest."""

    max_staleness: int
    dropped: int = 0
    kept: int = 0
    staleness_seen: list[int] = field(default_factory=list)

    def accept(self, sample_version: int, learner_version: int, n_samples: int = 1) -> bool:
        """True if a rollout of ``sample_version`` may be trained on at ``learner_version``.

        Raises ValueError if the sample claims a version from the future (a protocol bug).
        """
        staleness = learner_version - sample_version
        if staleness < 0:
            raise ValueError(f"policy_version={sample_version} is ahead of the learner ({learner_version}): "
                             "actors can only hold weights the learner sent")
        if staleness > self.max_staleness:
            self.dropped += n_samples
            return False
        self.kept += n_samples
        self.staleness_seen.extend([staleness] * n_samples)
        return True

    def pop_window(self) -> list[int]:
        """Staleness values accepted since the last call (for per-step mean/max)."""
        out, self.staleness_seen = self.staleness_seen, []
        return out
