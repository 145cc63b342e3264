"""Read raw rows from a local .jsonl / .jsonl.gz / .json file, a directory of them, or an HF dataset id.

A source is local when it exists or looks like a path (the same rule as ``posttrain.recipe.check_paths``);
anything else is an HF dataset id loaded with ``datasets.load_dataset(source, subset, split=split)``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import DataError

LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json")


@dataclass
class RawRows:
    """Rows of one source. ``files``: the local files read (empty for HF); ``sha256``: of the file bytes
    (a directory: over every file's path and hash), or of ``"<id>|<subset>|<split>"`` for an HF dataset."""

    rows: list[dict]
    source: str
    sha256: str
    files: list[str]


def _is_local(source: str) -> bool:
    from posttrain.recipe import _looks_local

    return _looks_local(source)


def _local_files(source: str, field: str) -> list[Path]:
    p = Path(source).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(LOCAL_SUFFIXES))
        if not files:
            raise DataError(f"{field}.source={source!r}: the directory has no .jsonl/.jsonl.gz/.json files; "
                            "point at a data file or a directory of them")
        return files
    raise DataError(f"{field}.source={source!r}: file not found; fix {field}.source (an existing "
                    ".jsonl/.jsonl.gz path, a directory of them, or an HF dataset id like openai/gsm8k)")


def _read_file(path: Path, field: str) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            if path.name.endswith(".json"):
                data = json.load(f)
                rows = data if isinstance(data, list) else None
                if rows is None:
                    raise DataError(f"{field}.source: {path} is a JSON {type(data).__name__}, not a list of rows; "
                                    "use JSON Lines (.jsonl), one object per line")
                return rows
            rows = []
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{field}.source: {path} line {n} is not valid JSON ({exc}); "
                                        "fix or remove that line") from None
            return rows
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"{field}.source: cannot read {path}: {exc}") from None


def _sha256_files(files: list[Path]) -> str:
    from posttrain.artifacts import sha256_file

    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(str(f).encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def read_rows(source: str, split: str = "train", subset: str | None = None, field: str = "data") -> RawRows:
    """Every row of a source as dicts, in file order (a directory: files in sorted path order).

    ``field`` names the recipe field (e.g. ``data.sft[0]``) for error messages. Raises ``DataError`` for a
    missing file, unreadable file, bad JSON line (with its number) or an HF dataset that cannot be loaded.
    """
    if _is_local(source):
        files = _local_files(source, field)
        rows: list[dict] = []
        for f in files:
            rows.extend(_read_file(f, field))
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        if bad is not None:
            raise DataError(f"{field}.source={source!r}: row {bad} is a {type(rows[bad]).__name__}, not a JSON "
                            "object; every row must be an object of named columns")
        return RawRows(rows, source, _sha256_files(files), [str(f) for f in files])
    return _read_hf(source, split, subset, field)


def _read_hf(source: str, split: str, subset: str | None, field: str) -> RawRows:
    try:
        import datasets

        ds = datasets.load_dataset(source, subset, split=split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types
        raise DataError(f"{field}.source={source!r} (split={split!r}, subset={subset!r}): cannot load this HF "
                        f"dataset: {exc}; check {field}.source/.split/.subset, or give a local .jsonl path") from None
    rows = [dict(r) for r in ds]
    sha = hashlib.sha256(f"{source}|{subset}|{split}".encode()).hexdigest()
    return RawRows(rows, source, sha, [])
