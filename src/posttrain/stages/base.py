"""Stage ``base``: load the base model and tokenizer, repair them, save a copy, and measure the baseline.

Loading goes through ``posttrain.models`` (missing pad token and chat template are repaired, with warnings);
the repaired copy is saved at ``<out_dir>/model`` so every later stage loads the same tokenizer and template.
The baseline is greedy GSM8K accuracy and format rate on ``data.eval_prompts`` (``posttrain.evaluation``).

inputs: none. metrics: ``gsm8k_accuracy``, ``format_rate``, ``answer_rate``, ``eval_prompts`` (count), data
report metrics.
"""

from __future__ import annotations

import time
from pathlib import Path

from posttrain.recipe import Recipe
from posttrain.stages import StageResult

STAGE = "base"


def run(recipe: Recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """Load, repair and save the base model; evaluate it on held-out GSM8K prompts.

    Raises ModelLoadError (model/tokenizer cannot be loaded), DataError (eval prompts), StageError.
    """
    from posttrain import models
    from posttrain.artifacts import atomic_dir
    from posttrain.stages import _common as c
    from posttrain.tracking import log_metrics, log_text, stage_run

    t0 = time.time()
    m = recipe.model
    params = {"model": m.name_or_path, "revision": m.revision, "dtype": m.dtype, "chat_template": m.chat_template}
    with stage_run(recipe.tracking.uri, recipe.tracking.experiment, STAGE, params=params) as run_id:
        tokenizer, warnings = models.load_tokenizer(m.name_or_path, m.chat_template, m.revision, m.trust_remote_code)
        model = models.load_causal_lm(m.name_or_path, m.dtype, m.revision, m.trust_remote_code)
        if warnings:
            log_text("\n".join(warnings), "model_repairs.txt")
        model_dir = Path(out_dir) / "model"
        with atomic_dir(model_dir) as tmp:
            models.save_model(model, tokenizer, str(tmp))
        notes = list(warnings)
        metrics = _baseline(recipe, model, tokenizer, notes)
        wall = time.time() - t0
        log_metrics({**metrics, "wall_s": wall})
    artifacts = {"model": str(model_dir)}
    c.write_manifest(out_dir, STAGE, recipe, inputs, metrics, artifacts, wall, run_id, notes)
    print(f"[posttrain] base: gsm8k_accuracy={metrics.get('gsm8k_accuracy', float('nan')):.3f} "
          f"format_rate={metrics.get('format_rate', float('nan')):.3f} ({wall:.1f}s)", flush=True)
    return StageResult(STAGE, metrics, artifacts, wall, run_id, notes)


def _baseline(recipe: Recipe, model, tokenizer, notes: list[str]) -> dict[str, float]:  # noqa: ANN001
    """Greedy GSM8K metrics of the base model on ``data.eval_prompts``; {} (with a note) when none are set."""
    from posttrain import evaluation, models
    from posttrain.stages import _common as c

    if recipe.data.eval_prompts is None:
        notes.append("data.eval_prompts is not set: no baseline evaluation")
        print(f"[posttrain] base: {notes[-1]}", flush=True)
        return {}
    rows, report = c.eval_prompt_rows(recipe, tokenizer)
    metrics = c.log_reports([report])
    model.to(c.device())
    gsm, _ = evaluation.evaluate_gsm8k(model, tokenizer, rows, recipe.evaluate.max_new_tokens, recipe.evaluate.batch_size,
                                       models.stop_token_ids(tokenizer, model), desc="base gsm8k")
    metrics.update({("gsm8k_accuracy" if k == "accuracy" else k): v for k, v in gsm.items()})
    metrics["eval_prompts"] = float(len(rows))
    return metrics
