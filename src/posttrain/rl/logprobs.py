"""Recompute token log-probs of completions under a model (learner side)."""

from __future__ import annotations


def forward_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float = 1.0,
                     with_entropy: bool = False, with_hidden: bool = False):
    """Log-probs of ``completion_ids`` given the prompts, under ``log_softmax(logits / temperature)``.

    prompt_ids/prompt_mask: ``[B, P]`` left-padded; completion_ids/completion_mask: ``[B, T]`` right-padded.
    Position ids follow the attention mask (``cumsum - 1``), as ``generate`` does for left-padded batches, so
    the result matches the actor's behaviour log-probs for the same weights.
    Returns ``(logp [B, T], entropy [B, T] or None, hidden [B, T, H] or None)``; hidden is the last-layer
    state at the positions that predict each completion token (PPO's value head reads it).
    """
    import torch

    from posttrain.rl.losses import entropy_from_logits

    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attn = torch.cat([prompt_mask, completion_mask], dim=1)
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=with_hidden,
                use_cache=False)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    logits = out.logits[:, P - 1:P - 1 + T, :].float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)
    ent = entropy_from_logits(logits.detach()) if with_entropy else None
    hidden = out.hidden_states[-1][:, P - 1:P - 1 + T, :] if with_hidden else None
    return logp, ent, hidden


PROBE_TEXT = "Once upon a time, there was a little"
"""A fixed text whose log-prob both roles compute, to check that weight syncs reach the actors intact."""


def probe_logprob(model, tokenizer, text: str = PROBE_TEXT) -> float:
    """Sum of token log-probs (nats) of ``text`` under ``model`` (no grad, temperature 1)."""
    import torch

    ids = torch.tensor([tokenizer(text)["input_ids"]], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    return float(torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).sum())
