"""Pre-flight check of local data files, run by ``posttrain validate``/``run`` and the pipeline's ``plan`` step,
so a wrong column, an empty file or a broken line is reported before any model is loaded or trained.

Reads at most ``max_lines`` non-empty lines of each local file (cheap for any size); HF dataset ids are checked
when their stage loads them. Torch-free.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from posttrain.errors import DataError


def _head_rows(path: Path, max_lines: int) -> list[dict]:
    """The first ``max_lines`` rows of a .jsonl/.jsonl.gz (or .json list) file. Raises DataError on bad JSON."""
    opener = gzip.open if path.name.endswith(".gz") else open
    rows: list[dict] = []
    with opener(path, "rt", encoding="utf-8") as f:
        if path.name.endswith(".json"):
            data = json.load(f)
            return list(data[:max_lines]) if isinstance(data, list) else [data]
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path} line {n} is not valid JSON ({exc}); fix or remove that line") from None
            if len(rows) >= max_lines:
                break
    return rows


def check_local_data(recipe, max_lines: int = 20) -> list[str]:
    """Problems with the local data files a recipe names: ``field: message`` strings (empty list = fine)."""
    from posttrain.data.formats import check_columns
    from posttrain.data.sources import _is_local, _local_files

    specs = [(f"data.sft[{i}]", s) for i, s in enumerate(recipe.data.sft)]
    specs += [(f"data.{k}", getattr(recipe.data, k)) for k in ("preference", "prompts", "eval_prompts", "eval_preference")]
    problems = []
    for field, spec in specs:
        if spec is None or not _is_local(spec.source) or not Path(spec.source).expanduser().exists():
            continue  # missing files are reported by recipe.check_paths, hub ids by their stage
        try:
            files = _local_files(spec.source, field)
            rows = _head_rows(files[0], max_lines)
            if not rows:
                raise DataError(f"{files[0]} has no rows; point {field}.source at a file with data")
            check_columns(rows, spec.format, str(files[0]), field)
        except (DataError, OSError, UnicodeDecodeError, EOFError) as exc:
            problems.append(f"{field}: {exc}")
    return problems


def preflight(recipe, source: str = "recipe") -> None:
    """Raise RecipeError listing every missing path and bad local data file (columns, empty, broken JSON)."""
    from posttrain.recipe import RecipeError, RecipeProblem, check_paths

    problems = check_paths(recipe)
    for text in check_local_data(recipe):
        field, _, message = text.partition(": ")
        problems.append(RecipeProblem(f"{field}.source", getattr(_spec(recipe, field), "source", None), message))
    if problems:
        raise RecipeError(problems, source)


def _spec(recipe, field: str):
    """The DatasetSpec at a field path like ``data.sft[1]`` or ``data.prompts``."""
    name = field.removeprefix("data.")
    if name.startswith("sft["):
        return recipe.data.sft[int(name[4:-1])]
    return getattr(recipe.data, name)
