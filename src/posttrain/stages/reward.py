"""Stage ``reward``: a scalar reward model trained with TRL's ``RewardTrainer`` on preference pairs.

The SFT model is loaded as ``AutoModelForSequenceClassification`` with ``num_labels=1`` (a new, seeded linear
``score`` head on the last non-pad token; ``config.pad_token_id`` is set from the repaired tokenizer) and trained
with the Bradley-Terry loss ``-log sigmoid(r_chosen - r_rejected)`` (Ouyang et al. 2022). LoRA when
``model.lora.enabled`` (task SEQ_CLS, so the score head is trained too), merged before saving.

Held-out pairs: ``data.eval_preference`` if set, else ``data.eval_fraction`` of ``data.preference``; at most
``evaluate.preference_pairs``. The metric is ``evaluation.pairwise_accuracy`` (ties count 0.5) of the scores the
model gives chosen and rejected completions, before and after training.

inputs: ``{"model"}`` (the SFT model directory). metrics: ``pairwise_accuracy``, ``pairwise_accuracy_before``,
``score_margin`` (mean chosen - rejected score after training), ``train_loss_first``/``train_loss_last``,
``train_pairs``, ``heldout_pairs``, data report metrics.
"""

from __future__ import annotations

import tempfile
import time

from posttrain.recipe import Recipe
from posttrain.stages import StageResult

STAGE = "reward"


def run(recipe: Recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """Train a reward model from ``inputs["model"]``; save it (full, merged) to ``<out_dir>/model``.

    Raises StageError (missing input / data.preference), ModelLoadError (input without weights), DataError.
    """
    from posttrain import models
    from posttrain.stages import _common as c
    from posttrain.tracking import log_metrics, stage_run

    t0 = time.time()
    model_path = c.require_model_input(inputs, "model", STAGE)
    spec, m = recipe.reward, recipe.model
    params = {**spec.model_dump(), "lora": m.lora.enabled, "max_seq_len": m.max_seq_len, "input_model": model_path}
    with stage_run(recipe.tracking.uri, recipe.tracking.experiment, STAGE, params=params) as run_id:
        tokenizer, notes = models.load_tokenizer(model_path, m.chat_template, None, m.trust_remote_code)
        train_rows, held, reports = c.preference_split(recipe, tokenizer)
        metrics = c.log_reports(reports)
        model = load_reward_model(model_path, tokenizer, m.dtype, recipe.seed, m.trust_remote_code).to(c.device())
        metrics["pairwise_accuracy_before"] = heldout_accuracy(model, tokenizer, held, spec.batch_size, m.max_seq_len)[0]
        trainer, history, scratch = _trainer(recipe, model, tokenizer, train_rows)
        model_dir = c.train_and_save(trainer, scratch, tokenizer, out_dir)
        del trainer, model
        c.free_memory()
        # Measured on the saved model through RewardModelScorer, exactly as the evaluate and RL stages score.
        acc, margin = saved_accuracy(str(model_dir), held, spec.batch_size)
        metrics.update(c.loss_summary(history.history))
        metrics.update(pairwise_accuracy=acc, score_margin=margin, train_pairs=float(len(train_rows)),
                       heldout_pairs=float(len(held)))
        wall = time.time() - t0
        log_metrics({**metrics, "wall_s": wall})
    artifacts = {"model": str(model_dir)}
    c.write_manifest(out_dir, STAGE, recipe, inputs, metrics, artifacts, wall, run_id, list(notes))
    print(f"[posttrain] reward: held-out pairwise accuracy {metrics['pairwise_accuracy_before']:.3f} -> {acc:.3f} "
          f"({len(held)} pairs, {wall:.1f}s)", flush=True)
    return StageResult(STAGE, metrics, artifacts, wall, run_id, list(notes))


def load_reward_model(path: str, tokenizer, dtype: str, seed: int, trust_remote_code: bool = False):  # noqa: ANN001, ANN201
    """``AutoModelForSequenceClassification(num_labels=1)`` from a causal-LM directory, head seeded with ``seed``,
    ``config.pad_token_id`` set from ``tokenizer``. Raises ModelLoadError naming the path on failure."""
    import torch
    from transformers import AutoModelForSequenceClassification, set_seed

    from posttrain.errors import ModelLoadError

    set_seed(seed)
    torch_dtype = None if dtype == "auto" else getattr(torch, dtype)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch_dtype,
                                                                   trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"reward: cannot load {path!r} as a sequence-classification model: {exc}") from exc
    if tokenizer.pad_token_id is None:
        raise ModelLoadError(f"reward: the tokenizer of {path!r} has no pad token; load it with posttrain.models.load_tokenizer")
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def heldout_accuracy(model, tokenizer, held: list[dict], batch_size: int, max_len: int) -> tuple[float, float]:  # noqa: ANN001
    """(pairwise accuracy, mean chosen-minus-rejected score) of an in-memory ``model`` (not yet wrapped by a
    trainer) on held-out pairs; (nan, nan) if none."""
    from posttrain.evaluation import pairwise_accuracy, reward_scores

    if not held:
        return float("nan"), float("nan")
    prompts = [r["prompt"] for r in held]
    sc = reward_scores(model, tokenizer, prompts, [r["chosen"] for r in held], batch_size, max_len)
    sr = reward_scores(model, tokenizer, prompts, [r["rejected"] for r in held], batch_size, max_len)
    return pairwise_accuracy(sc, sr), sum(a - b for a, b in zip(sc, sr)) / len(sc)


def saved_accuracy(path: str, held: list[dict], batch_size: int) -> tuple[float, float]:
    """(pairwise accuracy, mean chosen-minus-rejected score) of the saved reward model at ``path`` on held-out
    pairs, scored by ``rewards.RewardModelScorer``; (nan, nan) if there is no pair."""
    from posttrain.evaluation import pairwise_accuracy
    from posttrain.rewards import RewardModelScorer
    from posttrain.stages._common import device

    if not held:
        return float("nan"), float("nan")
    scorer = RewardModelScorer(path, device=device(), batch_size=batch_size)
    prompts = [r["prompt"] for r in held]
    sc = scorer.score(prompts, [r["chosen"] for r in held])
    sr = scorer.score(prompts, [r["rejected"] for r in held])
    return pairwise_accuracy(sc, sr), sum(a - b for a, b in zip(sc, sr)) / len(sc)


def _trainer(recipe: Recipe, model, tokenizer, rows: list[dict]):  # noqa: ANN001, ANN202
    """(RewardTrainer, loss-history callback, scratch dir) for preference ``rows``."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from posttrain import models
    from posttrain.stages import _common as c

    scratch = tempfile.mkdtemp(prefix="posttrain-reward-")
    args = RewardConfig(**c.train_args_kwargs(recipe.reward, recipe.seed, scratch), max_length=recipe.model.max_seq_len)
    # task SEQ_CLS: PEFT then also trains (modules_to_save) the new score head
    peft_config = models.lora_config(recipe.model.lora, task_type="SEQ_CLS")
    history = c.loss_history_callback("reward")
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                            peft_config=peft_config, callbacks=[history])
    return trainer, history, scratch
