"""Token lengths against the model context and the over-length policy (``data.overlength``).

A row's length is ``len(tokenizer(prompt + completion).input_ids)`` in tokens, special tokens the tokenizer adds
(e.g. BOS) included; trainers may append one eos on top. Over-length rows are dropped (``"drop"``) or their
completion is cut to fit (``"truncate"``: the prompt is kept whole); a row whose prompt alone fills the context is
dropped either way. Both are counted in the ``DataReport``, never silent.
"""

from __future__ import annotations


def token_lengths(tokenizer, texts: list[str], batch: int = 1024) -> list[int]:
    """Token counts of ``texts`` (with the tokenizer's special tokens), tokenised in batches."""
    from tqdm.auto import tqdm

    out: list[int] = []
    steps = range(0, len(texts), batch)
    for i in tqdm(steps, desc="tokenizing", unit="batch", disable=None if len(texts) > 4 * batch else True):
        out.extend(len(ids) for ids in tokenizer(texts[i:i + batch])["input_ids"])
    return out


def fit_completion(tokenizer, prompt: str, completion: str, max_len: int) -> str | None:
    """The longest prefix of ``completion`` (in characters, trailing whitespace stripped) with
    ``len(tok(prompt + prefix)) <= max_len``, or None when no non-blank prefix fits. Binary search: O(log len(completion)) tokenisations.
    """
    def n(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    if n(prompt + completion) <= max_len:
        return completion
    lo, hi = 0, len(completion)          # invariant: prefix of length lo fits, hi does not
    if n(prompt) > max_len:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if n(prompt + completion[:mid]) <= max_len:
            lo = mid
        else:
            hi = mid
    cut = completion[:lo].rstrip()
    return cut if cut.strip() else None
