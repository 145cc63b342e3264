"""The whole pipeline through the real KFP local runner on a minimal recipe, both branches.

Real parts only: kfp.local.SubprocessRunner runs every component as a subprocess, the RL branch launches the real
torchrun job, MLflow is a real tracking server on loopback (the ``mlflow_server`` fixture), the push goes to a
local bucket directory. Asserts the registry holds a version with alias ``candidate`` carrying its evaluation
metrics, and the bucket holds the model and a manifest whose sha256s match the files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _minimal_recipe(tmp_path: Path, algorithm: str, tracking_uri: str) -> Path:
    raw = yaml.safe_load((ROOT / "pipelines/recipes/tiny-cpu.yaml").read_text())
    raw["name"] = f"e2e-{algorithm}"
    raw["algorithm"] = algorithm
    raw["output_dir"] = str(tmp_path / "runs")
    d = raw["data"]
    d["sft"] = [{**d["sft"][0], "max_rows": 64}]
    d["preference"]["max_rows"] = 48
    d["eval_preference"]["max_rows"] = 16
    d["prompts"]["max_rows"] = 32
    d["eval_prompts"]["max_rows"] = 8
    raw["sft"].update(max_steps=3, batch_size=4)
    raw["reward"].update(max_steps=3, batch_size=4)
    raw["dpo"].update(max_steps=3, batch_size=4)
    raw["rl"].update(max_steps=3, prompts_per_step=2, num_generations=2, max_new_tokens=8)
    raw["evaluate"].update(gsm8k_samples=4, preference_pairs=8, max_new_tokens=8)
    raw["tracking"] = {"uri": tracking_uri, "experiment": "e2e"}
    raw["push"]["destination"] = str(tmp_path / "buckets" / "{name}")
    path = tmp_path / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "dpo"])
def test_pipeline_end_to_end(algorithm, tmp_path, monkeypatch, mlflow_server):
    import mlflow

    from posttrain.orchestrate.local import run_pipeline
    from posttrain.recipe import load_recipe

    monkeypatch.chdir(ROOT)
    recipe = load_recipe(_minimal_recipe(tmp_path, algorithm, mlflow_server))
    summary = run_pipeline(recipe)
    assert summary.ok, summary.error
    statuses = {r.stage: r.status for r in summary.rows}
    trained = "dpo" if algorithm == "dpo" else "rl"
    assert statuses == {s: "ran" for s in ("base", "sft", "reward", trained, "evaluate", "register", "gate", "push")}

    client = mlflow.MlflowClient(mlflow_server)
    version = client.get_model_version_by_alias(recipe.name, "candidate")
    evaluation = json.loads((tmp_path / "runs" / recipe.name / "evaluate" / "metrics.json").read_text())
    tag_value = version.tags.get("final/gsm8k_accuracy") or version.tags.get("metric.final/gsm8k_accuracy")
    assert tag_value is not None and float(tag_value) == pytest.approx(evaluation["final/gsm8k_accuracy"])

    bucket = tmp_path / "buckets" / recipe.name
    manifest = json.loads((bucket / "posttrain-manifest.json").read_text())
    files = {f["path"]: f for f in manifest["files"]}
    assert any(p.endswith(".safetensors") for p in files)
    for rel, entry in files.items():
        assert hashlib.sha256((bucket / rel).read_bytes()).hexdigest() == entry["sha256"]

    # a rerun with the same recipe reuses every finished stage
    again = run_pipeline(recipe)
    assert again.ok and {r.status for r in again.rows} == {"reused"}
