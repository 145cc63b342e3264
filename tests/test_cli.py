"""The CLI: instant help, validate exits non-zero listing every problem, no torch import for validation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_validate_ok_and_does_not_import_torch():
    code = ("import sys; from posttrain.cli import main; rc = main(['validate', 'pipelines/recipes/tiny-cpu.yaml']);"
            "print('TORCH' if 'torch' in sys.modules else 'NO_TORCH'); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "ok (name=tiny-cpu" in p.stdout
    assert "NO_TORCH" in p.stdout


def test_validate_reports_every_problem_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "pipelines/recipes/tiny-cpu.yaml").read_text()
                   + "\nbogus: 1\n")
    p = _run("validate", str(bad), "--set", "rl.max_steps=0", "--set", "algorithm=ppo2")
    assert p.returncode == 2
    for field in ("bogus", "rl.max_steps", "algorithm"):
        assert field in p.stderr
    assert "3 problem(s)" in p.stderr


def test_schema_lists_documented_fields():
    p = _run("validate", "--schema")
    assert p.returncode == 0
    assert "`rl.max_staleness`" in p.stdout and "versions" in p.stdout


def test_help_lists_commands():
    p = _run("--help")
    assert p.returncode == 0
    for cmd in ("validate", "run", "compile", "rl", "promote", "rollback", "push", "models"):
        assert cmd in p.stdout


def test_validate_reads_local_data_columns_before_anything_loads(tmp_path):
    """Wrong columns, an empty file and a broken JSON line are reported by `validate`, each naming its field."""
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"q": "1+1?", "a": "2"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "x", "answer": "#### 1"}\n{"question": \n')
    p = _run("validate", "pipelines/recipes/tiny-cpu.yaml",
             "--set", f"data.sft=[{{source: {wrong}, format: gsm8k}}, {{source: {empty}, format: dolly}}]",
             "--set", f"data.prompts.source={broken}")
    assert p.returncode == 2
    assert "data.sft[0].source" in p.stderr and "expects columns ['question', 'answer']" in p.stderr
    assert "data.sft[1].source" in p.stderr and "has no rows" in p.stderr
    assert "data.prompts.source" in p.stderr and "line 2 is not valid JSON" in p.stderr
