"""Score completions with a trained reward model (a saved ``AutoModelForSequenceClassification``, one label).

The scorer re-tokenises *text* with the reward model's own tokenizer, so the policy and the reward model may use
different vocabularies. Text is scored the way TRL's ``RewardTrainer`` trained it (non-conversational data):
``prompt + completion``, with the tokenizer's eos appended when the text does not already end in it, and the
tokenizer's own special tokens (e.g. BOS) added.
"""

from __future__ import annotations

import logging
from pathlib import Path

from posttrain.errors import ModelLoadError

log = logging.getLogger("posttrain")


class RewardModelScorer:
    """A reward model loaded from a saved directory; ``score`` returns one float per (prompt, completion).

    ``path``: a directory with ``config.json``, weights and tokenizer files (the reward stage's ``model/``).
    ``device``: torch device string. ``batch_size``: texts per forward pass. ``max_length``: tokens kept per text
    (default: the model's ``max_position_embeddings``); longer texts keep their *end* (the completion).
    Raises ``ModelLoadError`` when the directory cannot be loaded as a one-label sequence classifier.
    """

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 16, max_length: int | None = None,
                 append_eos: bool = True):
        from transformers import AutoModelForSequenceClassification

        from posttrain.models import _check_local_dir, _is_local, load_tokenizer

        if _is_local(path):
            _check_local_dir(path, ("config", "weights", "tokenizer"))
        self.tokenizer, _ = load_tokenizer(path, chat_template="none")
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        try:
            self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot load a reward model (sequence classifier, 1 label) from {path!r}: {exc}; "
                                 "point at the reward stage's saved model directory") from None
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval()
        self.device = device
        self.batch_size = int(batch_size)
        self.max_length = max_length or getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.append_eos = append_eos
        self.path = str(Path(path))

    def texts(self, prompts: list[str], completions: list[str]) -> list[str]:
        """The exact strings that are tokenised: ``prompt + completion`` (+ eos, see the module docstring)."""
        if len(prompts) != len(completions):
            raise ValueError(f"RewardModelScorer.score: {len(prompts)} prompts but {len(completions)} completions; "
                             "pass one completion per prompt (repeat prompts for groups)")
        eos = self.tokenizer.eos_token if self.append_eos else None
        out = []
        for p, c in zip(prompts, completions):
            t = p + c
            out.append(t + eos if eos and not t.endswith(eos) else t)
        return out

    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        """Scalar rewards, one per pair, in input order (no grad, batches of ``batch_size``)."""
        import torch

        texts = self.texts(prompts, completions)
        scores: list[float] = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[i:i + self.batch_size], return_tensors="pt", padding=True,
                                     truncation=True, max_length=self.max_length)
                enc = {k: v.to(self.device) for k, v in enc.items()}
                logits = self.model(**enc).logits  # [batch, 1]
                scores.extend(float(x) for x in logits[:, 0].float().cpu())
        return scores
