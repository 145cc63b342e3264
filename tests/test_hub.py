"""Push: idempotent, resumable, never half-written; local paths, real S3 protocol (moto server), HF test doubles.

The model pushed is the real stories260K directory (7 files, ~1 MiB) from ``../shared/data``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import socket
from pathlib import Path

import pytest

from posttrain import hub, hub_targets
from posttrain.artifacts import sha256_file
from posttrain.errors import PosttrainError
from posttrain.hub_targets import FsspecTarget, LocalTarget

SOURCE = {"name": "tiny", "version": "3", "run_id": "abc123"}
FAKE_TOKEN = "hf_FAKEtoken0123456789abcdefghijKLMNOP"


class Killed(BaseException):
    """Simulates the process being killed mid-push (not an Exception: no retry catches it)."""


def _counting(monkeypatch, cls, kill_after: int | None = None, real=None) -> list[str]:
    """Wrap ``cls.upload`` to record model-file uploads (not our manifests) and die after ``kill_after`` of them."""
    calls: list[str] = []
    real = real or cls.upload

    def upload(self, src):
        if src.rel.startswith("posttrain-manifest"):
            return real(self, src)
        if kill_after is not None and len(calls) >= kill_after:
            raise Killed(f"killed before {src.rel}")
        real(self, src)
        calls.append(src.rel)

    monkeypatch.setattr(cls, upload.__name__, upload)
    return calls


@pytest.fixture()
def model_dir(stories260k, tmp_path) -> Path:
    """A private copy of stories260K (a test may change a file in it)."""
    return Path(shutil.copytree(stories260k, tmp_path / "model"))


def _interrupt_and_resume(monkeypatch, cls, model_dir: Path, dest: str) -> tuple[list[str], list[str]]:
    original = cls.upload
    first = _counting(monkeypatch, cls, kill_after=3)
    with pytest.raises(Killed):
        hub.push_dir(model_dir, dest, SOURCE, extra_files={"README.md": b"# card\n"})
    with pytest.raises(PosttrainError, match="partial"):
        hub.verify_push(dest)  # no manifest: visibly partial
    second = _counting(monkeypatch, cls, real=original)
    report = hub.push_dir(model_dir, dest, SOURCE, extra_files={"README.md": b"# card\n"})
    assert len(first) == 3 and report.uploaded == 8 - 3 == len(second) and report.skipped == 3
    assert not set(first) & set(second), "a file already pushed was uploaded again"
    manifest = hub.verify_push(dest)
    assert manifest["source"] == SOURCE and manifest["complete"] is True
    expected = {p.name: sha256_file(p) for p in model_dir.iterdir()}
    expected["README.md"] = hashlib.sha256(b"# card\n").hexdigest()
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == expected
    third = hub.push_dir(model_dir, dest, SOURCE, extra_files={"README.md": b"# card\n"})
    assert third.uploaded == 0 and third.skipped == 8
    return first, second


def test_local_push_killed_midway_resumes_without_reuploading(monkeypatch, model_dir, tmp_path):
    dest = tmp_path / "dest"
    _interrupt_and_resume(monkeypatch, LocalTarget, model_dir, str(dest))
    for p in model_dir.iterdir():
        assert sha256_file(dest / p.name) == sha256_file(p)
    assert not list(dest.rglob(f"*{hub_targets.TMP_MARK}*")) and not (dest / hub.PARTIAL).exists()


def test_changed_file_is_the_only_upload_and_old_manifest_goes_first(monkeypatch, model_dir, tmp_path):
    dest = tmp_path / "dest"
    hub.push_dir(model_dir, str(dest), SOURCE)
    (model_dir / "config.json").write_text('{"changed": true}')
    seen_manifest_during_upload = []
    calls = _counting(monkeypatch, LocalTarget)
    real = LocalTarget.upload
    monkeypatch.setattr(LocalTarget, "upload", lambda self, src: (seen_manifest_during_upload.append(
        (dest / hub.MANIFEST).exists()) if src.rel == "config.json" else None, real(self, src))[1])
    report = hub.push_dir(model_dir, str(dest), {**SOURCE, "version": "4"})
    assert report.uploaded_paths == ["config.json"] and calls == ["config.json"]
    assert seen_manifest_during_upload == [False]  # the stale complete manifest was removed before changing files
    assert hub.verify_push(str(dest))["source"]["version"] == "4"


def test_copy_killed_inside_a_file_leaves_no_partial_file(monkeypatch, model_dir, tmp_path):
    dest = tmp_path / "dest"

    def half_copy(src, dst):
        Path(dst).write_bytes(Path(src).read_bytes()[:100])
        raise Killed("killed mid-file")

    monkeypatch.setattr(hub_targets.shutil, "copyfile", half_copy)
    with pytest.raises(Killed):
        hub.push_dir(model_dir, str(dest), SOURCE)
    assert [p.name for p in dest.iterdir()] == []  # the temp file was removed, nothing under a final name


def test_transient_errors_back_off_exponentially_then_permanent_errors_fail_fast(monkeypatch, model_dir, tmp_path):
    delays: list[float] = []
    monkeypatch.setattr(hub, "_sleep", delays.append)
    fails = {"n": 2}
    real = LocalTarget.upload

    def flaky(self, src):
        if src.rel == "config.json" and fails["n"]:
            fails["n"] -= 1
            raise ConnectionError("connection reset")
        real(self, src)

    monkeypatch.setattr(LocalTarget, "upload", flaky)
    hub.push_dir(model_dir, str(tmp_path / "a"), SOURCE)
    assert delays == [hub.RETRY_BASE_S, 2 * hub.RETRY_BASE_S]
    delays.clear()
    monkeypatch.setattr(LocalTarget, "upload", lambda self, src: (_ for _ in ()).throw(PermissionError("denied")))
    with pytest.raises(PosttrainError, match="failed after 1 attempt"):
        hub.push_dir(model_dir, str(tmp_path / "b"), SOURCE)
    assert delays == []
    assert hub.with_retries.__defaults__ == (hub.RETRY_ATTEMPTS,)
    monkeypatch.setattr(LocalTarget, "upload", lambda self, src: (_ for _ in ()).throw(TimeoutError("slow")))
    with pytest.raises(PosttrainError, match=f"failed after {hub.RETRY_ATTEMPTS} attempt"):
        hub.push_dir(model_dir, str(tmp_path / "c"), SOURCE)
    assert delays == [min(hub.RETRY_BASE_S * 2 ** k, hub.RETRY_MAX_S) for k in range(hub.RETRY_ATTEMPTS - 1)]


# ----------------------------------------------------------------------------------------------- S3 (moto server)


@pytest.fixture()
def s3_endpoint(monkeypatch):
    """A real S3-protocol server on loopback (moto in server mode); credentials are dummies."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}"
    server.stop()


