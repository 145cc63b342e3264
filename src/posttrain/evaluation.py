"""Held-out evaluation shared by the stages: GSM8K accuracy, completion log-probs, reward-model and DPO metrics.

Pure metric functions (``pairwise_accuracy``, ``dpo_pair_metrics``, ``gsm8k_metrics``, ``sequence_logprobs``) take
plain lists or tensors and are unit-tested against hand computations; the model-facing helpers
(``completion_logprobs``, ``completion_nll``, ``generate_greedy``, ``evaluate_gsm8k``) batch a model over rows.

Tokenisation of (prompt, completion) pairs follows TRL 1.x's non-conversational path exactly, so that held-out
numbers measure what the trainers optimised: ``prompt_ids = tok(prompt)``, ``full = tok(prompt + completion + eos)``
(eos appended unless already there), and the completion starts where the two token lists first differ.

torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

# --------------------------------------------------------------------------------------------------- pure metrics


def pairwise_accuracy(scores_chosen: Sequence[float], scores_rejected: Sequence[float]) -> float:
    """Fraction of pairs with ``score(chosen) > score(rejected)``; a tie counts as 0.5 (a coin flip).

    Ties are counted as half-right so that a constant scorer (e.g. DPO before any update, where every implicit
    reward is 0) reads 0.5, chance level, rather than 0. TRL's ``rewards/accuracies`` counts ties as wrong.

    Args: two equally long lists of scalar scores, one per pair. Returns a float in [0, 1].
    Raises ValueError if the lengths differ or there are no pairs, or if a score is NaN.
    """
    if len(scores_chosen) != len(scores_rejected):
        raise ValueError(f"pairwise_accuracy: {len(scores_chosen)} chosen scores but {len(scores_rejected)} rejected; "
                         "pass one score of each per pair")
    if not scores_chosen:
        raise ValueError("pairwise_accuracy: no pairs to score; give at least one held-out pair")
    total = 0.0
    for c, r in zip(scores_chosen, scores_rejected):
        c, r = float(c), float(r)
        if math.isnan(c) or math.isnan(r):
            raise ValueError("pairwise_accuracy: a score is NaN; the model produced non-finite outputs")
        total += 1.0 if c > r else 0.5 if c == r else 0.0
    return total / len(scores_chosen)


def dpo_implicit_rewards(policy_logps: Sequence[float], ref_logps: Sequence[float], beta: float) -> list[float]:
    """DPO implicit reward ``r = beta * (log pi(y|x) - log pi_ref(y|x))`` per sequence (Rafailov et al. 2023, eq. 5).

    ``policy_logps``/``ref_logps``: summed log-probabilities (nats) of each completion's tokens under the policy
    and the reference. Returns one reward per sequence (nats scaled by beta).
    """
    if len(policy_logps) != len(ref_logps):
        raise ValueError(f"dpo_implicit_rewards: {len(policy_logps)} policy log-probs but {len(ref_logps)} reference ones")
    return [beta * (float(p) - float(q)) for p, q in zip(policy_logps, ref_logps)]


def dpo_pair_metrics(policy_chosen: Sequence[float], policy_rejected: Sequence[float], ref_chosen: Sequence[float],
                     ref_rejected: Sequence[float], beta: float) -> dict[str, float]:
    """Held-out DPO metrics from summed completion log-probs (nats), one entry per pair.

    Returns ``reward_accuracy`` (``pairwise_accuracy`` of the implicit rewards, ties 0.5), ``margin`` (mean of
    ``r_chosen - r_rejected``), ``chosen_reward`` and ``rejected_reward`` (means). Rafailov et al. 2023.
    """
    rc = dpo_implicit_rewards(policy_chosen, ref_chosen, beta)
    rr = dpo_implicit_rewards(policy_rejected, ref_rejected, beta)
    n = len(rc)
    return {
        "reward_accuracy": pairwise_accuracy(rc, rr),
        "margin": sum(c - r for c, r in zip(rc, rr)) / n,
        "chosen_reward": sum(rc) / n,
        "rejected_reward": sum(rr) / n,
    }


def gsm8k_metrics(completions: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    """``accuracy`` (mean of ``rewards.gsm8k_correct``), ``format_rate`` (mean of ``rewards.format_reward``) and
    ``answer_rate`` (fraction where ``rewards.extract_answer`` found any number) over completions. Floats in [0, 1].
    """
    from posttrain.rewards import extract_answer, format_reward, gsm8k_correct

    if len(completions) != len(golds):
        raise ValueError(f"gsm8k_metrics: {len(completions)} completions but {len(golds)} gold answers")
    if not completions:
        raise ValueError("gsm8k_metrics: no completions to score; give at least one held-out prompt")
    n = len(completions)
    return {
        "accuracy": sum(gsm8k_correct(c, g) for c, g in zip(completions, golds)) / n,
        "format_rate": sum(format_reward(c) for c in completions) / n,
        "answer_rate": sum(extract_answer(c) is not None for c in completions) / n,
    }


def sequence_logprobs(logits: Any, input_ids: Any, completion_mask: Any) -> Any:
    """Summed log-probabilities of the completion tokens of each sequence.

    ``logits``: float ``[batch, seq, vocab]`` (position t predicts token t+1); ``input_ids``: long ``[batch, seq]``;
    ``completion_mask``: ``[batch, seq]`` (1 on completion tokens, 0 on prompt and padding). The first position
    cannot be predicted and is ignored. Returns float ``[batch]`` (nats, <= 0), computed in float32.
    """
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    targets = input_ids[:, 1:]
    token_logp = torch.gather(logp, 2, targets.unsqueeze(-1)).squeeze(-1)
    return (token_logp * completion_mask[:, 1:].to(token_logp.dtype)).sum(dim=-1)


# --------------------------------------------------------------------------------------------------- tokenisation


def tokenize_prompt_completion(tokenizer: Any, prompt: str, completion: str, max_len: int | None = None,
                               add_eos: bool = True) -> tuple[list[int], int]:
    """Token ids of ``prompt + completion (+ eos)`` and the index where the completion starts, as TRL 1.x does.

    Truncates to ``max_len`` tokens keeping the start (TRL's ``keep_start``). Returns ``(ids, completion_start)``.
    """
    eos = tokenizer.eos_token or ""
    if add_eos and eos and not completion.endswith(eos):
        completion = completion + eos
    prompt_ids = tokenizer(prompt)["input_ids"]
    full = tokenizer(prompt + completion)["input_ids"]
    start = 0
    for a, b in zip(prompt_ids, full):
        if a != b:
            break
        start += 1
    if max_len is not None:
        full = full[:max_len]
    return full, min(start, len(full))


def _pad_right(rows: list[tuple[list[int], int]], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-pad ``(ids, completion_start)`` rows into ``input_ids``, ``attention_mask``, ``completion_mask`` [batch, seq]."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    comp = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, start) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attn[i, : len(ids)] = 1
        comp[i, start: len(ids)] = 1
    return input_ids, attn, comp


# --------------------------------------------------------------------------------------------------- model helpers


def model_device(model: Any) -> Any:
    """The device of a model's first parameter."""
    return next(model.parameters()).device


def _scored_batches(model: Any, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str],
                    batch_size: int, max_len: int | None):
    """Yield ``(input_ids, completion_mask, logits)`` per right-padded batch of ``tokenize_prompt_completion`` rows,
    all on the model's device, in eval mode without gradients (the model's train/eval mode is restored after)."""
    import torch

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = model_device(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(prompts), batch_size):
                rows = [tokenize_prompt_completion(tokenizer, p, c, max_len)
                        for p, c in zip(prompts[i: i + batch_size], completions[i: i + batch_size])]
                input_ids, attn, comp = _pad_right(rows, pad_id)
                input_ids = input_ids.to(device)
                yield input_ids, comp.to(device), model(input_ids=input_ids, attention_mask=attn.to(device)).logits
    finally:
        model.train(was_training)


