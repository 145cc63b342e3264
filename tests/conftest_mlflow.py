"""Session fixture: a real ``mlflow server`` on loopback (sqlite backend, artifacts proxied into a temp dir).

Imported by ``tests/conftest.py`` so every test module shares one server per session.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"mlflow server not healthy after {timeout_s}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """URI (``http://127.0.0.1:<port>``) of a real MLflow tracking + registry server for this test session."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    mlflow_bin = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
    cmd = [mlflow_bin, "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    log = root / "server.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(uri, proc, log)
        yield uri
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the server and its workers (uvicorn, job consumer): its own process group, started for it above."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
