"""Push a model directory to where it is served: a local path, an HF storage bucket, an HF model repo, or S3.

``push_dir(local_dir, dest_url, source_version)`` is idempotent and resumable, and never half-written:

1. every local file's size and sha256 are computed; the destination is asked what it holds;
2. a file is skipped when the destination holds it with the same content: same sha256 (local), same MD5 ETag
   (single-part S3 objects), same Xet hash (HF buckets), same LFS sha256 / git blob id (HF repos), or same size
   plus the same sha256 recorded by an earlier push in ``posttrain-manifest.partial.json`` or the old manifest;
3. an existing ``posttrain-manifest.json`` that does not describe this push is deleted FIRST, so the destination
   is visibly partial while it changes; each uploaded file is then recorded in the partial manifest;
4. ``posttrain-manifest.json`` (files, sizes, sha256, source version) is written LAST; the partial one is removed.

A reader can always tell: a destination is a complete push iff it has ``posttrain-manifest.json`` (``verify_push``
checks every file against it). HF model repos take everything in one atomic commit (then a ``v<version>`` tag).

Transient errors (connection, timeouts, HTTP 408/429/5xx) are retried with exponential backoff:
``RETRY_BASE_S * 2**k`` seconds, at most ``RETRY_MAX_S``, ``RETRY_ATTEMPTS`` tries. The HF token comes from
``$HF_TOKEN`` or HF's token file (``huggingface_hub.get_token``) and never reaches logs, exceptions or files:
errors are re-raised as ``PosttrainError`` with every known secret replaced by ``***``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from posttrain.errors import PosttrainError
from posttrain.hub_targets import TMP_MARK, FsspecTarget, HfBucketTarget, HfRepoTarget, LocalTarget, Remote, Source, Target

log = logging.getLogger("posttrain.hub")

MANIFEST = "posttrain-manifest.json"
PARTIAL = "posttrain-manifest.partial.json"
FORMAT = "posttrain-push/1"
RETRY_ATTEMPTS = 5
RETRY_BASE_S = 0.5
RETRY_MAX_S = 8.0
_sleep: Callable[[float], None] = time.sleep  # tests replace this to observe the backoff


@dataclass
class PushReport:
    """Outcome of a push: counts of files, bytes uploaded (bytes), wall time (seconds)."""

    destination: str
    files: int
    uploaded: int
    skipped: int
    bytes_uploaded: int
    wall_s: float
    manifest: str
    source: dict = field(default_factory=dict)
    uploaded_paths: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------------- secrets


def _secrets() -> list[str]:
    out = [os.environ.get(k, "") for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
    try:
        from huggingface_hub import get_token

        out.append(get_token() or "")
    except Exception:  # noqa: BLE001 - a broken token file must not break redaction
        pass
    return [s for s in out if len(s) >= 6]


def redact(text: str, extra: list[str] | None = None) -> str:
    """``text`` with every known secret (HF token, AWS secret, URL credentials) replaced by ``***``."""
    from posttrain.tracking import redact_uri

    for s in sorted(set(_secrets() + [e for e in extra or [] if e]), key=len, reverse=True):
        text = text.replace(s, "***")
    text = re.sub(r"hf_[A-Za-z0-9]{20,}", "hf_***", text)
    return redact_uri(text) if "://" in text else text


def hf_token() -> str:
    """The HF token (``$HF_TOKEN`` or the token file). Raises PosttrainError when there is none."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise PosttrainError("an hf:// destination needs a Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return token


def make_hf_api(token: str):
    """The ``HfApi`` client used for hf:// destinations (tests replace this with a stand-in)."""
    from huggingface_hub import HfApi

    return HfApi(token=token)


# --------------------------------------------------------------------------------------------------- targets


def open_target(dest_url: str, storage_options: dict | None = None) -> Target:
    """The Target for a destination URL (see ``posttrain.hub_targets``). Raises PosttrainError on a bad URL."""
    if dest_url.startswith("hf://"):
        rest = dest_url[len("hf://"):].strip("/")
        api = make_hf_api(hf_token())
        if rest.startswith("buckets/"):
            parts = rest[len("buckets/"):].split("/", 2)
            if len(parts) < 2 or not all(parts[:2]):
                raise PosttrainError(f"destination {dest_url!r}: write hf://buckets/<namespace>/<bucket>[/<prefix>]")
            return HfBucketTarget(f"{parts[0]}/{parts[1]}", parts[2] if len(parts) > 2 else "", api)
        parts = rest.split("/")
        if len(parts) != 2 or not all(parts):
            raise PosttrainError(f"destination {dest_url!r}: write hf://<namespace>/<repo> for a model repo or "
                                 "hf://buckets/<namespace>/<bucket>/<prefix> for a bucket")
        return HfRepoTarget(rest, api)
    if dest_url.startswith("file://"):
        return LocalTarget(dest_url[len("file://"):])
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", dest_url):
        return FsspecTarget(dest_url, storage_options)
    return LocalTarget(dest_url)