def completion_logprobs(model: Any, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str],
                        batch_size: int = 16, max_len: int | None = None) -> tuple[list[float], list[int]]:
    """Summed log-prob (nats) and token count of each completion (+ eos) given its prompt, under a causal LM.

    Tokenised as TRL does (see module docstring); right-padded batches of ``batch_size``; no gradients.
    Returns ``(sum_logps, n_tokens)``, one entry per row.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"completion_logprobs: {len(prompts)} prompts but {len(completions)} completions")
    sums: list[float] = []
    counts: list[int] = []
    for input_ids, comp, logits in _scored_batches(model, tokenizer, prompts, completions, batch_size, max_len):
        sums += sequence_logprobs(logits, input_ids, comp).tolist()
        counts += [int(x) for x in comp[:, 1:].sum(dim=-1)]
    return sums, counts


def completion_nll(model: Any, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str],
                   batch_size: int = 16, max_len: int | None = None) -> float:
    """Mean negative log-likelihood per completion token (nats/token) over all rows: the SFT loss of TRL's
    ``completion_only_loss`` on a held-out set, weighted by tokens (not by rows)."""
    sums, counts = completion_logprobs(model, tokenizer, prompts, completions, batch_size, max_len)
    n = sum(counts)
    if n == 0:
        raise ValueError("completion_nll: no completion tokens in the held-out rows")
    return -sum(sums) / n


def generate_greedy(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int, batch_size: int,
                    stop_ids: Sequence[int], desc: str = "generate") -> list[str]:
    """Greedy completions of ``prompts``: left-padded batches, stopping at any of ``stop_ids``.

    Prompts are tokenised like training (``tokenizer(prompt)``, special tokens included). Returns the decoded new
    text of each prompt (special tokens skipped), in input order. Shows a progress bar over batches.
    """
    import torch
    from tqdm.auto import tqdm

    device = model_device(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc=desc, leave=False):
            enc = tokenizer(list(prompts[i: i + batch_size]), return_tensors="pt", padding=True)
            with torch.no_grad():
                gen = model.generate(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                                     max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(stop_ids),
                                     pad_token_id=pad_id, temperature=None, top_p=None, top_k=None)
            new = gen[:, enc["input_ids"].shape[1]:].tolist()
            out += [tokenizer.decode(_cut_at_stop(ids, stop_ids), skip_special_tokens=True) for ids in new]
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return out


def _cut_at_stop(ids: list[int], stop_ids: Sequence[int]) -> list[int]:
    """``ids`` up to (excluding) the first stop id."""
    stops = set(stop_ids)
    for j, t in enumerate(ids):
        if t in stops:
            return ids[:j]
    return ids


def evaluate_gsm8k(model: Any, tokenizer: Any, rows: Sequence[dict], max_new_tokens: int, batch_size: int,
                   stop_ids: Sequence[int], desc: str = "gsm8k") -> tuple[dict[str, float], list[dict]]:
    """Greedy GSM8K evaluation of ``rows`` (``{"prompt", "question", "answer"}`` from ``data.load_prompts``).

    Returns ``(metrics, records)``: metrics from ``gsm8k_metrics`` (accuracy, format_rate, answer_rate) and one
    record per row ``{"question", "gold", "completion", "extracted", "correct"}``.
    """
    from posttrain.rewards import extract_answer, gsm8k_correct

    completions = generate_greedy(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens, batch_size, stop_ids, desc)
    golds = [str(r["answer"]) for r in rows]
    metrics = gsm8k_metrics(completions, golds)
    records = [{"question": r.get("question", r["prompt"]), "gold": g, "completion": c, "extracted": extract_answer(c),
                "correct": gsm8k_correct(c, g)} for r, c, g in zip(rows, completions, golds)]
    return metrics, records


def reward_scores(model: Any, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str],
                  batch_size: int = 16, max_len: int | None = None) -> list[float]:
    """Scores of an in-memory sequence-classification reward model (``num_labels=1``) for each (prompt, completion).

    Tokenised as TRL's ``RewardTrainer`` does: ``tok(prompt + completion + eos)``, right padding; the model reads the
    last non-pad token (``config.pad_token_id`` must be set). Returns one float per row. For a saved reward model
    use ``posttrain.rewards.RewardModelScorer``.
    """
    out: list[float] = []
    for _, _, logits in _scored_batches(model, tokenizer, prompts, completions, batch_size, max_len):
        out += logits[:, 0].float().tolist()
    return out
