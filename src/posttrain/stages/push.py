"""Stage ``push``: push the registered model with its model card to ``recipe.push.destination``.

Inputs: ``model`` (the saved HF model directory), ``evaluation`` (evaluate step directory, metrics.json),
``registration`` (register step directory, registration.json) and, optionally, ``gate_result`` (gate step
directory, gate.json). A version the gate blocked is not pushed (the stage succeeds with ``push/pushed`` = 0 and
says why); without a gate result the version's ``posttrain.gate.decision`` tag decides.

The destination is ``push.destination`` with ``{name}`` replaced by the recipe name: a local path (relative paths
resolve against the CWD), ``hf://buckets/<ns>/<bucket>/<prefix>``, ``hf://<ns>/<repo>`` or ``s3://bucket/prefix``
(see ``posttrain.hub``). Writes ``<out_dir>/push_report.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from posttrain.artifacts import write_json_atomic
from posttrain.stages import StageResult

REPORT = "push_report.json"


def destination(recipe) -> str:
    """``push.destination`` with ``{name}`` replaced; a relative local path made absolute against the CWD."""
    import re

    dest = recipe.push.destination.replace("{name}", recipe.name)
    if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", dest):
        dest = str(Path(dest).expanduser().resolve())
    return dest


def _gate_decision(inputs: dict[str, str], reg: dict, client) -> str:
    """"passed" | "blocked" | "skipped" | "unknown" for the registered version."""
    from posttrain import registry

    gate_dir = inputs.get("gate_result")
    f = Path(gate_dir) / "gate.json" if gate_dir else None
    if f is not None and f.is_file():
        return json.loads(f.read_text()).get("decision", "unknown")
    tags = registry.get_version(client, reg["name"], reg["version"]).tags
    return tags.get(registry.TAG_GATE_DECISION, "unknown")


def _card(recipe, reg: dict, metrics: dict[str, float]) -> str:
    from posttrain.model_card import render_card

    tags = reg.get("tags") or {}
    lineage = {"recipe_name": recipe.name, "recipe_hash": recipe.hash(), "mlflow_run_id": reg.get("run_id"),
               "pipeline_run_id": tags.get("posttrain.pipeline_run_id"), "git_commit": tags.get("posttrain.git_commit"),
               "base_model": recipe.model.name_or_path, "algorithm": recipe.algorithm}
    hashes = json.loads(tags.get("posttrain.data_hashes") or "{}")
    return render_card(reg["name"], str(reg["version"]), metrics, lineage, recipe.model_dump(mode="json"), hashes)


def run(recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """Push ``inputs["model"]`` + README.md to the destination unless the gate blocked the version.

    Raises StageError/ModelLoadError for missing inputs, PosttrainError (secrets redacted) when the push fails.
    """
    from posttrain import hub, registry, tracking
    from posttrain.stages._common import require_model_input, write_manifest
    from posttrain.stages.gate import read_registration
    from posttrain.stages.register import read_metrics

    t0 = time.time()
    model_dir = require_model_input(inputs, "model", "push")
    reg = read_registration(inputs.get("registration"))
    metrics = read_metrics(inputs.get("evaluation"))
    dest = destination(recipe)
    with tracking.stage_run(recipe.tracking.uri, recipe.tracking.experiment, "push",
                            params={"registered_model": reg["name"], "version": reg["version"],
                                    "destination": hub.redact(dest)}) as run_id:
        client = registry.get_client(recipe.tracking.uri)
        decision = _gate_decision(inputs, reg, client)
        if not recipe.push.enabled or decision == "blocked":
            why = "push.enabled=false" if not recipe.push.enabled else f"the gate blocked version {reg['version']}"
            report, notes = None, [f"not pushed: {why}"]
            out = {"push/pushed": 0.0}
        else:
            source = {"name": reg["name"], "version": str(reg["version"]), "run_id": reg.get("run_id"),
                      "model_uri": reg.get("model_uri"), "recipe_hash": recipe.hash(), "gate": decision}
            report = hub.push_dir(model_dir, dest, source, extra_files={"README.md": _card(recipe, reg, metrics).encode()})
            client.set_model_version_tag(reg["name"], str(reg["version"]), "posttrain.push.destination", report.destination)
            out = {"push/pushed": 1.0, "push/files": float(report.files), "push/uploaded": float(report.uploaded),
                   "push/skipped": float(report.skipped), "push/bytes_uploaded": float(report.bytes_uploaded),
                   "push/wall_s": report.wall_s}
            notes = [f"pushed {reg['name']} v{reg['version']} to {report.destination}: {report.uploaded} uploaded, "
                     f"{report.skipped} unchanged"]
        tracking.log_metrics(out)
    write_json_atomic(Path(out_dir) / REPORT, {"report": report.to_dict() if report else None, "notes": notes,
                                                "gate": decision})
    write_manifest(out_dir, "push", recipe, {k: v for k, v in inputs.items() if k in ("registration", "evaluation")},
                   out, {"push_report": str(Path(out_dir) / REPORT)}, time.time() - t0, run_id, notes)
    return StageResult("push", metrics=out, artifacts={"push_report": str(Path(out_dir) / REPORT)},
                       wall_s=time.time() - t0, mlflow_run_id=run_id, notes=notes)
