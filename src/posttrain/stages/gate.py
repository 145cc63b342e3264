"""Stage ``gate``: move ``candidate`` -> ``staging`` only when the evaluation clears the recipe's bar.

Inputs: ``registration`` (the register step directory, with ``registration.json``) and ``evaluation`` (the
evaluate step directory, with ``metrics.json``; when absent, the metrics recorded on the version are used).

Checks (``posttrain.registry.decide_gate``): every ``gate.thresholds`` metric (``final/gsm8k_accuracy`` or the
short ``gsm8k_accuracy``) is present and >= its minimum, and no more than ``gate.max_regression`` below the
current staging and production holders. The decision and reason are recorded on the version's tags
(``posttrain.gate.*``) and in ``<out_dir>/gate.json``; when blocked and ``gate.fail_on_block``, StageError.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from posttrain.artifacts import write_json_atomic
from posttrain.errors import StageError
from posttrain.stages import StageResult

GATE_FILE = "gate.json"


def read_registration(path: str | None) -> dict:
    """``registration.json`` of a register step (``path`` is the step directory or the file itself)."""
    if not path:
        raise StageError("input 'registration' is missing; pass the register step directory (with registration.json)")
    p = Path(path)
    f = p / "registration.json" if p.is_dir() else p
    if not f.is_file():
        raise StageError(f"no registration.json at {str(p)!r}; run the register stage first")
    reg = json.loads(f.read_text())
    if not reg.get("name") or not reg.get("version"):
        raise StageError(f"{str(f)!r} lacks 'name'/'version' (got keys {sorted(reg)}); rerun the register stage")
    return reg


def run(recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """Decide and record the gate for the registered version; move staging to it when it passes."""
    from posttrain import registry, tracking
    from posttrain.stages._common import write_manifest
    from posttrain.stages.register import read_metrics

    t0 = time.time()
    reg = read_registration(inputs.get("registration"))
    name, version = reg["name"], str(reg["version"])
    spec = recipe.gate
    with tracking.stage_run(recipe.tracking.uri, recipe.tracking.experiment, "gate",
                            params={"registered_model": name, "version": version,
                                    "thresholds": json.dumps(spec.thresholds, sort_keys=True),
                                    "max_regression": spec.max_regression}) as run_id:
        client = registry.get_client(recipe.tracking.uri)
        if inputs.get("evaluation"):
            metrics = read_metrics(inputs["evaluation"])
        else:
            metrics = registry.version_metrics(registry.get_version(client, name, version).tags)
        if not spec.enabled:
            decision = registry.GateDecision(passed=False, checks=["gate disabled in the recipe (gate.enabled=false); "
                                                                   "promote by hand with `posttrain promote`"])
            verdict = "skipped"
        else:
            decision = registry.run_gate(client, name, version, metrics, spec.thresholds, spec.max_regression)
            verdict = "passed" if decision.passed else "blocked"
        tracking.log_metrics({"gate/passed": float(decision.passed)})
    reason = decision.reason if spec.enabled else decision.checks[0]
    result = {"name": name, "version": version, "decision": verdict, "passed": decision.passed, "reason": reason,
              "checks": decision.checks, "failures": decision.failures}
    write_json_atomic(Path(out_dir) / GATE_FILE, result)
    notes = [f"gate {verdict} for {name} v{version}: {reason}"]
    out = {"gate/passed": float(decision.passed)}
    write_manifest(out_dir, "gate", recipe, {k: v for k, v in inputs.items() if k in ("registration", "evaluation")},
                   out, {"gate": str(Path(out_dir) / GATE_FILE)}, time.time() - t0, run_id, notes)
    if verdict == "blocked" and spec.fail_on_block:
        raise StageError(f"gate blocked {name} v{version} (gate.fail_on_block=true): {reason}")
    return StageResult("gate", metrics=out, artifacts={"gate": str(Path(out_dir) / GATE_FILE)},
                       wall_s=time.time() - t0, mlflow_run_id=run_id, notes=notes)
