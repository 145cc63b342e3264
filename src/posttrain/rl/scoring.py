"""Actor-side rewards: verifiable rewards (``posttrain.rewards.combined_reward``), the reward model
(``posttrain.rewards.RewardModelScorer``) and the optional keyword reward (``rl.rewards.keyword``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Scorer:
    """Scores completions. ``weights``: component -> weight for ``combined_reward`` (correctness, format,
    reward_model); ``keyword``/``keyword_weight``: extra reward ``keyword_weight * [keyword in completion]``."""

    weights: dict
    keyword: str | None = None
    keyword_weight: float = 1.0
    reward_model: object = None  # a RewardModelScorer, or None

    def score(self, prompts: list[str], completions: list[str], golds: list[str]) -> tuple[list[float], dict]:
        """Returns ``(totals [B], parts: name -> [B])``."""
        from posttrain.rewards import combined_reward

        rm = self.reward_model.score(prompts, completions) if self.reward_model is not None else [None] * len(prompts)
        totals, parts = [], {}
        for c, g, s in zip(completions, golds, rm):
            r = combined_reward(c, g, self.weights, reward_model_score=s)
            total = r.pop("total")
            if self.keyword:
                r["keyword"] = float(self.keyword in c)
                total += self.keyword_weight * r["keyword"]
            totals.append(float(total))
            for k, v in r.items():
                parts.setdefault(k, []).append(float(v))
        return totals, parts


def make_scorer(rewards_spec, reward_model_path: str | None, device: str = "cpu") -> Scorer:
    """Build a ``Scorer`` from ``rl.rewards`` (flat values read here). Raises ``ModelLoadError`` when the reward
    model weight is > 0 and the reward model cannot be loaded, ``ValueError`` when no path was given."""
    weights = {"correctness": rewards_spec.correctness, "format": rewards_spec.format,
               "reward_model": rewards_spec.reward_model}
    rm = None
    if rewards_spec.reward_model > 0:
        if not reward_model_path:
            raise ValueError("rl.rewards.reward_model > 0 but no reward model was given; run the reward stage "
                             "(inputs['reward_model']) or pass --reward-model, or set the weight to 0")
        from posttrain.rewards import RewardModelScorer

        rm = RewardModelScorer(reward_model_path, device=device)
    return Scorer(weights, rewards_spec.keyword, rewards_spec.keyword_weight, rm)
