"""Failure records: a rank (or one of its threads) that fails writes ``<out>/.ranks/rank<N>[-<where>].json``
with its role, the error and the traceback, the moment it fails, so the launcher can name the first failure
even when torchrun kills the rank before its main thread unwinds.

``root_cause`` orders records: first-hand errors before "connection closed by peer" errors (those are what a
rank sees when *another* rank died), then by time.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

SECONDARY = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def record_failure(out_dir: str, rank: int, role: str, exc: BaseException, where: str = "main") -> None:
    """Write the failure record; never raises (a failure report must not hide the failure)."""
    try:
        d = Path(out_dir) / ".ranks"
        d.mkdir(parents=True, exist_ok=True)
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        info = {"rank": rank, "role": role, "where": where, "time": time.time(),
                "error": f"{type(exc).__name__}: {exc}", "traceback": tb}
        suffix = "" if where == "main" else f"-{where}"
        (d / f"rank{rank}{suffix}.json").write_text(json.dumps(info, indent=2))
    except Exception:  # noqa: BLE001 - best effort
        pass


def read_failures(out_dir: str) -> list[dict]:
    """All records, root cause first (first-hand before secondary, then earliest)."""
    infos = []
    for f in (Path(out_dir) / ".ranks").glob("rank*.json"):
        try:
            infos.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(infos, key=lambda i: (any(s in i["error"] for s in SECONDARY), i.get("time", 0.0)))


def clear_failures(out_dir: str) -> None:
    for f in (Path(out_dir) / ".ranks").glob("rank*.json"):
        f.unlink(missing_ok=True)
