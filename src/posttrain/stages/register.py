"""Stage ``register``: log the final model to MLflow and register it as a new version with alias ``candidate``.

Inputs: ``model`` (a saved HF model directory) and ``evaluation`` (the evaluate step directory, with
``metrics.json``); optional ``data_hashes`` (a JSON file: ``{source: sha256}``, or a list of DataReport dicts with
``source`` and ``sha256``). Without it, the sha256 of every local data file the recipe names is computed.

The HF directory is logged as plain artifacts under ``model/`` of the stage's MLflow run (``mlflow.transformers``
would load the model into a pipeline first, which needs the full transformers stack and can reach the network)
and the version is created from the run's artifact URI ``<artifact_uri>/model``. The version's tags carry the
evaluation metrics (``metric.<name>``), recipe name and hash, dataset hashes, pipeline run id and git commit.

Writes ``<out_dir>/registration.json``: ``{"name", "version", "run_id", "model_uri", "source", "tags"}``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from posttrain.artifacts import sha256_file, write_json_atomic
from posttrain.errors import StageError
from posttrain.stages import StageResult

REGISTRATION = "registration.json"


def _flatten(d: dict, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[key] = float(v)
    return out


def read_metrics(evaluation: str | None) -> dict[str, float]:
    """Numeric metrics of an evaluate step: ``metrics.json`` (flat or nested; nested keys joined by ``/``), else
    the ``metrics`` of its ``manifest.json``. Raises StageError when neither exists."""
    if not evaluation:
        raise StageError("input 'evaluation' is missing; pass the evaluate step directory (with metrics.json)")
    p = Path(evaluation)
    for f, pick in ((p / "metrics.json", lambda d: d.get("metrics", d)), (p, lambda d: d.get("metrics", d)),
                    (p / "manifest.json", lambda d: (d.get("result") or {}).get("metrics") or d.get("metrics") or {})):
        if f.is_file():
            try:
                return _flatten(pick(json.loads(f.read_text())))
            except (json.JSONDecodeError, AttributeError) as exc:
                raise StageError(f"evaluation metrics {str(f)!r} are not a JSON object: {exc}") from None
    raise StageError(f"no metrics.json in evaluation input {evaluation!r}; run the evaluate stage first")


def _norm_hashes(obj) -> dict[str, str]:
    if isinstance(obj, dict) and all(isinstance(v, str) for v in obj.values()):
        return dict(obj)
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else []
    return {str(r["source"]): str(r["sha256"]) for r in items if isinstance(r, dict) and "source" in r and "sha256" in r}


def data_hashes(recipe, inputs: dict[str, str]) -> dict[str, str]:
    """``{source: sha256}`` of the datasets: from ``inputs["data_hashes"]`` or ``<evaluation>/data_hashes.json``,
    else computed from the local files the recipe names (HF dataset ids map to ``hf:<id>:<split>``)."""
    for cand in (inputs.get("data_hashes"), str(Path(inputs.get("evaluation") or ".") / "data_hashes.json")):
        if cand and Path(cand).is_file():
            return _norm_hashes(json.loads(Path(cand).read_text()))
    d = recipe.data
    specs = list(d.sft) + [s for s in (d.preference, d.prompts, d.eval_prompts, d.eval_preference) if s is not None]
    out = {}
    for spec in specs:
        p = Path(spec.source)
        if p.is_file():
            out[spec.source] = sha256_file(p)
        elif not p.exists():
            out[spec.source] = f"hf:{spec.source}:{spec.subset or ''}:{spec.split}"
    return out


def lineage_tags(recipe, metrics: dict[str, float], hashes: dict[str, str], run_id: str) -> dict[str, str]:
    """Version tags: metrics, recipe, datasets, pipeline run, git commit (string values)."""
    from posttrain.registry import METRIC_PREFIX, git_commit
    from posttrain.tracking import PARENT_ENV

    tags = {f"{METRIC_PREFIX}{k}": repr(float(v)) for k, v in sorted(metrics.items())}
    tags.update({
        "posttrain.recipe_name": recipe.name, "posttrain.recipe_hash": recipe.hash(),
        "posttrain.algorithm": recipe.algorithm, "posttrain.base_model": recipe.model.name_or_path,
        "posttrain.data_hashes": json.dumps(hashes, sort_keys=True), "posttrain.stage_run_id": run_id,
        "posttrain.pipeline_run_id": os.environ.get("POSTTRAIN_PIPELINE_RUN_ID") or os.environ.get(PARENT_ENV) or "",
    })
    commit = git_commit()
    if commit:
        tags["posttrain.git_commit"] = commit
    return tags


def run(recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """Log ``inputs["model"]`` to MLflow, register a version tagged with metrics and lineage, alias ``candidate``.

    Raises StageError / ModelLoadError for missing inputs, before anything is logged.
    """
    import mlflow

    from posttrain import registry, tracking
    from posttrain.stages._common import require_model_input, write_manifest

    t0 = time.time()
    model_dir = require_model_input(inputs, "model", "register")
    metrics = read_metrics(inputs.get("evaluation"))
    hashes = data_hashes(recipe, inputs)
    name = recipe.tracking.registered_model or recipe.name
    with tracking.stage_run(recipe.tracking.uri, recipe.tracking.experiment, "register",
                            params={"registered_model": name, "recipe_hash": recipe.hash()}) as run_id:
        tracking.log_metrics(metrics)
        mlflow.log_artifacts(model_dir, artifact_path="model")
        mlflow.log_text(recipe.to_json(), "recipe.json")
        mlflow.log_dict(metrics, "metrics.json")
        source = f"{mlflow.get_artifact_uri().rstrip('/')}/model"
        client = registry.get_client(recipe.tracking.uri)
        tags = lineage_tags(recipe, metrics, hashes, run_id)
        mv = registry.register_version(client, name, source, run_id, tags,
                                       reason=f"registered by pipeline run {tags['posttrain.pipeline_run_id'] or run_id}")
        mlflow.set_tags({"posttrain.registered_model": name, "posttrain.registered_version": str(mv.version)})
    reg = {"name": name, "version": str(mv.version), "run_id": run_id, "model_uri": f"models:/{name}/{mv.version}",
           "source": source, "tags": tags}
    write_json_atomic(Path(out_dir) / REGISTRATION, reg)
    out = {"register/version": float(mv.version)}
    notes = [f"registered {name} version {mv.version} (alias candidate) from run {run_id}"]
    write_manifest(out_dir, "register", recipe, {k: v for k, v in inputs.items() if k == "evaluation"}, out,
                   {"registration": str(Path(out_dir) / REGISTRATION)}, time.time() - t0, run_id, notes)
    return StageResult("register", metrics=out, artifacts={"registration": str(Path(out_dir) / REGISTRATION)},
                       wall_s=time.time() - t0, mlflow_run_id=run_id, notes=notes)
