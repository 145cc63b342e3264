"""The generation-engine interface used by actor ranks.

An engine turns prompt token ids into sampled completions plus the *behaviour log-probs* of the sampled
tokens: ``log p(token)`` under the distribution the token was actually drawn from (logits / temperature,
then top-p truncation and renormalisation). Weights arrive from the learner as named tensors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass
class Generation:
    """Completions for ``B`` prompts (one row per prompt given).

    completion_ids[i]: generated token ids, including the stop token if one was emitted (no padding).
    behaviour_logp[i]: one float per completion token (same length), natural log.
    """

    completion_ids: list[list[int]]
    behaviour_logp: list[list[float]]


class GenerationEngine(ABC):
    """Samples completions and accepts weight updates."""

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], max_new_tokens: int, temperature: float,
                 top_p: float) -> Generation:
        """Sample one completion per prompt (repeat prompts for groups). Returns ``Generation``."""

    @abstractmethod
    def sync_targets(self) -> list:
        """The tensors a weight sync overwrites, in the learner's ``synced_parameters`` order."""

    @abstractmethod
    def weights_loaded(self) -> None:
        """Called after ``sync_targets`` were overwritten (engines with caches refresh them here)."""
