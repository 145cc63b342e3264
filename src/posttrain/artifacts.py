"""Atomic outputs and stage manifests.

Every stage writes into a temporary sibling directory and renames it into place only when it finished, so a
killed stage leaves either the previous complete output or nothing. A ``manifest.json`` inside records the
stage, the recipe hash, the hashes of its inputs and its metrics, so a rerun with the same inputs can skip.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

MANIFEST = "manifest.json"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_tree(path: str | Path) -> str:
    """Hex sha256 over (relative path, file sha256) of every file under ``path`` (or of the file itself)."""
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file() and x.name != MANIFEST):
        h.update(str(f.relative_to(p)).encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file + rename, so readers never see a partial file.

    The file gets the usual permissions (0666 minus the umask), not mkstemp's private 0600: outputs live on
    shared storage and are read by other users and pods.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, obj: object) -> None:
    """Write JSON (indented, sorted keys) to ``path`` atomically; see ``write_text_atomic``."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temp directory next to ``final``; on success replace ``final`` with it, on error delete it.

    Raises whatever the body raises; ``final`` is untouched in that case.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; outputs are shared
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.parent / f".{final.name}.old-{int(time.time() * 1e6)}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def read_manifest(out_dir: str | Path) -> dict | None:
    """The manifest of a complete stage output, or None if absent/unreadable."""
    p = Path(out_dir) / MANIFEST
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
