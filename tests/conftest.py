"""Shared pytest fixtures. Keep each fixture small and documented; add yours in its own section."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# ----------------------------------------------------------------------------------------------- data (data-models)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``/work/shared/data``: real GSM8K, HH-RLHF, Dolly, the stories260K model and the GPT-2 tokenizer."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; these tests need the real files")
    return SHARED_DATA


@pytest.fixture(scope="session")
def stories260k(shared_data) -> str:
    """Path of the real tiny Llama model (HF format, vocab 512, no pad token, no chat template)."""
    return str(shared_data / "stories260K" / "hf")


# ----------------------------------------------------------------------------------------------- mlflow server (registry)

from conftest_mlflow import mlflow_server  # noqa: E402,F401  (session fixture: a real `mlflow server` on loopback)