def test_s3_push_killed_midway_resumes(monkeypatch, model_dir, s3_endpoint):
    dest = "s3://models/tiny/v3"
    first, second = _interrupt_and_resume(monkeypatch, FsspecTarget, model_dir, dest)
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint)
    for p in model_dir.iterdir():
        assert hashlib.sha256(fs.cat_file(f"models/tiny/v3/{p.name}")).hexdigest() == sha256_file(p)
    assert not fs.exists(f"models/tiny/v3/{hub.PARTIAL}")
    etag = fs.info("models/tiny/v3/config.json")["ETag"].strip('"')
    assert etag == hashlib.md5((model_dir / "config.json").read_bytes()).hexdigest()  # what the skip compares


# ----------------------------------------------------------------------------------------------- HF (test doubles)


class FakeHfApi:
    """Test double of ``huggingface_hub.HfApi`` at its public API boundary (no Hub is reachable here and bucket
    uploads need Xet storage). It records every call; bucket files carry real Xet hashes (``hf_xet.hash_files``),
    repo files carry sha256 in ``lfs`` like the Hub's LFS files."""

    def __init__(self, token: str, fail_with: Exception | None = None):
        self.token, self.fail_with = token, fail_with
        self.calls: list[tuple] = []
        self.files: dict[str, bytes] = {}
        self.repo_files: dict[str, bytes] = {}

    def create_bucket(self, bucket_id, *, private=None, exist_ok=False):
        self.calls.append(("create_bucket", bucket_id, private, exist_ok))

    def get_bucket_paths_info(self, bucket_id, paths):
        import tempfile
        from types import SimpleNamespace

        import hf_xet

        self.calls.append(("get_bucket_paths_info", bucket_id, sorted(paths)))
        out = []
        for p in paths:
            if p in self.files:
                with tempfile.NamedTemporaryFile() as f:
                    f.write(self.files[p])
                    f.flush()
                    out.append(SimpleNamespace(path=p, size=len(self.files[p]), xet_hash=hf_xet.hash_files([f.name])[0].hash))
        return out

    def batch_bucket_files(self, bucket_id, *, add=None, delete=None):
        if self.fail_with is not None:
            raise self.fail_with
        for src, dest in add or []:
            self.calls.append(("add", bucket_id, dest))
            self.files[dest] = src if isinstance(src, bytes) else Path(src).read_bytes()
        for dest in delete or []:
            self.calls.append(("delete", bucket_id, dest))
            self.files.pop(dest, None)

    def download_bucket_files(self, bucket_id, files, *, raise_on_missing_files=False):
        for remote, local in files:
            if remote in self.files:
                Path(local).write_bytes(self.files[remote])

    def create_repo(self, repo_id, *, repo_type=None, private=None, exist_ok=False):
        self.calls.append(("create_repo", repo_id, repo_type, private, exist_ok))

    def get_paths_info(self, repo_id, paths, *, repo_type=None):
        from types import SimpleNamespace

        return [SimpleNamespace(path=p, size=len(self.repo_files[p]), blob_id=None,
                                lfs={"sha256": hashlib.sha256(self.repo_files[p]).hexdigest()})
                for p in paths if p in self.repo_files]

    def upload_folder(self, *, repo_id, folder_path, repo_type=None, commit_message=None):
        names = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
        self.calls.append(("upload_folder", repo_id, repo_type, commit_message, names))
        for n in names:
            self.repo_files[n] = (Path(folder_path) / n).read_bytes()

    def create_tag(self, repo_id, *, tag, tag_message=None, repo_type=None, exist_ok=False):
        self.calls.append(("create_tag", repo_id, tag, repo_type, exist_ok))


