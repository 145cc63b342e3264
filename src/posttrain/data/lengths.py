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
        out.extend(len(ids) for ids in tokenizer(texts[i:i + batch], verbose=False)["input_ids"])
    return out


def fit_completion(tokenizer, prompt: str, completion: str, max_len: int, prompt_len: int | None = None) -> str | None:
    """The longest prefix of ``completion`` (in characters, trailing whitespace stripped) with
    ``len(tok(prompt + prefix)) <= max_len``, or None when no non-blank prefix fits.

    ``prompt_len``: ``len(tok(prompt))`` when already known. Fast tokenizers: the cut is read from the offset of
    token ``max_len - 1`` and checked by re-tokenisation; otherwise (or if the check fails) a binary search over
    characters, O(log len(completion)) tokenisations.
    """
    def n(text: str) -> int:
        return len(tokenizer(text, verbose=False)["input_ids"])

    total, guess = _length_and_cut(tokenizer, prompt, completion, max_len)
    if total <= max_len:
        return completion
    if (prompt_len if prompt_len is not None else n(prompt)) > max_len:
        return None
    lo, hi = 0, len(completion)          # invariant: prefix of length lo fits, hi does not
    if guess is not None and 0 < guess < hi:
        if n(prompt + completion[:guess]) <= max_len:
            lo = guess
            if n(prompt + completion[:guess + 1]) > max_len:
                hi = guess + 1           # the guess is the longest prefix: no search needed
        else:
            hi = guess
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if n(prompt + completion[:mid]) <= max_len:
            lo = mid
        else:
            hi = mid
    cut = completion[:lo].rstrip()
    return cut if cut.strip() else None


def _length_and_cut(tokenizer, prompt: str, completion: str, max_len: int) -> tuple[int, int | None]:
    """(tokens in prompt + completion, completion characters up to the end of token ``max_len - 1`` or None
    when the tokenizer gives no offsets)."""
    text = prompt + completion
    try:
        enc = tokenizer(text, return_offsets_mapping=True, verbose=False)
    except (NotImplementedError, ValueError, TypeError):
        return len(tokenizer(text, verbose=False)["input_ids"]), None
    offsets = enc.get("offset_mapping")
    total = len(enc["input_ids"])
    if not offsets or total <= max_len:
        return total, None
    return total, max(e for _, e in offsets[:max_len]) - len(prompt)
