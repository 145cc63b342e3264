"""Push destinations behind one small interface (used by ``posttrain.hub``; one class per storage).

A destination URL picks the target:

- a local path (or ``file://``): ``LocalTarget`` (each file written to a temp name, then renamed);
- ``s3://bucket/prefix`` (and any other fsspec protocol): ``FsspecTarget`` through fsspec/s3fs, which also reaches
  the Hub's S3-compatible bucket gateway; the endpoint comes from ``storage_options["endpoint_url"]``,
  ``$AWS_ENDPOINT_URL_S3`` or ``$AWS_ENDPOINT_URL``;
- ``hf://buckets/<namespace>/<bucket>/<prefix>``: ``HfBucketTarget`` (huggingface_hub >= 1.5 bucket API:
  ``create_bucket(exist_ok=True)``, ``get_bucket_paths_info``, ``batch_bucket_files``, ``download_bucket_files``);
- ``hf://<namespace>/<repo>``: ``HfRepoTarget``, a model repo: one atomic commit (``upload_folder``) holding the
  changed files, the model card and the manifest, then the version as a git tag.

Every target reports what it already holds (``existing``) with whatever content hash the backend gives (sha256
for local files, the MD5 ETag of single-part S3 objects, the Xet hash of bucket files, the LFS sha256 or git blob
sha1 of repo files) so ``posttrain.hub`` can skip unchanged files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import PosttrainError

TMP_MARK = ".posttrain-tmp-"


@dataclass
class Source:
    """One file to push: ``rel`` (POSIX path under the destination), a local ``path`` or in-memory ``data``."""

    rel: str
    size: int
    sha256: str
    path: Path | None = None
    data: bytes | None = None

    def read(self) -> bytes:
        return self.data if self.data is not None else Path(self.path).read_bytes()

    def md5(self) -> str:
        h = hashlib.md5(usedforsecurity=False)
        if self.data is not None:
            h.update(self.data)
        else:
            with open(self.path, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        return h.hexdigest()

    def git_sha1(self) -> str:
        """Git blob id (sha1 of ``"blob <size>\\0" + bytes``), what the Hub reports for non-LFS repo files."""
        h = hashlib.sha1(f"blob {self.size}\0".encode(), usedforsecurity=False)
        h.update(self.read())
        return h.hexdigest()


@dataclass
class Remote:
    """What a destination holds at one path: size in bytes and the backend's content hash, if it gives one."""

    size: int
    sha256: str | None = None
    etag: str | None = None
    xet_hash: str | None = None
    git_sha1: str | None = None


class Target:
    """Base destination. ``commit_mode`` targets receive everything in one ``commit`` call instead of per file."""

    commit_mode = False
    display = ""

    def setup(self) -> None:
        """Create the bucket / repo / directory if needed."""

    def existing(self, rels: list[str]) -> dict[str, Remote]:
        raise NotImplementedError

    def matches(self, src: Source, remote: Remote) -> bool | None:
        """True/False when the backend's hash decides whether ``remote`` holds ``src``; None when it cannot."""
        if remote.sha256:
            return remote.sha256 == src.sha256
        return None

    def upload(self, src: Source) -> None:
        raise NotImplementedError

    def read_bytes(self, rel: str) -> bytes | None:
        raise NotImplementedError

    def delete(self, rel: str) -> None:
        raise NotImplementedError

    def commit(self, sources: list[Source], message: str, tag: str | None) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------- local


class LocalTarget(Target):
    """A directory on this machine; every write goes to a temp name in the same directory, then ``os.replace``."""

    def __init__(self, root: str):
        self.root = Path(root).expanduser().resolve()
        self.display = str(self.root)

    def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.rglob(f"*{TMP_MARK}*"):  # leftovers of a killed copy
            with contextlib.suppress(OSError):
                stale.unlink()

    def existing(self, rels: list[str]) -> dict[str, Remote]:
        from posttrain.artifacts import sha256_file

        out = {}
        for rel in rels:
            p = self.root / rel
            if p.is_file():
                out[rel] = Remote(size=p.stat().st_size, sha256=sha256_file(p))
        return out

    def _atomic_write(self, rel: str, writer) -> None:
        dest = self.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}{TMP_MARK}{uuid.uuid4().hex[:8]}"
        try:
            writer(tmp)
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def upload(self, src: Source) -> None:
        if src.data is not None:
            self._atomic_write(src.rel, lambda tmp: tmp.write_bytes(src.data))
        else:
            self._atomic_write(src.rel, lambda tmp: shutil.copyfile(src.path, tmp))

    def read_bytes(self, rel: str) -> bytes | None:
        p = self.root / rel
        return p.read_bytes() if p.is_file() else None

    def delete(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / rel).unlink()


# --------------------------------------------------------------------------------------------------- fsspec / s3