@pytest.fixture()
def fake_hf(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    apis: list[FakeHfApi] = []

    def make(token):
        assert token == FAKE_TOKEN  # the real client gets the token from the environment
        api = FakeHfApi(token)
        if apis:
            api.files, api.repo_files = apis[0].files, apis[0].repo_files  # same remote state across pushes
        apis.append(api)
        return api

    monkeypatch.setattr(hub, "make_hf_api", make)
    return apis


def test_hf_bucket_push_calls_and_skips_unchanged(fake_hf, model_dir):
    """Against the FakeHfApi double (see its docstring): exact bucket id, paths, and no re-upload of unchanged files."""
    dest = "hf://buckets/my-org/models/tiny"
    hub.push_dir(model_dir, dest, SOURCE)
    api = fake_hf[0]
    names = sorted(p.name for p in model_dir.iterdir())
    assert api.calls[0] == ("create_bucket", "my-org/models", True, True)
    adds = [c[2] for c in api.calls if c[0] == "add"]
    assert sorted(a for a in adds if "posttrain-manifest" not in a) == [f"tiny/{n}" for n in names]
    assert adds[-1] == "tiny/posttrain-manifest.json"  # written last
    assert ("delete", "my-org/models", "tiny/posttrain-manifest.partial.json") in api.calls
    (model_dir / "config.json").write_text('{"changed": 1}')
    report = hub.push_dir(model_dir, dest, {**SOURCE, "version": "4"})
    api2 = fake_hf[1]
    assert report.uploaded_paths == ["config.json"]
    assert [c[2] for c in api2.calls if c[0] == "add"] == [
        "tiny/config.json", "tiny/posttrain-manifest.partial.json", "tiny/posttrain-manifest.json"]
    assert api2.calls.index(("delete", "my-org/models", "tiny/posttrain-manifest.json")) < api2.calls.index(
        ("add", "my-org/models", "tiny/config.json"))  # old manifest removed before any file changes
    assert json.loads(api2.files["tiny/posttrain-manifest.json"])["source"]["version"] == "4"


def test_hf_repo_push_is_one_commit_with_card_manifest_and_tag(fake_hf, model_dir):
    """Against the FakeHfApi double: create_repo, one upload_folder commit (only changed files + manifest), tag."""
    dest = "hf://my-org/tiny-model"
    hub.push_dir(model_dir, dest, SOURCE, extra_files={"README.md": b"# tiny\n"})
    api = fake_hf[0]
    names = sorted([p.name for p in model_dir.iterdir()] + ["README.md", hub.MANIFEST])
    assert api.calls == [("create_repo", "my-org/tiny-model", "model", True, True),
                         ("upload_folder", "my-org/tiny-model", "model", "posttrain: tiny version 3", names),
                         ("create_tag", "my-org/tiny-model", "v3", "model", True)]
    report = hub.push_dir(model_dir, dest, {**SOURCE, "version": "4"}, extra_files={"README.md": b"# tiny v4\n"})
    assert report.uploaded_paths == ["README.md"]
    assert fake_hf[1].calls[1][4] == ["README.md", hub.MANIFEST]


def test_token_never_appears_in_logs_output_errors_or_files(fake_hf, monkeypatch, model_dir, tmp_path, caplog, capsys):
    import httpx2  # huggingface_hub 2.x's HTTP client
    from huggingface_hub.errors import HfHubHTTPError

    monkeypatch.setattr(hub, "_sleep", lambda s: None)
    caplog.set_level(logging.DEBUG)
    err = HfHubHTTPError(f"503 Server Error for Authorization: Bearer {FAKE_TOKEN}", response=httpx2.Response(
        503, request=httpx2.Request("POST", "https://huggingface.co/api/buckets/my-org/models/batch")))
    make = hub.make_hf_api
    monkeypatch.setattr(hub, "make_hf_api", lambda token: (lambda a: (setattr(a, "fail_with", err), a)[1])(make(token)))
    with pytest.raises(PosttrainError) as exc_info:
        hub.push_dir(model_dir, "hf://buckets/my-org/models/tiny", SOURCE)
    monkeypatch.setattr(hub, "make_hf_api", make)
    hub.push_dir(model_dir, "hf://buckets/my-org/models/tiny", SOURCE)  # and a successful one
    out = capsys.readouterr()
    text = "\n".join([str(exc_info.value), repr(exc_info.value), caplog.text, out.out, out.err])
    assert "***" in str(exc_info.value) and "503" in str(exc_info.value)
    assert "retrying" in caplog.text  # the transient error was logged (redacted) and retried
    written = b"".join(fake_hf[-1].files.values()) + b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert FAKE_TOKEN not in text and FAKE_TOKEN.encode() not in written
    assert exc_info.value.__cause__ is None and exc_info.value.__suppress_context__


def test_bad_destinations_and_refs_are_clear_errors(monkeypatch, model_dir):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(model_dir.parent / "no-hf-home"))
    with pytest.raises(PosttrainError, match="needs a Hugging Face token"):
        hub.push_dir(model_dir, "hf://my-org/repo", SOURCE)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    with pytest.raises(PosttrainError, match="hf://<namespace>/<repo>"):
        hub.push_dir(model_dir, "hf://just-a-name", SOURCE)
    with pytest.raises(PosttrainError, match="NAME@ALIAS"):
        hub.parse_ref("tiny")
    assert hub.parse_ref("tiny@production") == ("tiny", "production", None)
    assert hub.parse_ref("tiny/3") == ("tiny", None, "3")


