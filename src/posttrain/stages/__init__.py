"""Pipeline stages. Each module exposes ``run(recipe, inputs, out_dir) -> StageResult``.

A stage is a plain function that knows nothing of KFP or Airflow: ``inputs`` maps names to paths produced by
earlier stages (e.g. ``{"model": ".../sft/model"}``), ``out_dir`` is where it writes (atomically, via
``posttrain.artifacts.atomic_dir``), and the result carries metrics and artifact paths.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StageResult:
    """What a stage returns: ``metrics`` (name -> float), ``artifacts`` (name -> path), ``wall_s`` (seconds)."""

    stage: str
    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    mlflow_run_id: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StageResult":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


STAGES = ("base", "sft", "reward", "dpo", "rl", "evaluate", "register", "gate", "push")
