"""transformers generation backend (CPU or GPU).

Behaviour log-probs come from ``generate(output_scores=True)``: those scores are the logits *after* the logits
processors (temperature, top-p), so ``log_softmax(scores_t)[token_t]`` is exactly the log-prob of the sampled
token under the distribution it was sampled from. top-k is disabled (``top_k=0``) so only temperature and
top-p shape the distribution; the learner recomputes ``log_softmax(logits / temperature)``, which equals the
behaviour log-prob when ``top_p == 1`` (with ``top_p < 1`` the ratio also carries the truncation).
"""

from __future__ import annotations

from posttrain.rl.engines.base import Generation, GenerationEngine


class HFEngine(GenerationEngine):
    def __init__(self, model, tokenizer, stop_ids: list[int], device: str = "cpu"):
        self.model, self.tokenizer, self.stop_ids, self.device = model, tokenizer, list(stop_ids), device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.model.eval()

    def sync_targets(self) -> list:
        from posttrain.rl.weights import synced_parameters

        return synced_parameters(self.model)

    def weights_loaded(self) -> None:
        pass

    def generate(self, prompt_ids, max_new_tokens, temperature, top_p) -> Generation:
        import torch

        input_ids, attn = left_pad(prompt_ids, self.pad_id, self.device)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attn, do_sample=True, temperature=temperature, top_p=top_p,
                top_k=0, max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                return_dict_in_generate=True, output_scores=True, use_cache=True,
            )
        seqs = out.sequences[:, input_ids.shape[1]:]
        scores = torch.stack(out.scores, dim=1).float()  # [B, T, vocab], processed
        logp = torch.log_softmax(scores, dim=-1).gather(-1, seqs[..., None]).squeeze(-1)
        return _trim(seqs.tolist(), logp.tolist(), self.stop_ids)


def left_pad(rows: list[list[int]], pad_id: int, device="cpu"):
    """Left-pad token rows -> ``(ids [B, P] long, mask [B, P] long)``."""
    import torch

    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, P - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, P - len(r):] = 1
    return ids.to(device), mask.to(device)


def _trim(seqs: list[list[int]], logps: list[list[float]], stop_ids: list[int]) -> Generation:
    """Cut each row after its first stop token (generate pads finished rows)."""
    ids_out, lp_out = [], []
    stops = set(stop_ids)
    for ids, lp in zip(seqs, logps):
        end = len(ids)
        for t, tok in enumerate(ids):
            if tok in stops:
                end = t + 1
                break
        ids_out.append(ids[:end])
        lp_out.append(lp[:end])
    return Generation(ids_out, lp_out)
