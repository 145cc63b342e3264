"""The one place where a pipeline step becomes a stage call: skip-if-done, wiring of inputs, manifests.

Every orchestrator (KFP components, the local runner, Airflow tasks, ``posttrain stage``) calls ``execute``.
A stage's output lives at ``<recipe.output_dir>/<recipe.name>/<stage>``. Its manifest carries a fingerprint of
the recipe sections the stage reads and of its inputs' fingerprints; a rerun whose fingerprint matches a complete
manifest skips the stage (a killed run resumes where it stopped), anything else reruns it from scratch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Iterator

from posttrain.artifacts import MANIFEST, read_manifest, write_json_atomic
from posttrain.recipe import Recipe

log = logging.getLogger("posttrain")

# Recipe fields each stage reads; a change elsewhere does not rerun it (upstream changes arrive through inputs).
_SFT_DATA = ("data.sft", "data.overlength", "data.eval_fraction")
_PREF_DATA = ("data.preference", "data.eval_preference", "data.eval_fraction", "data.overlength")
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "base": ("seed", "model", "data.eval_prompts", "evaluate"),
    "sft": ("seed", "model", *_SFT_DATA, "sft"),
    "reward": ("seed", "model", *_PREF_DATA, "reward"),
    "dpo": ("seed", "model", *_PREF_DATA, "dpo"),
    "rl": ("seed", "algorithm", "model", "data.prompts", "data.overlength", "rl"),
    "evaluate": ("seed", "model", "data.eval_prompts", *_PREF_DATA, "evaluate", "algorithm"),
    "register": ("name", "algorithm", "tracking"),
    "gate": ("gate", "tracking"),
    "push": ("push", "tracking"),
}

ERROR_FILE = "error.txt"  # why a stage failed, for the run summary (the orchestrator only says *that* it failed)

# Which input name of each stage comes from which file inside an upstream step directory.
_INPUT_FILES = {"model": "model", "base_model": "model", "reward_model": "model", "reference": "model"}


@contextlib.contextmanager
def scoped_env(restore: tuple[str, ...] = (), **values: str) -> Iterator[None]:
    """Set environment variables for the component subprocesses, restoring the previous values afterwards.

    ``restore`` names further variables that code inside may set (MLflow exports MLFLOW_TRACKING_URI and
    MLFLOW_EXPERIMENT_ID), so they are put back too.
    """
    old = {k: os.environ.get(k) for k in (*values, *restore)}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stage_dir(recipe: Recipe, stage: str) -> Path:
    """``<output_dir>/<name>/<stage>``, absolute."""
    return (Path(recipe.output_dir) / recipe.name / stage).resolve()


def fingerprint(recipe: Recipe, stage: str, input_dirs: dict[str, str]) -> str:
    """sha256 over the recipe sections ``stage`` reads and the fingerprints of its upstream steps."""
    dumped = recipe.model_dump(mode="json")
    parts = {}
    for sec in STAGE_SECTIONS[stage]:
        node = dumped
        for key in sec.split("."):
            node = node[key]
        parts[sec] = node
    upstream = {}
    for name, d in sorted(input_dirs.items()):
        m = read_manifest(d) if d else None
        upstream[name] = (m or {}).get("fingerprint", d)
    blob = json.dumps({"stage": stage, "recipe": parts, "inputs": upstream}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def resolve_inputs(input_dirs: dict[str, str]) -> dict[str, str]:
    """Map upstream step directories to the paths a stage reads: model dirs point at ``<dir>/model``."""
    out = {}
    for name, d in input_dirs.items():
        if not d:
            continue
        sub = _INPUT_FILES.get(name)
        out[name] = str(Path(d) / sub) if sub and (Path(d) / sub).exists() else str(d)
    return out


def _disabled(recipe: Recipe, stage: str) -> bool:
    section = getattr(recipe, stage, None)
    return bool(section is not None and hasattr(section, "enabled") and not section.enabled)


def execute(stage: str, recipe: Recipe, input_dirs: dict[str, str], parent_run_id: str = "",
            fresh: bool = False, out_dir: str | None = None) -> str:
    """Run ``stage`` unless an up-to-date complete output exists; return its step directory.

    A disabled training stage passes its ``model`` input through (returns the upstream directory); a disabled
    reward stage returns "" (no reward model). Raises ``StageError`` (from the stage) on failure; the previous
    complete output, if any, is left in place until the new one is complete.
    """
    if _disabled(recipe, stage):
        log.warning("stage %s is disabled in the recipe; passing its input through", stage)
        return "" if stage == "reward" else input_dirs.get("model", "")
    out = Path(out_dir) if out_dir else stage_dir(recipe, stage)
    fp = fingerprint(recipe, stage, input_dirs)
    done = read_manifest(out)
    if not fresh and done and done.get("fingerprint") == fp and done.get("complete"):
        log.info("stage %s is up to date (%s); skipping", stage, out)
        print(f"[posttrain] {stage}: up to date, reusing {out}", flush=True)
        return str(out)
    (out / MANIFEST).unlink(missing_ok=True)
    (out / ERROR_FILE).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(f"posttrain.stages.{stage}")
    t0 = time.time()
    try:
        with scoped_env(**({"POSTTRAIN_PARENT_RUN_ID": parent_run_id} if parent_run_id else {})):
            result = module.run(recipe, resolve_inputs(input_dirs), str(out))
    except BaseException as err:  # recorded for the run summary, then re-raised unchanged
        (out / ERROR_FILE).write_text(f"{type(err).__name__}: {err}"[:4000])
        raise
    result.wall_s = result.wall_s or (time.time() - t0)
    manifest = dict(read_manifest(out) or {})
    manifest.update(stage=stage, fingerprint=fp, complete=True, recipe_hash=recipe.hash(),
                    parent_run_id=parent_run_id or os.environ.get("POSTTRAIN_PARENT_RUN_ID", ""),
                    inputs={k: str(v) for k, v in input_dirs.items()}, result=result.to_dict(),
                    finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_json_atomic(out / MANIFEST, manifest)
    return str(out)


def plan_run(recipe_json: str, algorithm: str = "", model_name_or_path: str = "", overrides: list | None = None,
             parent_run_id: str = ""):
    """Apply the run form's fields to a recipe, validate it, open the MLflow parent run if none is given.

    Returns ``(recipe_json, branch, parent_run_id)`` with branch "rl" or "dpo". Raises RecipeError (every
    problem, each naming field, value and fix) before any model is loaded.
    """
    from collections import namedtuple

    from posttrain import tracking
    from posttrain.recipe import RecipeError, RecipeProblem, apply_overrides, validate_recipe

    raw = json.loads(recipe_json)
    if not algorithm:
        raise RecipeError([RecipeProblem("algorithm", algorithm, "the pipeline's branch parameter is required: grpo, rloo, ppo or dpo")], "pipeline parameters")
    raw["algorithm"] = algorithm
    if model_name_or_path:
        raw.setdefault("model", {})["name_or_path"] = model_name_or_path
    recipe = validate_recipe(apply_overrides(raw, [str(o) for o in overrides or []]), "pipeline parameters")
    from posttrain.data.preflight import check_local_data

    bad = check_local_data(recipe)
    if bad:  # fail the run in its first step, before any model is loaded
        raise RecipeError([RecipeProblem(t.partition(": ")[0], None, t.partition(": ")[2]) for t in bad], "pipeline data")
    parent = parent_run_id or os.environ.get(tracking.PARENT_ENV, "")
    if not parent:
        parent = tracking.start_parent_run(recipe.tracking.uri, recipe.tracking.experiment, recipe.name,
                                           tags={"posttrain.recipe_hash": recipe.hash()})
    Plan = namedtuple("Plan", ["recipe_json", "branch", "parent_run_id"])
    return Plan(recipe.to_json(), "dpo" if recipe.algorithm == "dpo" else "rl", parent)


def component_body(stage: str, recipe_json: str, input_dirs: dict[str, str], parent_run_id: str, metrics=None) -> str:
    """What every KFP component runs: execute the stage, log its metrics to the KFP ``Metrics`` artifact."""
    import math

    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(levelname)s %(message)s")
    recipe = Recipe.from_json(recipe_json)
    out = execute(stage, recipe, input_dirs, parent_run_id, fresh=os.environ.get("POSTTRAIN_FRESH") == "1")
    if metrics is not None and out:
        result = (read_manifest(out) or {}).get("result", {})
        for k, v in (result.get("metrics") or {}).items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                metrics.log_metric(k.replace("/", "."), float(v))
    return out
