"""MLflow runs for pipeline runs and stages.

One parent run per pipeline run, one nested run per stage. Stages run in separate processes (KFP local
subprocesses, Airflow tasks, pods), so the parent run id travels in ``POSTTRAIN_PARENT_RUN_ID`` (or as an
explicit argument) and each stage starts its own run with ``parent_run_id``.

Secrets: tracking URIs can carry credentials (``https://user:pass@host``); ``redact_uri`` strips them before
anything is printed or logged.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator, Mapping

PARENT_ENV = "POSTTRAIN_PARENT_RUN_ID"
TRACKING_ENV = "MLFLOW_TRACKING_URI"
DEFAULT_URI = "sqlite:///mlflow.db"


def redact_uri(uri: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://***@host``; other URIs unchanged."""
    return re.sub(r"(://)[^/@]+@", r"\1***@", uri or "")


def resolve_uri(uri: str | None = None) -> str:
    """The tracking URI to use: explicit, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db."""
    return uri or os.environ.get(TRACKING_ENV) or DEFAULT_URI


def setup(uri: str | None, experiment: str | None = None) -> str:
    """Point mlflow at ``uri`` (and create/select ``experiment``). Returns the URI used."""
    import mlflow

    uri = resolve_uri(uri)
    mlflow.set_tracking_uri(uri)
    if experiment:
        mlflow.set_experiment(experiment)
    return uri


def start_parent_run(uri: str | None, experiment: str, run_name: str, tags: Mapping[str, str] | None = None) -> str:
    """Create the pipeline's parent run (left open for stages to nest under) and return its id."""
    import mlflow

    setup(uri, experiment)
    client = mlflow.MlflowClient()
    exp = mlflow.get_experiment_by_name(experiment)
    run = client.create_run(exp.experiment_id, run_name=run_name, tags=dict(tags or {}))
    return run.info.run_id


def end_parent_run(run_id: str, status: str = "FINISHED") -> None:
    """Close the parent run with ``status`` (FINISHED | FAILED | KILLED)."""
    import mlflow

    mlflow.MlflowClient().set_terminated(run_id, status=status)


@contextlib.contextmanager
def stage_run(uri: str | None, experiment: str, stage: str, parent_run_id: str | None = None,
              params: Mapping[str, object] | None = None) -> Iterator[str]:
    """Context manager: a nested MLflow run for one stage; yields its run id.

    ``parent_run_id`` defaults to $POSTTRAIN_PARENT_RUN_ID; without either the run is top-level. The run is
    marked FAILED if the body raises.
    """
    import mlflow

    setup(uri, experiment)
    parent = parent_run_id or os.environ.get(PARENT_ENV) or None
    if parent and not _run_exists(parent):
        import logging

        logging.getLogger("posttrain").warning("MLflow parent run %s is not on %s; logging stage %s as a top-level run",
                                               parent, redact_uri(resolve_uri(uri)), stage)
        parent = None
    # A stage may run in a process that already has an active run (tests, notebooks): never nest under it.
    while mlflow.active_run() is not None:
        mlflow.end_run()
    with mlflow.start_run(run_name=stage, parent_run_id=parent, nested=parent is not None,
                          tags={"posttrain.stage": stage}) as run:
        if params:
            mlflow.log_params({k: _short(v) for k, v in params.items()})
        yield run.info.run_id


def _run_exists(run_id: str) -> bool:
    import mlflow

    try:
        mlflow.MlflowClient().get_run(run_id)
        return True
    except mlflow.exceptions.MlflowException:
        return False


def _short(v: object) -> str:
    s = str(v)
    return s if len(s) <= 500 else s[:497] + "..."


def log_metrics(metrics: Mapping[str, float], step: int | None = None, run_id: str | None = None) -> None:
    """Log finite numeric metrics to the active run (or ``run_id``); non-numbers are skipped."""
    import math

    import mlflow

    clean = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            clean[re.sub(r"[^A-Za-z0-9_./ -]", "_", k)] = f
    if not clean:
        return
    if run_id:
        mlflow.MlflowClient().log_batch(run_id, metrics=[mlflow.entities.Metric(k, v, _now_ms(), step or 0) for k, v in clean.items()])
    else:
        mlflow.log_metrics(clean, step=step)


def log_text(text: str, artifact_file: str) -> None:
    """Log a text artifact (e.g. a data validation report) to the active run."""
    import mlflow

    mlflow.log_text(text, artifact_file)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
