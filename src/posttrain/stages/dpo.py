"""Stage ``dpo``: Direct Preference Optimisation with TRL's ``DPOTrainer`` (Rafailov et al. 2023).

The policy starts from the SFT model; the reference is a separate, frozen copy of the same SFT weights (loaded
twice, so training cannot touch it). ``dpo.beta`` and ``dpo.loss_type`` go to ``DPOConfig``. LoRA when
``model.lora.enabled`` (merged before saving).

Held-out metrics are computed by ``posttrain.evaluation`` (not read from TRL's logs): for each held-out pair the
summed completion log-probs under the trained policy and the reference give implicit rewards
``r = beta * (log pi(y|x) - log pi_ref(y|x))``; ``reward_accuracy`` is their pairwise accuracy (ties 0.5) and
``margin`` the mean ``r_chosen - r_rejected``. Before training both are exactly chance (0.5) and 0.

inputs: ``{"model"}`` (the SFT model directory). metrics: ``reward_accuracy``, ``margin``, ``chosen_reward``,
``rejected_reward``, ``train_loss_first``/``train_loss_last``, ``train_pairs``, ``heldout_pairs``, data reports.
"""

from __future__ import annotations

import tempfile
import time

from posttrain.recipe import Recipe
from posttrain.stages import StageResult

STAGE = "dpo"


def run(recipe: Recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """DPO-train ``inputs["model"]`` on ``data.preference``; save the merged policy to ``<out_dir>/model``.

    Raises StageError (missing input / data.preference), ModelLoadError (input without weights), DataError.
    """
    from posttrain import models
    from posttrain.stages import _common as c
    from posttrain.tracking import log_metrics, stage_run

    t0 = time.time()
    model_path = c.require_model_input(inputs, "model", STAGE)
    spec, m = recipe.dpo, recipe.model
    params = {**spec.model_dump(), "lora": m.lora.enabled, "max_seq_len": m.max_seq_len, "input_model": model_path}
    with stage_run(recipe.tracking.uri, recipe.tracking.experiment, STAGE, params=params) as run_id:
        tokenizer, notes = models.load_tokenizer(model_path, m.chat_template, None, m.trust_remote_code)
        train_rows, held, reports = c.preference_split(recipe, tokenizer)
        metrics = c.log_reports(reports)
        policy = models.load_causal_lm(model_path, m.dtype, None, m.trust_remote_code).to(c.device())
        reference = models.load_causal_lm(model_path, m.dtype, None, m.trust_remote_code).to(c.device())
        reference.eval().requires_grad_(False)
        trainer, history, scratch = _trainer(recipe, policy, reference, tokenizer, train_rows)
        model_dir = c.train_and_save(trainer, scratch, tokenizer, out_dir)
        del trainer, policy, reference
        c.free_memory()
        # Measured on the saved policy and a fresh reference: the trainer leaves autocast wrappers on both forwards.
        metrics.update(heldout_dpo_metrics(c.load_saved_lm(str(model_dir), m.dtype), c.load_saved_lm(model_path, m.dtype),
                                           tokenizer, held, spec.beta, spec.batch_size, m.max_seq_len))
        metrics.update(c.loss_summary(history.history))
        metrics.update(train_pairs=float(len(train_rows)), heldout_pairs=float(len(held)))
        wall = time.time() - t0
        log_metrics({**metrics, "wall_s": wall})
    artifacts = {"model": str(model_dir), "reference": model_path}
    c.write_manifest(out_dir, STAGE, recipe, inputs, metrics, artifacts, wall, run_id, list(notes))
    print(f"[posttrain] dpo: held-out reward accuracy {metrics.get('reward_accuracy', float('nan')):.3f}, "
          f"margin {metrics.get('margin', float('nan')):.4f} ({len(held)} pairs, {wall:.1f}s)", flush=True)
    return StageResult(STAGE, metrics, artifacts, wall, run_id, list(notes))


def heldout_dpo_metrics(policy, reference, tokenizer, held: list[dict], beta: float, batch_size: int,  # noqa: ANN001
                        max_len: int) -> dict[str, float]:
    """``evaluation.dpo_pair_metrics`` of ``policy`` against ``reference`` on held-out pairs ({} if none)."""
    from posttrain.evaluation import completion_logprobs, dpo_pair_metrics

    if not held:
        return {}
    prompts = [r["prompt"] for r in held]
    chosen, rejected = [r["chosen"] for r in held], [r["rejected"] for r in held]
    lp = {}
    for name, model in (("policy", policy), ("ref", reference)):
        lp[name, "c"] = completion_logprobs(model, tokenizer, prompts, chosen, batch_size, max_len)[0]
        lp[name, "r"] = completion_logprobs(model, tokenizer, prompts, rejected, batch_size, max_len)[0]
    return dpo_pair_metrics(lp["policy", "c"], lp["policy", "r"], lp["ref", "c"], lp["ref", "r"], beta)


def _trainer(recipe: Recipe, policy, reference, tokenizer, rows: list[dict]):  # noqa: ANN001, ANN202
    """(DPOTrainer, loss-history callback, scratch dir) for preference ``rows``."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from posttrain import models
    from posttrain.stages import _common as c

    scratch = tempfile.mkdtemp(prefix="posttrain-dpo-")
    args = DPOConfig(**c.train_args_kwargs(recipe.dpo, recipe.seed, scratch), max_length=recipe.model.max_seq_len,
                     beta=recipe.dpo.beta, loss_type=[recipe.dpo.loss_type])
    peft_config = models.lora_config(recipe.model.lora)
    history = c.loss_history_callback("dpo")
    trainer = DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=peft_config, callbacks=[history])
    return trainer, history, scratch
