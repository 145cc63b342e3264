"""What every rank of the job knows: its role, the process groups, the recipe and the paths."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class JobContext:
    rank: int
    world_size: int
    learner_ranks: list[int]
    actor_ranks: list[int]
    recipe: object                     # posttrain.recipe.Recipe (only roles read it; components get flat args)
    model_path: str
    out_dir: str
    reward_model_path: str | None = None
    device: str = "cpu"
    rollout_group: object = None       # gloo group of all ranks: RolloutBatch point-to-point
    weights_group: object = None       # learner rank 0 + actors: weight broadcast
    learner_group: object = None       # learner ranks: gradient all-reduce
    extra: dict = field(default_factory=dict)

    @property
    def role(self) -> str:
        return "learner" if self.rank in self.learner_ranks else "actor"

    @property
    def actor_index(self) -> int:
        return self.actor_ranks.index(self.rank)

    @property
    def lead_learner(self) -> int:
        """Learner rank 0: broadcasts weights, logs metrics, saves the model."""
        return self.learner_ranks[0]

    def learner_of(self, actor_rank: int) -> int:
        """The learner an actor sends its rollouts to (actors are dealt round-robin over learners)."""
        return self.learner_ranks[self.actor_ranks.index(actor_rank) % len(self.learner_ranks)]

    def my_actors(self) -> list[int]:
        """For a learner rank: the actors that send to it."""
        return [a for a in self.actor_ranks if self.learner_of(a) == self.rank]

    def groups_per_learner_step(self) -> int:
        """Prompt groups each learner trains on per step (``rl.prompts_per_step`` split over learners)."""
        return -(-self.recipe.rl.prompts_per_step // len(self.learner_ranks))

    def groups_per_actor_batch(self) -> int:
        """Prompt groups in one actor batch: each learner step takes one batch from each of its actors."""
        per_learner_actors = len(self.actor_ranks) // len(self.learner_ranks)
        return -(-self.groups_per_learner_step() // per_learner_actors)

    def effective_staleness(self) -> int:
        """``rl.max_staleness`` in async mode; 0 (lock-step) in sync mode."""
        rl = self.recipe.rl
        return 0 if rl.mode == "sync" else rl.max_staleness
