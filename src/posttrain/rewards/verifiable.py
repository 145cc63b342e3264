"""Verifiable rewards for GSM8K-style answers: correctness against the gold number, and a format reward.

A GSM8K solution ends with a line ``#### <number>`` (OpenAI grade-school-math, Cobbe et al. 2021). The final
answer is the number after the last ``####`` (thousands separators removed); a completion without ``####``
falls back to the last number in its text. Answers are compared numerically (``72.0 == 72``); strings that are
not plain numbers (``\\frac{3}{2}``, ``3/2``) go through math-verify (HuggingFace), and any math-verify failure
counts as wrong (0.0), never as an exception.
"""

from __future__ import annotations

import logging
import math
import re
import threading

log = logging.getLogger("posttrain")

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?|-?\$?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_FORMAT_RE = re.compile(r"####\s*(?:" + _NUMBER + r")\s*\Z")
_CALC_RE = re.compile(r"<<[^>]*>>")
_NUMBER_FULL_RE = re.compile(_NUMBER)
_FRACTION_RE = re.compile(r"-?\d+\s*/\s*\d+")
_LATEX_HINT_RE = re.compile(r"\\(?:frac|dfrac|boxed|sqrt)")

#: Component names; they match the recipe's ``rl.rewards`` weights.
COMPONENTS = ("correctness", "format", "reward_model")


def strip_calculator(text: str) -> str:
    """Remove GSM8K calculator annotations: ``"48/2 = <<48/2=24>>24"`` -> ``"48/2 = 24"``."""
    return _CALC_RE.sub("", text)


def normalize_number(text: str) -> str:
    """``"$1,234."`` -> ``"1234"``: drops ``$``, thousands separators and a trailing period."""
    return text.strip().replace(",", "").replace("$", "").rstrip(".")


def extract_answer(text: str) -> str | None:
    """The final answer of a completion or a GSM8K gold solution, as a string, or None.

    After the last ``####`` (first line only): a plain number (commas and ``$`` removed, ``-`` and decimals
    kept); a fraction ``a/b`` or LaTeX (``\\frac{3}{2}``) as written, for math-verify; else the first number on
    the line; else the line's text. Without ``####``: the last number in the text (calculator annotations
    ignored). ``"... #### 1,234"`` -> ``"1234"``; ``"so -3.5 left"`` -> ``"-3.5"``; ``"#### 3/2"`` -> ``"3/2"``.
    """
    if not text:
        return None
    text = strip_calculator(text)
    if "####" in text:
        head, tail = text.rsplit("####", 1)
        line = tail.strip().splitlines()[0].strip() if tail.strip() else ""
        if _NUMBER_FULL_RE.fullmatch(line.rstrip(".")):
            return normalize_number(line)
        if _FRACTION_RE.fullmatch(line.rstrip(".")) or "\\" in line:
            return line.rstrip(".")
        m = _NUMBER_RE.search(line)
        if m:
            return normalize_number(m.group(0))
        if line:
            return line
        text = head
    found = _NUMBER_RE.findall(text)
    return normalize_number(found[-1]) if found else None


def _to_float(s: str) -> float | None:
    try:
        v = float(normalize_number(s))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _math_verify_equal(gold: str, pred: str) -> bool:
    """math-verify equality; False on any failure. Timeouts use signal.alarm, so only in the main thread."""
    try:
        from math_verify import parse, verify

        main = threading.current_thread() is threading.main_thread()
        t = 5 if main else None
        g = parse(gold, parsing_timeout=t)
        p = parse(pred, parsing_timeout=t)
        if not g or not p:
            return False
        return bool(verify(g, p, timeout_seconds=t))
    except Exception as exc:  # noqa: BLE001 - a grader failure must never stop training
        log.debug("math-verify failed on gold=%r pred=%r: %s", gold, pred, exc)
        return False


def gsm8k_correct(completion: str, gold: str) -> float:
    """1.0 when the completion's final answer equals ``gold`` (e.g. ``"1234"``, ``"-3.5"``), else 0.0.

    Numeric compare (``math.isclose``, abs tol 1e-6) when both are plain numbers; otherwise math-verify on the
    extracted answer (or on the whole completion when it has no ``####`` but LaTeX such as ``\\frac``/``\\boxed``).
    Never raises on bad completions.
    """
    gold_s = normalize_number(str(gold))
    pred = extract_answer(completion)
    g, p = _to_float(gold_s), (_to_float(pred) if pred is not None else None)
    if g is not None and p is not None:
        if math.isclose(g, p, rel_tol=1e-9, abs_tol=1e-6):
            return 1.0
        # a plain number was found, but the completion may state its answer in LaTeX without '####'
        if "####" in completion or not _LATEX_HINT_RE.search(completion):
            return 0.0
        pred = None
    target = pred if pred is not None else completion
    if not target:
        return 0.0
    return 1.0 if _math_verify_equal(gold_s, target) else 0.0


def format_reward(completion: str) -> float:
    """1.0 when the completion ends with ``#### <number>`` (trailing whitespace allowed), else 0.0.

    ``<number>``: optional ``-`` and ``$``, digits with optional thousands commas, optional decimals.
    """
    return 1.0 if _FORMAT_RE.search(completion or "") else 0.0


def combined_reward(completion: str, gold: str, weights: dict[str, float],
                    reward_model_score: float | None = None) -> dict[str, float]:
    """Per-component rewards and their weighted sum ``"total"``.

    ``weights`` maps component names (``correctness``, ``format``, ``reward_model``; the recipe's
    ``rl.rewards``) to weights. Components are unweighted values in the result; ``total = sum(w_k * r_k)``.
    ``reward_model`` needs ``reward_model_score`` (a ``RewardModelScorer`` output) when its weight is non-zero.
    Raises ValueError on an unknown component name or a missing reward-model score.
    """
    unknown = sorted(set(weights) - set(COMPONENTS))
    if unknown:
        raise ValueError(f"rl.rewards: unknown reward component(s) {unknown}; known: {list(COMPONENTS)}")
    out = {"correctness": gsm8k_correct(completion, gold), "format": format_reward(completion)}
    if weights.get("reward_model", 0.0):
        if reward_model_score is None:
            raise ValueError("rl.rewards.reward_model > 0 needs a reward-model score; pass reward_model_score "
                             "(from RewardModelScorer.score) or set the weight to 0")
        out["reward_model"] = float(reward_model_score)
    elif reward_model_score is not None:
        out["reward_model"] = float(reward_model_score)
    out["total"] = float(sum(weights.get(k, 0.0) * v for k, v in out.items()))
    return out
