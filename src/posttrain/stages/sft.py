"""Stage ``sft``: supervised fine-tuning with TRL's ``SFTTrainer`` on prompt/completion rows.

Rows come from ``data.load_sft`` (templated prompt, answer completion); a small held-out split
(``data.eval_fraction``, at most ``SFT_HOLDOUT_MAX`` rows) is kept out of training. The loss is on completion
tokens only when ``sft.completion_only_loss``. Full fine-tuning, or LoRA when ``model.lora.enabled`` (merged into
the weights before saving). The trainer's log history goes to MLflow as ``sft/<key>`` at each logging step.

inputs: ``{"model"}`` (the base stage's model directory). metrics: ``train_loss_first``, ``train_loss_last``,
``heldout_loss_before``, ``heldout_loss_after`` (nats per completion token, ``evaluation.completion_nll``),
``train_rows``, ``heldout_rows``, data report metrics.
"""

from __future__ import annotations

import tempfile
import time

from posttrain.recipe import Recipe
from posttrain.stages import StageResult

STAGE = "sft"


def run(recipe: Recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """Fine-tune ``inputs["model"]`` on ``data.sft``; save the merged model to ``<out_dir>/model``.

    Raises StageError (missing input/data spec), ModelLoadError (input without weights), DataError (bad data).
    """
    from posttrain import evaluation, models
    from posttrain.data import load_sft, split_holdout
    from posttrain.errors import StageError
    from posttrain.stages import _common as c
    from posttrain.tracking import log_metrics, stage_run

    t0 = time.time()
    model_path = c.require_model_input(inputs, "model", STAGE)
    if not recipe.data.sft:
        raise StageError("data.sft is empty; the sft stage needs at least one dataset, e.g. "
                         "[{source: ../shared/data/gsm8k/train.jsonl, format: gsm8k}] (or set sft.enabled=false)")
    spec, m = recipe.sft, recipe.model
    params = {**spec.model_dump(), "lora": m.lora.enabled, "max_seq_len": m.max_seq_len, "input_model": model_path}
    with stage_run(recipe.tracking.uri, recipe.tracking.experiment, STAGE, params=params) as run_id:
        tokenizer, notes = models.load_tokenizer(model_path, m.chat_template, None, m.trust_remote_code)
        rows, reports = load_sft(recipe.data.sft, tokenizer, m.max_seq_len, recipe.data.overlength, recipe.seed)
        metrics = c.log_reports(reports)
        frac = min(recipe.data.eval_fraction, c.SFT_HOLDOUT_MAX / max(len(rows), 1))
        train_rows, held = split_holdout(rows, frac, recipe.seed)
        model = models.load_causal_lm(model_path, m.dtype, None, m.trust_remote_code).to(c.device())
        held_loss = _heldout_loss(evaluation, model, tokenizer, held, spec.batch_size, m.max_seq_len)
        trainer, history, scratch = _trainer(recipe, model, tokenizer, train_rows)
        model_dir = c.train_and_save(trainer, scratch, tokenizer, out_dir)
        del trainer, model
        c.free_memory()
        # Measured on the saved model: the trainer leaves an autocast wrapper on the in-memory forward.
        saved = c.load_saved_lm(str(model_dir), m.dtype)
        metrics.update(c.loss_summary(history.history))
        metrics.update(heldout_loss_before=held_loss,
                       heldout_loss_after=_heldout_loss(evaluation, saved, tokenizer, held, spec.batch_size, m.max_seq_len),
                       train_rows=float(len(train_rows)), heldout_rows=float(len(held)))
        wall = time.time() - t0
        log_metrics({**metrics, "wall_s": wall})
    artifacts = {"model": str(model_dir)}
    c.write_manifest(out_dir, STAGE, recipe, inputs, metrics, artifacts, wall, run_id, list(notes))
    print(f"[posttrain] sft: loss {metrics.get('train_loss_first', float('nan')):.3f} -> "
          f"{metrics.get('train_loss_last', float('nan')):.3f}, held-out {held_loss:.3f} -> "
          f"{metrics['heldout_loss_after']:.3f} ({wall:.1f}s)", flush=True)
    return StageResult(STAGE, metrics, artifacts, wall, run_id, list(notes))


def _heldout_loss(evaluation, model, tokenizer, held: list[dict], batch_size: int, max_len: int) -> float:  # noqa: ANN001
    """Held-out completion NLL (nats/token); NaN when there is no held-out row."""
    if not held:
        return float("nan")
    return evaluation.completion_nll(model, tokenizer, [r["prompt"] for r in held], [r["completion"] for r in held],
                                     batch_size=batch_size, max_len=max_len)


def _trainer(recipe: Recipe, model, tokenizer, rows: list[dict]):  # noqa: ANN001, ANN202
    """(SFTTrainer, loss-history callback, scratch dir) for ``rows``."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from posttrain import models
    from posttrain.stages import _common as c

    scratch = tempfile.mkdtemp(prefix="posttrain-sft-")
    args = SFTConfig(**c.train_args_kwargs(recipe.sft, recipe.seed, scratch), max_length=recipe.model.max_seq_len,
                     completion_only_loss=recipe.sft.completion_only_loss, packing=False)
    history = c.loss_history_callback("sft")
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=models.lora_config(recipe.model.lora), callbacks=[history])
    return trainer, history, scratch
