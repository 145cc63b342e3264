"""The whole pipeline through the real KFP local runner on a minimal recipe, both branches.

Real parts only: kfp.local.SubprocessRunner runs every component as a subprocess, the RL branch launches the real
torchrun job, MLflow is a real tracking server on loopback (the ``mlflow_server`` fixture), the push goes to a
local bucket directory. Asserts the registry holds a version with alias ``candidate`` carrying its evaluation
metrics, and the bucket holds the model and a manifest whose sha256s match the files.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _minimal_recipe(tmp_path: Path, algorithm: str, tracking_uri: str) -> Path:
    raw = yaml.safe_load((ROOT / "pipelines/recipes/tiny-cpu.yaml").read_text())
    raw["name"] = "e2e"
    raw["algorithm"] = algorithm
    raw["output_dir"] = str(tmp_path / "runs")
    d = raw["data"]
    d["sft"] = [{**d["sft"][0], "max_rows": 64}]
    d["preference"]["max_rows"] = 48
    d["prompts"]["max_rows"] = 32
    d["eval_prompts"]["max_rows"] = 8
    raw["sft"].update(max_steps=3, batch_size=4)
    raw["reward"].update(max_steps=3, batch_size=4)
    raw["dpo"].update(max_steps=3, batch_size=4)
    raw["rl"].update(max_steps=3, prompts_per_step=2, num_generations=2, max_new_tokens=8)
    raw["evaluate"].update(gsm8k_samples=4, preference_pairs=8, max_new_tokens=8)
    raw["tracking"] = {"uri": tracking_uri, "experiment": "e2e"}
    raw["gate"]["thresholds"] = {}  # 3 SFT steps teach nothing; blocking gates are covered in test_registry.py
    raw["push"]["destination"] = str(tmp_path / "buckets" / ("{name}-" + algorithm))
    path = tmp_path / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _check_registered_and_pushed(tmp_path: Path, recipe, tracking_uri: str, version: int) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    mv = client.get_model_version_by_alias(recipe.name, "candidate")
    assert int(mv.version) == version
    evaluation = json.loads((tmp_path / "runs" / recipe.name / "evaluate" / "metrics.json").read_text())
    tag_value = mv.tags.get("metric.final/gsm8k_accuracy") or mv.tags.get("final/gsm8k_accuracy")
    assert tag_value is not None and float(tag_value) == pytest.approx(evaluation["final/gsm8k_accuracy"])

    bucket = tmp_path / "buckets" / f"{recipe.name}-{recipe.algorithm}"
    manifest = json.loads((bucket / "posttrain-manifest.json").read_text())
    files = {f["path"]: f for f in manifest["files"]}
    assert any(p.endswith(".safetensors") for p in files)
    for rel, entry in files.items():
        assert hashlib.sha256((bucket / rel).read_bytes()).hexdigest() == entry["sha256"]


@pytest.mark.slow
def test_pipeline_end_to_end_both_branches(tmp_path, monkeypatch, mlflow_server):
    """GRPO branch, then the DPO branch of the same run name (base/sft/reward reused), then a no-op rerun."""
    from posttrain.orchestrate.local import run_pipeline
    from posttrain.recipe import load_recipe

    monkeypatch.chdir(ROOT)
    tail = ("evaluate", "register", "gate", "push")

    grpo = load_recipe(_minimal_recipe(tmp_path, "grpo", mlflow_server))
    env_before = dict(os.environ)
    summary = run_pipeline(grpo)
    assert dict(os.environ) == env_before, "run_pipeline must not leak its run's environment into the caller"
    assert summary.ok, summary.error
    assert {r.stage: r.status for r in summary.rows} == {s: "ran" for s in ("base", "sft", "reward", "rl", *tail)}
    _check_registered_and_pushed(tmp_path, grpo, mlflow_server, version=1)

    dpo = load_recipe(_minimal_recipe(tmp_path, "dpo", mlflow_server))
    summary = run_pipeline(dpo)
    assert summary.ok, summary.error
    expected = {"base": "reused", "sft": "reused", "reward": "reused", "dpo": "ran", **{s: "ran" for s in tail}}
    assert {r.stage: r.status for r in summary.rows} == expected
    _check_registered_and_pushed(tmp_path, dpo, mlflow_server, version=2)

    again = run_pipeline(dpo)
    assert again.ok and {r.status for r in again.rows} == {"reused"}


def test_failed_run_names_the_stage_and_the_cause(tmp_path, monkeypatch, mlflow_server):
    """SFT data whose rows all lack a `#### <answer>` line is empty after filtering: the sft stage fails, the
    summary names the stage and the DataError, later stages are 'not run', the MLflow parent run is FAILED."""
    import mlflow

    from posttrain.orchestrate.local import run_pipeline
    from posttrain.recipe import load_recipe

    monkeypatch.chdir(ROOT)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "2"}\n' * 3)
    path = _minimal_recipe(tmp_path, "grpo", mlflow_server)
    recipe = load_recipe(path, [f"data.sft=[{{source: {bad}, format: gsm8k}}]", "evaluate.gsm8k_samples=2"])
    summary = run_pipeline(recipe)
    assert not summary.ok
    assert "stage 'sft' failed: DataError" in summary.error and "no_gold_answer=3" in summary.error
    statuses = {r.stage: r.status for r in summary.rows}
    assert statuses["base"] == "ran" and statuses["sft"] == "failed" and statuses["push"] == "not run"
    assert mlflow.MlflowClient(mlflow_server).get_run(summary.parent_run_id).info.status == "FAILED"


def test_run_rejects_bad_columns_before_any_stage(tmp_path, monkeypatch):
    """Wrong columns are a RecipeError from run_pipeline itself: no stage runs, no MLflow run is created."""
    from posttrain.orchestrate.local import run_pipeline
    from posttrain.recipe import RecipeError, load_recipe

    monkeypatch.chdir(ROOT)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "1+1?", "a": "2"}\n')
    db = tmp_path / "mlflow.db"
    recipe = load_recipe(_minimal_recipe(tmp_path, "grpo", f"sqlite:///{db}"), [f"data.prompts.source={bad}"])
    with pytest.raises(RecipeError, match=r"data.prompts.source.*expects columns \['question', 'answer'\]"):
        run_pipeline(recipe)
    assert not (tmp_path / "runs").exists() and not db.exists()
