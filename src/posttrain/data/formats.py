"""Row schemas and parsers for the five data formats (``DatasetSpec.format``).

| format | columns | parsed into |
|---|---|---|
| gsm8k | question, answer | question; completion = answer without ``<<...>>`` annotations (ends in ``#### N``); gold N |
| dolly | instruction, context (optional), response | question = instruction (+ ``"\\n\\nContext: " + context``); completion = response |
| prompt_completion | prompt, completion | question = prompt; completion; gold = the completion's final answer |
| hh_rlhf | chosen, rejected | dialogue prompt = text up to and including the last ``"\\n\\nAssistant:"``; chosen/rejected = the rest |
| preference | prompt, chosen, rejected | question = prompt; chosen; rejected |

HH-RLHF prompts stay the raw ``"\\n\\nHuman: ...\\n\\nAssistant:"`` dialogue (``Example.dialogue``): it is already a
dialogue format, and re-templating multi-turn text would change what the preference labels were given for. The
other formats' questions are chat-templated by the loaders (``posttrain.models.format_prompt``).

A parser returns ``(Example, None)`` or ``(None, reason)``; the loaders count the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.errors import DataError
from posttrain.rewards.verifiable import extract_answer, normalize_number, strip_calculator

#: Required columns of each format (dolly's ``context`` is optional).
COLUMNS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("question", "answer"),
    "hh_rlhf": ("chosen", "rejected"),
    "dolly": ("instruction", "response"),
    "prompt_completion": ("prompt", "completion"),
    "preference": ("prompt", "chosen", "rejected"),
}
ASSISTANT_MARK = "\n\nAssistant:"


@dataclass
class Example:
    """One parsed row. Exactly one of ``question`` (to be templated) and ``dialogue`` (used raw) is set."""

    question: str | None = None
    dialogue: str | None = None
    completion: str | None = None        # SFT target, or the chosen response
    rejected: str | None = None
    gold: str | None = None              # final numeric answer, e.g. "1234" or "-3.5"


def check_columns(rows: list[dict], fmt: str, where: str, field: str) -> None:
    """Raise DataError when the first row lacks a column of ``fmt``: names the file, the columns expected and
    found, and the ``format`` to use instead when another known format matches the columns found."""
    if fmt not in COLUMNS:
        raise DataError(f"{field}.format={fmt!r}: unknown format; use one of {sorted(COLUMNS)}")
    if not rows:
        return
    found = sorted(rows[0].keys())
    expected = COLUMNS[fmt]
    if set(expected) <= set(found):
        return
    matches = sorted((f for f, cols in COLUMNS.items() if f != fmt and set(cols) <= set(found)),
                     key=lambda f: -len(COLUMNS[f]))
    hint = (f"; these columns match format {matches[0]!r}: set {field}.format={matches[0]}" if matches
            else f"; rename the columns or pick the format that matches ({_formats_table()})")
    raise DataError(f"{where}: format {fmt!r} expects columns {list(expected)} but the rows have {found}{hint}")


def _formats_table() -> str:
    return ", ".join(f"{f}: {list(c)}" for f, c in COLUMNS.items())


def _strings(row: dict, cols: tuple[str, ...]) -> bool:
    return all(isinstance(row.get(c), str) for c in cols)


def parse_gsm8k(row: dict) -> tuple[Example | None, str | None]:
    if not _strings(row, COLUMNS["gsm8k"]):
        return None, "missing_or_non_string_column"
    answer = strip_calculator(row["answer"]).strip()
    if "####" not in answer:
        return None, "no_gold_answer"
    gold = extract_answer(answer)
    if not row["question"].strip() or gold is None:
        return None, "empty_question_or_answer"
    return Example(question=row["question"].strip(), completion=answer, gold=gold), None


def parse_dolly(row: dict) -> tuple[Example | None, str | None]:
    if not _strings(row, COLUMNS["dolly"]) or not isinstance(row.get("context", ""), (str, type(None))):
        return None, "missing_or_non_string_column"
    instruction, response = row["instruction"].strip(), row["response"].strip()
    if not instruction or not response:
        return None, "empty_question_or_answer"
    context = (row.get("context") or "").strip()
    question = f"{instruction}\n\nContext: {context}" if context else instruction
    return Example(question=question, completion=response), None


def parse_prompt_completion(row: dict) -> tuple[Example | None, str | None]:
    if not _strings(row, COLUMNS["prompt_completion"]):
        return None, "missing_or_non_string_column"
    prompt, completion = row["prompt"].strip(), row["completion"].strip()
    if not prompt or not completion:
        return None, "empty_question_or_answer"
    gold = extract_answer(completion)
    return Example(question=prompt, completion=completion,
                   gold=gold if gold is not None else normalize_number(completion)), None


def split_hh(text: str) -> tuple[str, str] | None:
    """``(prompt, response)`` split at the last ``"\\n\\nAssistant:"`` (kept in the prompt), or None."""
    i = text.rfind(ASSISTANT_MARK)
    if i < 0:
        return None
    cut = i + len(ASSISTANT_MARK)
    return text[:cut], text[cut:]


def parse_hh_rlhf(row: dict) -> tuple[Example | None, str | None]:
    if not _strings(row, COLUMNS["hh_rlhf"]):
        return None, "missing_or_non_string_column"
    c, r = split_hh(row["chosen"]), split_hh(row["rejected"])
    if c is None or r is None:
        return None, "no_assistant_turn"
    if c[0] != r[0]:
        return None, "prompt_mismatch"
    return _pair(Example(dialogue=c[0], completion=c[1], rejected=r[1]))


def parse_preference(row: dict) -> tuple[Example | None, str | None]:
    if not _strings(row, COLUMNS["preference"]):
        return None, "missing_or_non_string_column"
    if not row["prompt"].strip():
        return None, "empty_prompt"
    return _pair(Example(question=row["prompt"].strip(), completion=row["chosen"], rejected=row["rejected"]))


def _pair(ex: Example) -> tuple[Example | None, str | None]:
    if ex.completion == ex.rejected:
        return None, "chosen_equals_rejected"
    if not ex.completion.strip() or not ex.rejected.strip():
        return None, "empty_response"
    return ex, None


PARSERS = {"gsm8k": parse_gsm8k, "dolly": parse_dolly, "prompt_completion": parse_prompt_completion,
           "hh_rlhf": parse_hh_rlhf, "preference": parse_preference}
