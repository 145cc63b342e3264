"""Atomic outputs: all-or-nothing, and readable by others (outputs live on shared storage)."""

from __future__ import annotations

import os
import stat

import pytest

from posttrain.artifacts import atomic_dir, read_manifest, write_json_atomic


def test_json_is_written_whole_with_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "m" / "manifest.json", {"complete": True})
        with atomic_dir(tmp_path / "model") as d:
            (d / "w.bin").write_bytes(b"x")
    finally:
        os.umask(old)
    assert read_manifest(tmp_path / "m") == {"complete": True}
    assert stat.S_IMODE((tmp_path / "m" / "manifest.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o755
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_failed_atomic_dir_keeps_the_previous_output(tmp_path):
    final = tmp_path / "model"
    with atomic_dir(final) as d:
        (d / "v1").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as d:
            (d / "v2").write_text("2")
            raise RuntimeError("killed mid-stage")
    assert sorted(p.name for p in final.iterdir()) == ["v1"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_unreadable_manifest_counts_as_absent(tmp_path):
    (tmp_path / "manifest.json").write_text('{"complete": tr')
    assert read_manifest(tmp_path) is None
