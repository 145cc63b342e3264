"""Load SFT, preference and prompt datasets into plain rows plus a ``DataReport`` each.

Steps for every dataset: read the source -> check its columns against ``format`` -> sample ``max_rows`` (seeded
shuffle, then the first N) -> parse rows (drops counted by reason) -> chat-template the prompts -> measure token
lengths against ``max_seq_len`` -> drop or truncate over-length rows (counted) -> raise if nothing is left.

Templating: a question becomes ``format_prompt(tokenizer, question)``; its completion is what the chat template
renders after that prompt for an assistant turn (``" " + answer`` with the plain template), or ``" " + answer``
when the tokenizer has no template. HH-RLHF dialogues are kept raw (see ``formats``).
"""

from __future__ import annotations

import random
from pathlib import Path

from posttrain.data.formats import PARSERS, Example, check_columns
from posttrain.data.lengths import fit_completion, token_lengths
from posttrain.data.report import DataReport, token_stats
from posttrain.data.sources import RawRows, read_rows
from posttrain.errors import DataError

SFT_FORMATS = ("gsm8k", "dolly", "prompt_completion", "hh_rlhf", "preference")
PREFERENCE_FORMATS = ("hh_rlhf", "preference")
PROMPT_FORMATS = ("gsm8k", "prompt_completion")


def _short_name(source: str) -> str:
    p = Path(source)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def _read_and_parse(spec, seed: int, field: str, allowed: tuple[str, ...]):
    """Rows parsed into Examples; returns (examples, report-with-parse-drops, raw)."""
    if spec.format not in allowed:
        raise DataError(f"{field}.format={spec.format!r}: this role needs one of {list(allowed)}")
    raw: RawRows = read_rows(spec.source, spec.split, spec.subset, field)
    where = f"{field} ({raw.files[0] if len(raw.files) == 1 else spec.source})"
    check_columns(raw.rows, spec.format, where, field)
    rows = raw.rows
    if spec.max_rows is not None and spec.max_rows < len(rows):
        idx = list(range(len(rows)))
        random.Random(seed).shuffle(idx)
        rows = [rows[i] for i in idx[:spec.max_rows]]
    report = DataReport(name=_short_name(spec.source), source=spec.source, rows_read=len(rows), rows_kept=0,
                        sha256=raw.sha256, rows_in_source=len(raw.rows), field=field)
    parse = PARSERS[spec.format]
    examples: list[Example] = []
    for row in rows:
        ex, reason = parse(row)
        if ex is None:
            _count(report, reason)
        else:
            examples.append(ex)
    return examples, report


def _count(report: DataReport, reason: str, n: int = 1) -> None:
    report.dropped[reason] = report.dropped.get(reason, 0) + n


def _template(tokenizer, ex: Example, response: str) -> tuple[str, str]:
    """(prompt, completion) strings for one example and one response."""
    from posttrain.models import format_prompt

    if ex.dialogue is not None:
        return ex.dialogue, response
    prompt = format_prompt(tokenizer, ex.question)
    if getattr(tokenizer, "chat_template", None):
        full = tokenizer.apply_chat_template([{"role": "user", "content": ex.question},
                                              {"role": "assistant", "content": response}], tokenize=False)
        if isinstance(full, str) and full.startswith(prompt) and len(full) > len(prompt):
            return prompt, full[len(prompt):]
    return prompt, " " + response


def _finish(report: DataReport, rows: list[dict], spec_desc: str) -> None:
    report.rows_kept = len(rows)
    if not rows:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(report.dropped.items())) or "the source has no rows"
        raise DataError(f"{report.field} ({spec_desc}): no rows left after filtering ({report.rows_read} read; "
                        f"dropped: {reasons}); check the format and data.overlength / model.max_seq_len")


def _apply_overlength(tokenizer, rows: list[dict], keys: tuple[str, ...], report: DataReport,
                      max_seq_len: int, overlength: str) -> list[dict]:
    """Measure ``prompt + rows[k]`` for each completion key; drop or cut over-length rows (counted)."""
    if overlength not in ("drop", "truncate"):
        raise DataError(f"data.overlength={overlength!r}: use 'drop' or 'truncate'")
    per_key = [token_lengths(tokenizer, [r["prompt"] + r[k] for r in rows]) for k in keys]
    lengths = [max(ls) for ls in zip(*per_key)] if rows else []
    report.token_stats = token_stats(lengths, max_seq_len)
    report.context_len = max_seq_len
    out = []
    for row, n in zip(rows, lengths):
        if n <= max_seq_len:
            out.append(row)
        elif overlength == "drop":
            _count(report, "over_context")
        else:
            n_prompt = len(tokenizer(row["prompt"], verbose=False)["input_ids"])
            cut = {k: fit_completion(tokenizer, row["prompt"], row[k], max_seq_len, n_prompt) for k in keys}
            if any(v is None for v in cut.values()):
                _count(report, "prompt_over_context")
            else:
                out.append({**row, **cut})
                report.truncated += 1
    return out