class FsspecTarget(Target):
    """Any fsspec URL (``s3://bucket/prefix`` through s3fs). Objects are written whole (one PUT per file)."""

    def __init__(self, url: str, storage_options: dict | None = None):
        import fsspec

        protocol, _, rest = url.partition("://")
        opts = dict(storage_options or {})
        if protocol in ("s3", "s3a"):
            endpoint = opts.pop("endpoint_url", None) or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                opts["endpoint_url"] = endpoint
        self.fs = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
        self.root = rest.rstrip("/")
        from posttrain.tracking import redact_uri

        self.display = redact_uri(f"{protocol}://{self.root}")
        if not self.root:
            raise PosttrainError(f"destination {url!r} names no bucket; use e.g. s3://my-bucket/models/name")

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def setup(self) -> None:
        bucket = self.root.split("/", 1)[0]
        with contextlib.suppress(FileExistsError):
            if not self.fs.exists(bucket):
                self.fs.mkdir(bucket)

    def existing(self, rels: list[str]) -> dict[str, Remote]:
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return {}
        wanted, out = set(rels), {}
        for key, info in found.items():
            rel = key[len(self.root) + 1:] if key.startswith(self.root + "/") else None
            if rel in wanted and info.get("type", "file") == "file":
                etag = str(info.get("ETag") or info.get("etag") or "").strip('"') or None
                out[rel] = Remote(size=int(info.get("size") or 0), etag=etag)
        return out

    def matches(self, src: Source, remote: Remote) -> bool | None:
        if remote.etag and "-" not in remote.etag and len(remote.etag) == 32:  # single-part upload: ETag = MD5
            return remote.etag == src.md5()
        return None

    def upload(self, src: Source) -> None:
        if src.data is not None:
            self.fs.pipe_file(self._key(src.rel), src.data)
        else:
            self.fs.put_file(str(src.path), self._key(src.rel))

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._key(rel))
        except FileNotFoundError:
            return None

    def delete(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._key(rel))


# --------------------------------------------------------------------------------------------------- hub


def xet_hash(src: Source) -> str | None:
    """The Xet content hash of a local file (what the Hub reports for bucket files); None without ``hf_xet``."""
    try:
        import hf_xet
    except ImportError:
        return None
    if src.path is None:
        with tempfile.NamedTemporaryFile() as f:
            f.write(src.data)
            f.flush()
            return hf_xet.hash_files([f.name])[0].hash
    return hf_xet.hash_files([str(src.path)])[0].hash


class HfBucketTarget(Target):
    """``hf://buckets/<namespace>/<bucket>/<prefix>`` through ``HfApi`` (one ``batch_bucket_files`` add per file)."""

    def __init__(self, bucket_id: str, prefix: str, api, private: bool = True):
        self.api, self.bucket_id, self.prefix, self.private = api, bucket_id, prefix.strip("/"), private
        self.display = f"hf://buckets/{bucket_id}" + (f"/{self.prefix}" if self.prefix else "")

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def setup(self) -> None:
        self.api.create_bucket(self.bucket_id, private=self.private, exist_ok=True)

    def existing(self, rels: list[str]) -> dict[str, Remote]:
        keys = {self._key(r): r for r in rels}
        infos = self.api.get_bucket_paths_info(self.bucket_id, list(keys))
        return {keys[f.path]: Remote(size=int(f.size), xet_hash=f.xet_hash) for f in infos if f.path in keys}

    def matches(self, src: Source, remote: Remote) -> bool | None:
        local = xet_hash(src) if remote.xet_hash else None
        return None if local is None else local == remote.xet_hash

    def upload(self, src: Source) -> None:
        payload = src.data if src.data is not None else str(src.path)
        self.api.batch_bucket_files(self.bucket_id, add=[(payload, self._key(src.rel))])

    def read_bytes(self, rel: str) -> bytes | None:
        with tempfile.TemporaryDirectory() as tmp:
            dest = Path(tmp) / "file"
            self.api.download_bucket_files(self.bucket_id, [(self._key(rel), str(dest))], raise_on_missing_files=False)
            return dest.read_bytes() if dest.is_file() else None

    def delete(self, rel: str) -> None:
        self.api.batch_bucket_files(self.bucket_id, delete=[self._key(rel)])


class HfRepoTarget(Target):
    """``hf://<namespace>/<repo>``: a model repo, pushed as ONE commit (``upload_folder``) and tagged."""

    commit_mode = True

    def __init__(self, repo_id: str, api, private: bool = True):
        self.api, self.repo_id, self.private = api, repo_id, private
        self.display = f"hf://{repo_id}"

    def setup(self) -> None:
        self.api.create_repo(self.repo_id, repo_type="model", private=self.private, exist_ok=True)

    def existing(self, rels: list[str]) -> dict[str, Remote]:
        out = {}
        for f in self.api.get_paths_info(self.repo_id, rels, repo_type="model"):
            if getattr(f, "size", None) is None:
                continue  # a folder
            lfs = getattr(f, "lfs", None)
            sha = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
            out[f.path] = Remote(size=int(f.size), sha256=sha, git_sha1=None if lfs else getattr(f, "blob_id", None))
        return out

    def matches(self, src: Source, remote: Remote) -> bool | None:
        if remote.sha256:
            return remote.sha256 == src.sha256
        if remote.git_sha1:
            return remote.git_sha1 == src.git_sha1()
        return None

    def read_bytes(self, rel: str) -> bytes | None:
        return None  # a repo commit is atomic: there is never a partial push to resume from

    def commit(self, sources: list[Source], message: str, tag: str | None) -> None:
        with tempfile.TemporaryDirectory(prefix="posttrain-push-") as staging:
            for src in sources:
                dest = Path(staging) / src.rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                if src.data is not None:
                    dest.write_bytes(src.data)
                else:
                    try:
                        os.link(src.path, dest)
                    except OSError:
                        shutil.copyfile(src.path, dest)
            self.api.upload_folder(repo_id=self.repo_id, folder_path=staging, repo_type="model", commit_message=message)
        if tag:
            self.api.create_tag(self.repo_id, tag=tag, tag_message=message, repo_type="model", exist_ok=True)
