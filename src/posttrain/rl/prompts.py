"""Prompt rows for the actors: load once, tokenise, cycle through in a seeded order."""

from __future__ import annotations

import random


def load_prompt_rows(recipe, tokenizer) -> tuple[list[dict], dict]:
    """Rows ``{"prompt", "answer", "ids"}`` whose prompt fits ``model.max_seq_len - rl.max_new_tokens`` tokens.

    Returns ``(rows, report)`` with ``report = {"loaded", "kept", "too_long"}``. Raises ``DataError`` (from
    ``posttrain.data.load_prompts``) or when no prompt is short enough.
    """
    from posttrain.data import load_prompts
    from posttrain.errors import DataError

    limit = recipe.model.max_seq_len - recipe.rl.max_new_tokens
    rows, _ = load_prompts(recipe.data.prompts, tokenizer, recipe.model.max_seq_len, recipe.seed,
                           reserve_tokens=recipe.rl.max_new_tokens)
    out = []
    for r in rows:
        ids = tokenizer(r["prompt"])["input_ids"]
        if len(ids) <= limit:
            out.append({"prompt": r["prompt"], "answer": r.get("answer", ""), "ids": ids})
    if not out:
        raise DataError(f"data.prompts: none of {len(rows)} prompts fits model.max_seq_len - rl.max_new_tokens = "
                        f"{limit} tokens; raise model.max_seq_len or lower rl.max_new_tokens")
    return out, {"loaded": len(rows), "kept": len(out), "too_long": len(rows) - len(out)}


class PromptCycler:
    """Endless seeded shuffle over ``rows`` (reshuffled each epoch). ``take(k)`` returns k rows."""

    def __init__(self, rows: list, seed: int):
        self.rows, self.rng, self.order, self.pos = rows, random.Random(seed), [], 0

    def take(self, k: int) -> list:
        out = []
        while len(out) < k:
            if self.pos >= len(self.order):
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
                self.pos = 0
            out.append(self.rows[self.order[self.pos]])
            self.pos += 1
        return out