# --------------------------------------------------------------------------------------------------- retries


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: connection errors, timeouts, HTTP 408/425/429/5xx; not missing files or denied access."""
    if isinstance(exc, (PosttrainError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return status in (408, 425, 429) or status >= 500
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


def with_retries(fn: Callable, what: str, attempts: int = RETRY_ATTEMPTS):
    """Call ``fn()``; on a transient error wait ``RETRY_BASE_S * 2**k`` s (capped at ``RETRY_MAX_S``) and retry.

    Raises PosttrainError (secrets redacted) after ``attempts`` tries or on the first non-transient error.
    """
    for k in range(attempts):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised redacted
            if isinstance(exc, PosttrainError):
                raise
            last = k == attempts - 1 or not is_transient(exc)
            msg = redact(f"{type(exc).__name__}: {exc}")
            if last:
                raise PosttrainError(f"{what} failed after {k + 1} attempt(s): {msg}") from None
            delay = min(RETRY_BASE_S * 2 ** k, RETRY_MAX_S)
            log.warning("%s: %s; retrying in %.1f s (%d/%d)", what, msg, delay, k + 1, attempts)
            _sleep(delay)


# --------------------------------------------------------------------------------------------------- push


def collect_sources(local_dir: str | Path, extra_files: dict[str, bytes] | None = None) -> list[Source]:
    """Every file under ``local_dir`` (sorted, our manifests and temp files excluded) plus ``extra_files``."""
    import hashlib

    from posttrain.artifacts import sha256_file

    root = Path(local_dir)
    if not root.is_dir():
        raise PosttrainError(f"push source {str(root)!r} is not a directory; give a saved model directory")
    extra = dict(extra_files or {})
    out = []
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        rel = p.relative_to(root).as_posix()
        if rel in (MANIFEST, PARTIAL) or TMP_MARK in p.name or rel in extra:
            continue
        out.append(Source(rel=rel, size=p.stat().st_size, sha256=sha256_file(p), path=p))
    for rel, data in sorted(extra.items()):
        out.append(Source(rel=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest(), data=data))
    if not out:
        raise PosttrainError(f"push source {str(root)!r} is empty; nothing to push")
    return out


def _read_json(target: Target, rel: str) -> dict | None:
    raw = with_retries(lambda: target.read_bytes(rel), f"read {rel}")
    try:
        return json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return None


def _recorded(manifest: dict | None) -> dict[str, dict]:
    files = (manifest or {}).get("files") or {}
    if isinstance(files, list):
        return {f["path"]: f for f in files if isinstance(f, dict) and "path" in f}
    return dict(files) if isinstance(files, dict) else {}


def _unchanged(target: Target, src: Source, remote: Remote | None, recorded: dict[str, dict]) -> bool:
    if remote is None or remote.size != src.size:
        return False
    verdict = target.matches(src, remote)
    if verdict is not None:
        return verdict
    rec = recorded.get(src.rel) or {}
    return rec.get("sha256") == src.sha256 and int(rec.get("size", -1)) == src.size


def _manifest(sources: list[Source], source_version: dict, complete: bool) -> dict:
    files = [{"path": s.rel, "size": s.size, "sha256": s.sha256} for s in sources]
    return {"format": FORMAT, "complete": complete, "source": source_version, "files": files,
            "total_bytes": sum(s.size for s in sources), "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _put_json(target: Target, rel: str, obj: dict) -> None:
    data = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
    src = Source(rel=rel, size=len(data), sha256="", data=data)
    with_retries(lambda: target.upload(src), f"write {rel}")


def push_dir(local_dir: str | Path, dest_url: str, source_version: dict, *, extra_files: dict[str, bytes] | None = None,
             storage_options: dict | None = None, tag: str | None = None) -> PushReport:
    """Push every file of ``local_dir`` (plus ``extra_files``, e.g. the model card) to ``dest_url``.

    ``source_version`` (name, version, run id, ...) goes into the manifest. ``tag`` names the git tag for HF model
    repos (default ``v<version>``). Returns a PushReport. Raises PosttrainError (secrets redacted) on failure;
    whatever was uploaded stays, and a rerun skips it.
    """
    t0 = time.time()
    target = open_target(dest_url, storage_options)
    sources = collect_sources(local_dir, extra_files)
    with_retries(target.setup, f"prepare {target.display}")
    remote = with_retries(lambda: target.existing([s.rel for s in sources]), f"list {target.display}")
    old = _read_json(target, MANIFEST) if not target.commit_mode else None
    partial = _read_json(target, PARTIAL) if not target.commit_mode else None
    recorded = {**_recorded(old), **_recorded(partial)}
    todo = [s for s in sources if not _unchanged(target, s, remote.get(s.rel), recorded)]
    final = _manifest(sources, source_version, complete=True)
    if target.commit_mode:
        _commit(target, todo, final, source_version, tag)
    else:
        _push_files(target, todo, sources, final, old, recorded, source_version)
    report = PushReport(destination=target.display, files=len(sources), uploaded=len(todo),
                        skipped=len(sources) - len(todo), bytes_uploaded=sum(s.size for s in todo),
                        wall_s=time.time() - t0, manifest=MANIFEST, source=dict(source_version),
                        uploaded_paths=[s.rel for s in todo])
    log.info("pushed %s -> %s: %d uploaded, %d unchanged, %.1f MiB in %.1f s", local_dir, target.display,
             report.uploaded, report.skipped, report.bytes_uploaded / 2**20, report.wall_s)
    return report


def _same_push(old: dict | None, final: dict) -> bool:
    return bool(old) and old.get("files") == final["files"] and old.get("source") == final["source"]


def _push_files(target: Target, todo: list[Source], sources: list[Source], final: dict, old: dict | None,
                recorded: dict[str, dict], source_version: dict) -> None:
    from tqdm.auto import tqdm

    if not todo and _same_push(old, final):
        return  # already complete and identical
    if old is not None:
        with_retries(lambda: target.delete(MANIFEST), f"remove old {MANIFEST}")  # visibly partial from here on
    done = {s.rel: {"size": s.size, "sha256": s.sha256} for s in sources if s not in todo}
    done.update({k: v for k, v in recorded.items() if k not in done})
    bar = tqdm(total=sum(s.size for s in todo), unit="B", unit_scale=True, desc=f"push {target.display}", leave=False)
    with bar:
        for src in todo:
            with_retries(lambda src=src: target.upload(src), f"upload {src.rel} to {target.display}")
            done[src.rel] = {"size": src.size, "sha256": src.sha256}
            _put_json(target, PARTIAL, {"format": FORMAT, "complete": False, "source": source_version, "files": done})
            bar.update(src.size)
    _put_json(target, MANIFEST, final)
    with_retries(lambda: target.delete(PARTIAL), f"remove {PARTIAL}")


def _commit(target: Target, todo: list[Source], final: dict, source_version: dict, tag: str | None) -> None:
    data = json.dumps(final, indent=2, sort_keys=True, default=str).encode()
    manifest = Source(rel=MANIFEST, size=len(data), sha256="", data=data)
    version = source_version.get("version")
    message = f"posttrain: {source_version.get('name', 'model')} version {version or '?'}"
    tag = tag or (f"v{version}" if version else None)
    with_retries(lambda: target.commit(todo + [manifest], message, tag), f"commit to {target.display}")


def verify_push(dest_url: str, storage_options: dict | None = None) -> dict:
    """The manifest of a COMPLETE push at ``dest_url``, after checking every file's size (and sha256 when the
    backend gives it). Raises PosttrainError when there is no manifest (a partial push) or a file is off."""
    target = open_target(dest_url, storage_options)
    manifest = _read_json(target, MANIFEST)
    if not manifest:
        raise PosttrainError(f"{target.display}: no {MANIFEST}; this push is partial (rerun it to complete)")
    files = manifest["files"]
    remote = target.existing([f["path"] for f in files])
    bad = [f["path"] for f in files if f["path"] not in remote or remote[f["path"]].size != f["size"]
           or (remote[f["path"]].sha256 not in (None, f["sha256"]))]
    if bad:
        raise PosttrainError(f"{target.display}: files missing or different from {MANIFEST}: {bad}")
    return manifest


# --------------------------------------------------------------------------------------------------- registry


def parse_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``NAME@ALIAS`` -> (name, alias, None); ``NAME/VERSION`` -> (name, None, version). Raises PosttrainError."""
    if "@" in ref:
        name, alias = ref.rsplit("@", 1)
        if name and alias:
            return name, alias, None
    elif "/" in ref:
        name, version = ref.rsplit("/", 1)
        if name and version.isdigit():
            return name, None, version
    raise PosttrainError(f"model reference {ref!r}: write NAME@ALIAS (e.g. tiny-cpu@production) or NAME/VERSION (e.g. tiny-cpu/3)")


