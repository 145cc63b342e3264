"""The one-screen summary at the end of a run: stage, wall time, key metric, artifact, MLflow run id."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posttrain.artifacts import read_manifest

# The metric a reader looks at first, per stage: a name, or (before, after, label) shown as "label a -> b".
KEY_METRICS: dict[str, tuple] = {
    "base": ("gsm8k_accuracy",),
    "sft": (("heldout_loss_before", "heldout_loss_after", "held-out loss"),),
    "reward": (("pairwise_accuracy_before", "pairwise_accuracy", "pairwise acc"), "pairwise_accuracy"),
    "dpo": ("reward_accuracy", "dpo_reward_accuracy", "margin"),
    "rl": (("reward_first_fifth", "reward_last_fifth", "reward"), "reward_final"),
    "evaluate": (("base/gsm8k_accuracy", "final/gsm8k_accuracy", "GSM8K acc"), "final/gsm8k_accuracy"),
    "register": ("register/version",),
    "gate": ("gate/passed",),
    "push": ("push/files",),
}


@dataclass
class StageRow:
    stage: str
    status: str  # ran | reused | failed | not run
    wall_s: float = 0.0
    metric: str = ""
    artifact: str = ""
    run_id: str = ""


@dataclass
class Summary:
    ok: bool
    rows: list[StageRow] = field(default_factory=list)
    parent_run_id: str = ""
    error: str = ""
    notes: list[str] = field(default_factory=list)


def _key_metric(stage: str, metrics: dict) -> str:
    for name in KEY_METRICS.get(stage, ()):
        if isinstance(name, tuple):
            before, after, label = name
            if before in metrics and after in metrics:
                return f"{label} {_fmt(metrics[before])} -> {_fmt(metrics[after])}"
        elif name in metrics:
            return f"{name}={_fmt(metrics[name])}"
    if metrics:
        k = sorted(metrics)[0]
        return f"{k}={_fmt(metrics[k])}"
    return ""


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def stage_notes(stage_dirs: dict[str, Path], stages: tuple[str, ...] = ("gate", "push")) -> list[str]:
    """The notes of the decision stages (why the gate passed or blocked, where the push went)."""
    out = []
    for stage in stages:
        m = read_manifest(stage_dirs[stage]) if stage_dirs.get(stage) else None
        out += [f"{stage}: {n}" for n in ((m or {}).get("result", {}).get("notes") or [])]
    return out


def collect(stage_dirs: dict[str, Path], parent_run_id: str, failed: str | None = None) -> list[StageRow]:
    """One row per stage from its manifest; a manifest written under another parent run means 'reused'."""
    rows = []
    for stage, d in stage_dirs.items():
        m = read_manifest(d) if d else None
        if not m or not m.get("complete"):
            rows.append(StageRow(stage, "failed" if stage == failed else "not run"))
            continue
        res = m.get("result", {})
        status = "ran" if parent_run_id and m.get("parent_run_id") == parent_run_id else "reused"
        arts = res.get("artifacts", {})
        art = arts.get("model") or next(iter(arts.values()), str(d))
        rows.append(StageRow(stage, status, float(res.get("wall_s") or 0.0), _key_metric(stage, res.get("metrics", {})),
                             art, res.get("mlflow_run_id") or ""))
    return rows


def render(summary: Summary, tracking_uri: str) -> None:
    """Print the summary table with rich, then the command that opens the MLflow UI."""
    from rich.console import Console
    from rich.table import Table

    from posttrain.tracking import redact_uri

    con = Console()
    if not con.is_terminal:
        con = Console(width=150)
    t = Table(title="posttrain run summary" + ("" if summary.ok else " (FAILED)"))
    for col in ("stage", "status", "wall s", "key metric", "artifact", "MLflow run"):
        t.add_column(col, overflow="fold")
    style = {"ran": "green", "reused": "cyan", "failed": "bold red", "not run": "dim"}
    for r in summary.rows:
        t.add_row(r.stage, f"[{style[r.status]}]{r.status}[/]", f"{r.wall_s:.1f}" if r.wall_s else "",
                  r.metric, _short_path(r.artifact), r.run_id[:12])
    con.print(t)
    for note in summary.notes:
        con.print(note)
    if summary.error:
        con.print(f"[bold red]error:[/] {summary.error}")
    con.print(f"MLflow parent run: {summary.parent_run_id}   tracking: {redact_uri(tracking_uri)}")
    con.print("Registry stages:  .venv/bin/posttrain models" + (f" --tracking-uri {redact_uri(tracking_uri)}" if not tracking_uri.startswith("sqlite:") else ""))
    if tracking_uri.startswith("sqlite:") or "://" not in tracking_uri:
        con.print(f"Open the MLflow UI:  .venv/bin/mlflow ui --backend-store-uri {tracking_uri}  (then http://127.0.0.1:5000)")
    else:
        con.print(f"Open the MLflow UI:  {redact_uri(tracking_uri)}")


def _short_path(p: str) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path.cwd()))
    except ValueError:
        return p
