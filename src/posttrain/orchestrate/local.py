"""Run the pipeline on this machine through the real KFP local runner.

``run_pipeline`` resolves local paths, opens the MLflow parent run, runs the KFP DAG with
``kfp.local.SubprocessRunner(use_venv=False)`` (each component a subprocess of this interpreter), and prints
the one-screen summary. Finished stages are skipped on a rerun with the same inputs (see ``steps.execute``).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from posttrain.orchestrate.steps import ERROR_FILE, execute, scoped_env, stage_dir
from posttrain.orchestrate.summary import Summary, collect, render, stage_notes
from posttrain.recipe import Recipe, _looks_local
from posttrain.stages import StageResult

log = logging.getLogger("posttrain")


def absolutize(recipe: Recipe) -> Recipe:
    """A copy of ``recipe`` whose local model/data paths and output_dir are absolute (subprocesses may cd)."""
    r = recipe.model_copy(deep=True)
    if _looks_local(r.model.name_or_path):
        r.model.name_or_path = str(Path(r.model.name_or_path).expanduser().resolve())
    specs = list(r.data.sft) + [getattr(r.data, k) for k in ("preference", "prompts", "eval_prompts", "eval_preference")]
    for spec in specs:
        if spec is not None and _looks_local(spec.source):
            spec.source = str(Path(spec.source).expanduser().resolve())
    r.output_dir = str(Path(r.output_dir).resolve())
    return r


def _abs_tracking_uri(uri: str) -> str:
    """``sqlite:///rel.db`` -> ``sqlite:////abs/rel.db`` so every subprocess uses the same file."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def _stage_order(recipe: Recipe) -> list[str]:
    train = "dpo" if recipe.algorithm == "dpo" else "rl"
    return ["base", "sft", "reward", train, "evaluate", "register", "gate", "push"]


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _failed_stage(err: BaseException) -> str | None:
    import re

    text = _strip_ansi(str(err))
    m = re.search(r"task failed: '([a-z]+)(?:-\d+)?'", text)
    if m:
        return m.group(1)
    for stage in ("base", "sft", "reward", "rl", "dpo", "evaluate", "register", "gate", "push", "plan"):
        if f"'{stage}'" in text or f"task {stage}" in text or f"{stage} " in text[:200]:
            return stage
    return None


def run_pipeline(recipe: Recipe, recipe_path: str | None = None, fresh: bool = False) -> Summary:
    """Run the whole pipeline locally; print and return the summary (``.ok`` False on failure).

    The tracking URI, the MLflow parent run id and ``--fresh`` reach the component subprocesses through the
    environment, set only for the duration of the run.
    """
    from posttrain import tracking
    from posttrain.data.preflight import preflight

    preflight(recipe, recipe_path or recipe.name)  # RecipeError before any model is loaded
    recipe = absolutize(recipe)
    recipe.tracking.uri = _abs_tracking_uri(recipe.tracking.uri)
    with scoped_env(restore=("MLFLOW_EXPERIMENT_ID",), **{tracking.TRACKING_ENV: recipe.tracking.uri,
                                                           "POSTTRAIN_FRESH": "1" if fresh else "0"}):
        parent = tracking.start_parent_run(recipe.tracking.uri, recipe.tracking.experiment, recipe.name,
                                           tags={"posttrain.recipe_hash": recipe.hash(),
                                                 "posttrain.recipe_path": str(recipe_path or "")})
        with scoped_env(**{tracking.PARENT_ENV: parent}):
            return _run_dag(recipe, parent)


def _run_dag(recipe: Recipe, parent: str) -> Summary:
    """Execute the KFP DAG with the local runner, close the parent run, build and print the summary."""
    import warnings

    from kfp import local

    from posttrain import tracking
    from posttrain.orchestrate.kfp_pipeline import build_pipeline

    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(levelname)s %(message)s")
    root = Path(recipe.output_dir) / recipe.name / "kfp_root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
    pipeline = build_pipeline(recipe)
    error, failed = "", None
    t0 = time.time()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-Python base image.*")
            pipeline(recipe_json=recipe.to_json(), algorithm=recipe.algorithm, parent_run_id=parent)
    except KeyboardInterrupt:
        tracking.end_parent_run(parent, "KILLED")
        raise
    except Exception as err:  # noqa: BLE001 - reported in the summary, run marked FAILED
        error, failed = _strip_ansi(f"{type(err).__name__}: {err}"), _failed_stage(err)
    stages = {s: stage_dir(recipe, s) for s in _stage_order(recipe)}
    cause = (stages.get(failed) / ERROR_FILE) if failed in stages else None
    if cause is not None and cause.is_file():
        error = f"stage '{failed}' failed: {cause.read_text().strip()}"
    rows = collect(stages, parent, failed)
    missing = [r.stage for r in rows if r.status not in ("ran", "reused")]
    if missing and not error:  # never report success for a DAG that silently skipped steps
        error = f"the pipeline finished but these stages did not run: {', '.join(missing)}"
    summary = Summary(ok=not error, rows=rows, parent_run_id=parent, error=error, notes=stage_notes(stages))
    tracking.end_parent_run(parent, "FAILED" if error else "FINISHED")
    summary.notes.append(f"pipeline wall time: {time.time() - t0:.1f} s")
    render(summary, recipe.tracking.uri)
    return summary


def run_one_stage(name: str, recipe: Recipe, input_dirs: dict[str, str], out_dir: str) -> StageResult:
    """Run one stage outside any orchestrator (``posttrain stage``); inputs are upstream step directories."""
    from posttrain.artifacts import read_manifest

    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(levelname)s %(message)s")
    recipe = absolutize(recipe)
    out = execute(name, recipe, input_dirs, os.environ.get("POSTTRAIN_PARENT_RUN_ID", ""), out_dir=out_dir)
    return StageResult.from_dict((read_manifest(out) or {}).get("result", {"stage": name}))