def push_registered(ref: str, dest: str, tracking_uri: str | None = None, storage_options: dict | None = None) -> PushReport:
    """Download a registered version's ``model/`` artifacts (``NAME@ALIAS`` or ``NAME/VERSION``), push them to
    ``dest`` with a model card (README.md). Raises PosttrainError for an unknown model, alias or version."""
    import tempfile

    import mlflow

    from posttrain import registry
    from posttrain.model_card import card_for_version
    from posttrain.tracking import redact_uri, resolve_uri

    name, alias, version = parse_ref(ref)
    client = registry.get_client(tracking_uri)
    if alias:
        version = registry.holder(client, name, alias)
        if version is None:
            raise PosttrainError(f"model {name!r} has no {alias!r} alias; see `posttrain models {name}`")
    mv = registry.get_version(client, name, version)
    with tempfile.TemporaryDirectory(prefix="posttrain-pull-") as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=tmp,
                                                    tracking_uri=resolve_uri(tracking_uri))
        card = card_for_version(client, mv)
        source = {"name": name, "version": str(mv.version), "run_id": mv.run_id, "alias": alias,
                  "model_uri": f"models:/{name}/{mv.version}", "tracking_uri": redact_uri(resolve_uri(tracking_uri))}
        report = push_dir(local, dest, source, extra_files={"README.md": card.encode()}, storage_options=storage_options)
    print(f"pushed {name} v{mv.version} to {report.destination}: {report.uploaded} uploaded, {report.skipped} unchanged")
    return report
