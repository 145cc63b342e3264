"""Skip-if-done fingerprints: a stage reruns exactly when a recipe field it reads, or an upstream output, changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.artifacts import write_json_atomic
from posttrain.orchestrate.steps import fingerprint
from posttrain.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def _fp(stage: str, *overrides: str, inputs: dict | None = None) -> str:
    return fingerprint(load_recipe(ROOT / "pipelines/recipes/tiny-cpu.yaml", list(overrides)), stage, inputs or {})


@pytest.mark.parametrize("stage,override,reruns", [
    ("sft", "data.prompts.max_rows=7", False),        # RL prompts do not touch SFT
    ("sft", "rl.max_steps=3", False),
    ("sft", "sft.max_steps=3", True),
    ("sft", "data.overlength=truncate", True),
    ("base", "data.prompts.max_rows=7", False),
    ("base", "evaluate.gsm8k_samples=5", True),        # the baseline evaluation uses these settings
    ("reward", "data.sft=[]", False),
    ("reward", "data.preference.max_rows=9", True),
    ("rl", "data.preference.max_rows=9", False),
    ("rl", "data.prompts.max_rows=7", True),
    ("rl", "algorithm=rloo", True),
    ("evaluate", "rl.max_steps=3", False),             # reaches evaluate through its input's fingerprint instead
    ("push", "push.destination=elsewhere", True),
])
def test_stage_reruns_only_for_fields_it_reads(stage, override, reruns):
    extra = ["sft.enabled=false"] if override == "data.sft=[]" else []
    assert (_fp(stage) != _fp(stage, override, *extra)) is reruns


def test_upstream_fingerprint_propagates(tmp_path):
    up = tmp_path / "sft"
    write_json_atomic(up / "manifest.json", {"fingerprint": "aaa", "complete": True})
    a = _fp("rl", inputs={"model": str(up)})
    write_json_atomic(up / "manifest.json", {"fingerprint": "bbb", "complete": True})
    assert _fp("rl", inputs={"model": str(up)}) != a
