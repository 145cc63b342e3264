"""Errors that reach the user. Each message names the field or thing, the bad value and the fix."""

from __future__ import annotations


class PosttrainError(RuntimeError):
    """Base class for user-facing errors; the CLI prints the message and exits with ``exit_code``."""

    exit_code = 1


class DataError(PosttrainError, ValueError):
    """Bad input data: missing file, wrong/missing columns, empty after filtering."""

    exit_code = 2


class ModelLoadError(PosttrainError, ValueError):
    """A model or tokenizer that cannot be loaded (no weights, no tokenizer, unknown id)."""

    exit_code = 2


class StageError(PosttrainError):
    """A pipeline stage failed; the message names the stage and what it said."""


class JobError(PosttrainError):
    """A distributed job failed; the message names the rank and what it said."""