def test_model_card_metrics_lineage_and_licences():
    from posttrain.model_card import license_for, render_card

    card = render_card("tiny", "3", {"final/gsm8k_accuracy": 0.25, "base/gsm8k_accuracy": 0.05},
                       {"recipe_name": "tiny-cpu", "recipe_hash": "abc", "mlflow_run_id": "r1", "pipeline_run_id": "p1",
                        "git_commit": "deadbeef", "base_model": "../shared/data/stories260K/hf"},
                       {"name": "tiny-cpu", "seed": 0, "tracking": {"uri": "https://bob:s3cret@mlflow.example"}},
                       {"../shared/data/dolly_open_qa/x.jsonl": "f00", "acme/data": "hf:acme"})
    assert "| gsm8k_accuracy | 0.05 | 0.25 | +0.2 |" in card
    assert "| git commit | `deadbeef` |" in card and "| pipeline run | `p1` |" in card
    assert "| databricks-dolly-15k | `../shared/data/dolly_open_qa/x.jsonl` | `f00` | CC BY-SA 3.0 |" in card
    assert "| acme/data | `acme/data` | `hf:acme` | see source |" in card
    assert "stories260K (llama2.c tinyllamas)" in card and "name: tiny-cpu" in card
    assert "s3cret" not in card and "https://***@mlflow.example" in card
    assert license_for("Anthropic/hh-rlhf") == ("Anthropic HH-RLHF", "MIT")
    assert license_for("openai/gsm8k")[1] == "MIT"
