"""Datasets: formats (gsm8k, hh_rlhf, dolly, prompt_completion, preference), sources (jsonl[.gz], HF ids),
loaders for SFT / preference / prompt rows, and the per-dataset validation report."""

from posttrain.data.formats import COLUMNS, PARSERS, Example, check_columns, split_hh
from posttrain.data.loaders import load_preference, load_prompts, load_sft, split_holdout
from posttrain.data.report import DataReport, token_stats
from posttrain.data.sources import RawRows, read_rows

__all__ = ["COLUMNS", "PARSERS", "DataReport", "Example", "RawRows", "check_columns", "load_preference",
           "load_prompts", "load_sft", "read_rows", "split_holdout", "split_hh", "token_stats"]