def load_sft(specs, tokenizer, max_seq_len: int, overlength: str, seed: int,
             field: str = "data.sft") -> tuple[list[dict], list[DataReport]]:
    """SFT rows ``{"prompt": templated str, "completion": str}`` from every spec, concatenated in order given.

    GSM8K completions have their ``<<...>>`` annotations removed and end in ``#### N``. Returns the rows and one
    ``DataReport`` per spec. Raises ``DataError`` (missing file, wrong columns, a dataset empty after filtering).
    """
    all_rows: list[dict] = []
    reports: list[DataReport] = []
    for i, spec in enumerate(specs):
        f = f"{field}[{i}]"
        examples, report = _read_and_parse(spec, seed, f, SFT_FORMATS)
        rows = []
        for ex in examples:
            prompt, completion = _template(tokenizer, ex, ex.completion)
            rows.append({"prompt": prompt, "completion": completion})
        rows = _apply_overlength(tokenizer, rows, ("completion",), report, max_seq_len, overlength)
        _finish(report, rows, spec.source)
        all_rows.extend(rows)
        reports.append(report)
    return all_rows, reports


def load_preference(spec, tokenizer, max_seq_len: int, overlength: str, seed: int,
                    field: str = "data.preference") -> tuple[list[dict], DataReport]:
    """Preference rows ``{"prompt", "chosen", "rejected"}``.

    HH-RLHF: prompt = the raw dialogue up to and including the last ``"\\n\\nAssistant:"``; pairs with
    chosen == rejected, or whose two prompts differ, are dropped and counted. ``preference`` format: the prompt
    is chat-templated. Over-length: a pair is too long when prompt + the longer response is; truncation cuts
    both responses. Raises ``DataError``.
    """
    examples, report = _read_and_parse(spec, seed, field, PREFERENCE_FORMATS)
    rows = []
    for ex in examples:
        prompt, chosen = _template(tokenizer, ex, ex.completion)
        _, rejected = _template(tokenizer, ex, ex.rejected)
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    rows = _apply_overlength(tokenizer, rows, ("chosen", "rejected"), report, max_seq_len, overlength)
    before = len(rows)
    rows = [r for r in rows if r["chosen"] != r["rejected"]]   # truncation can make two responses equal
    if before != len(rows):
        report.truncated -= before - len(rows)
        _count(report, "equal_after_truncation", before - len(rows))
    _finish(report, rows, spec.source)
    return rows, report


def load_prompts(spec, tokenizer, max_seq_len: int, seed: int, field: str = "data.prompts",
                 reserve_tokens: int = 0) -> tuple[list[dict], DataReport]:
    """RL/eval prompts ``{"prompt": templated str, "question": raw str, "answer": gold str}``.

    ``answer`` is the gold final answer (``"1234"``, ``"-3.5"``). Prompts longer than
    ``max_seq_len - reserve_tokens`` tokens (room for the completion) are dropped and counted. Raises ``DataError``.
    """
    from posttrain.models import format_prompt

    examples, report = _read_and_parse(spec, seed, field, PROMPT_FORMATS)
    rows = [{"prompt": format_prompt(tokenizer, ex.question), "question": ex.question, "answer": ex.gold}
            for ex in examples]
    limit = max_seq_len - reserve_tokens
    lengths = token_lengths(tokenizer, [r["prompt"] for r in rows])
    report.token_stats = token_stats(lengths, max_seq_len)
    report.context_len = max_seq_len
    kept = [r for r, n in zip(rows, lengths) if n <= limit]
    if len(kept) != len(rows):
        _count(report, "prompt_over_context", len(rows) - len(kept))
    _finish(report, kept, spec.source)
    return kept, report


def split_holdout(rows: list, fraction: float, seed: int) -> tuple[list, list]:
    """``(train, holdout)``: a seeded random ``fraction`` of rows (at least 1) held out; order kept within each.

    Raises ``DataError`` when fewer than 2 rows or ``fraction`` is not in (0, 1).
    """
    if not 0.0 < fraction < 1.0:
        raise DataError(f"data.eval_fraction={fraction!r}: must be between 0 and 1 (exclusive)")
    if len(rows) < 2:
        raise DataError(f"cannot hold out {fraction:.0%} of {len(rows)} row(s); need at least 2 rows "
                        "(add data or give data.eval_preference / data.eval_prompts)")
    n_hold = min(len(rows) - 1, max(1, round(len(rows) * fraction)))
    idx = list(range(len(rows)))
    random.Random(seed).shuffle(idx)
    hold = set(idx[:n_hold])
    return [r for i, r in enumerate(rows) if i not in hold], [r for i, r in enumerate(rows) if i in hold]
