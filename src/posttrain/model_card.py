"""Model card (README.md) for a pushed model: metrics (base vs this version), lineage, recipe, data and licences.

``render_card`` is pure (dicts in, Markdown out); ``card_for_version`` gathers its inputs from a registered MLflow
model version (its tags and the ``recipe.json`` its register run logged).
"""

from __future__ import annotations

import json
from typing import Mapping

# Known sources, matched as substrings of a data path or HF id (lower case) -> (name, licence).
LICENSES: tuple[tuple[str, str, str], ...] = (
    ("gsm8k", "GSM8K (OpenAI)", "MIT"),
    ("hh_rlhf", "Anthropic HH-RLHF", "MIT"),
    ("hh-rlhf", "Anthropic HH-RLHF", "MIT"),
    ("dolly", "databricks-dolly-15k", "CC BY-SA 3.0"),
    ("stories260k", "stories260K (llama2.c tinyllamas)", "MIT"),
)
UNKNOWN_LICENSE = "see source"


def license_for(source: str) -> tuple[str, str]:
    """(dataset name, licence) for a data path or HF id; unknown sources give (source, "see source")."""
    low = source.lower()
    for key, name, lic in LICENSES:
        if key in low:
            return name, lic
    return source, UNKNOWN_LICENSE


def _metric_rows(metrics: Mapping[str, float], base_metrics: Mapping[str, float] | None) -> list[str]:
    """Rows ``| metric | base | this version | change |``; ``final/x`` pairs with ``base/x`` (or base_metrics[x])."""
    base_metrics = dict(base_metrics or {})
    names = sorted({k.removeprefix("final/") for k in metrics if k.startswith("final/")}) or sorted(
        k for k in metrics if not k.startswith("base/"))
    rows = []
    for n in names:
        mine = metrics.get(f"final/{n}", metrics.get(n))
        base = metrics.get(f"base/{n}", base_metrics.get(n))
        delta = f"{mine - base:+.4g}" if mine is not None and base is not None else "-"
        fmt = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
        rows.append(f"| {n} | {fmt(base)} | {fmt(mine)} | {delta} |")
    return rows


def _redacted(obj):
    """A copy of ``obj`` with credentials in URL strings (``scheme://user:secret@host``) replaced by ``***``."""
    from posttrain.tracking import redact_uri

    if isinstance(obj, dict):
        return {k: _redacted(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redacted(v) for v in obj]
    return redact_uri(obj) if isinstance(obj, str) and "://" in obj else obj


def render_card(name: str, version: str | None, metrics: Mapping[str, float], lineage: Mapping[str, str | None],
                recipe: Mapping | None = None, data_hashes: Mapping[str, str] | None = None,
                base_metrics: Mapping[str, float] | None = None) -> str:
    """The README.md text. ``lineage`` keys: recipe_name, recipe_hash, mlflow_run_id, pipeline_run_id, git_commit,
    base_model, algorithm (missing ones print as "-"). ``recipe`` is the recipe as a dict (printed as YAML)."""
    import yaml

    recipe = _redacted(dict(recipe or {}))
    base_model = lineage.get("base_model") or (recipe.get("model") or {}).get("name_or_path") or "-"
    lines = ["---", "library_name: transformers", "tags: [posttrain]", "---", "",
             f"# {name}" + (f" (version {version})" if version else ""), "",
             f"Post-trained from `{base_model}` with posttrain ({lineage.get('algorithm') or recipe.get('algorithm') or '-'}).", "",
             "## Evaluation", "", "| metric | base | this version | change |", "|---|---|---|---|"]
    lines += _metric_rows(metrics, base_metrics) or ["| (no metrics recorded) | - | - | - |"]
    lines += ["", "## Lineage", "", "| what | value |", "|---|---|"]
    for key, label in (("recipe_name", "recipe"), ("recipe_hash", "recipe hash"), ("mlflow_run_id", "MLflow run"),
                       ("pipeline_run_id", "pipeline run"), ("git_commit", "git commit")):
        lines.append(f"| {label} | `{lineage.get(key) or '-'}` |")
    lines += ["", "## Data", "", "| dataset | source | sha256 | licence |", "|---|---|---|---|"]
    sources = dict(data_hashes or {})
    if base_model != "-" and base_model not in sources:
        sources.setdefault(base_model, "-")
    for src, sha in sorted(sources.items()):
        ds, lic = license_for(src)
        lines.append(f"| {ds} | `{src}` | `{sha}` | {lic} |")
    if recipe:
        lines += ["", "## Recipe", "", "```yaml", yaml.safe_dump(recipe, sort_keys=False).rstrip(), "```"]
    return "\n".join(lines) + "\n"


def card_for_version(client, mv) -> str:
    """Render the card of MLflow model version ``mv`` from its tags and its run's ``recipe.json`` artifact."""
    from posttrain.registry import version_metrics

    tags = dict(mv.tags or {})
    recipe = None
    if mv.run_id:
        try:
            import tempfile
            from pathlib import Path

            with tempfile.TemporaryDirectory() as tmp:
                recipe = json.loads(Path(client.download_artifacts(mv.run_id, "recipe.json", tmp)).read_text())
        except Exception:  # noqa: BLE001 - a version registered elsewhere may lack it; the card says "-"
            recipe = None
    try:
        hashes = json.loads(tags.get("posttrain.data_hashes") or "{}")
    except json.JSONDecodeError:
        hashes = {}
    lineage = {"recipe_name": tags.get("posttrain.recipe_name"), "recipe_hash": tags.get("posttrain.recipe_hash"),
               "mlflow_run_id": mv.run_id, "pipeline_run_id": tags.get("posttrain.pipeline_run_id"),
               "git_commit": tags.get("posttrain.git_commit"), "base_model": tags.get("posttrain.base_model"),
               "algorithm": tags.get("posttrain.algorithm")}
    return render_card(mv.name, str(mv.version), version_metrics(tags), lineage, recipe, hashes)
