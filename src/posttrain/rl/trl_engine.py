"""TRL's GRPOTrainer behind the same interface as our engine (``rl.engine: trl``), for comparison.

Settings map one to one: one optimizer step per ``prompts_per_step x num_generations`` completions
(``per_device_train_batch_size = P*n / grad_accum``, ``steps_per_generation = grad_accum``), same temperature,
top-p, completion length, learning rate, clip (``epsilon``/``epsilon_high``), KL ``beta = rl.kl_coef``, loss
aggregation (``loss_type``: token -> "dapo", sequence -> "grpo") and group std scaling. Rewards use the same
``Scorer`` as our actors. TRL runs in this process, synchronously (generate, then train).
Known difference: TRL cuts completions only at the tokenizer's eos, not at every stop id (stories260K also
stops on BOS), which matters only for completions that stop early.
"""

from __future__ import annotations

import time
from pathlib import Path


def _dataset(recipe, tokenizer):
    from datasets import Dataset

    from posttrain.rl.prompts import load_prompt_rows

    rows, _ = load_prompt_rows(recipe, tokenizer)
    return Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])


def _config(recipe, out_dir: str):
    from trl import GRPOConfig

    rl = recipe.rl
    samples = rl.prompts_per_step * rl.num_generations
    if samples % rl.grad_accum:
        raise ValueError(f"rl.grad_accum={rl.grad_accum}: must divide prompts_per_step x num_generations = {samples} "
                         "for the TRL engine")
    return GRPOConfig(
        output_dir=str(Path(out_dir) / ".trl"), per_device_train_batch_size=samples // rl.grad_accum,
        steps_per_generation=rl.grad_accum, gradient_accumulation_steps=rl.grad_accum,
        num_generations=rl.num_generations, max_completion_length=rl.max_new_tokens, max_steps=rl.max_steps,
        learning_rate=rl.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        temperature=rl.temperature, top_p=rl.top_p, top_k=0, beta=rl.kl_coef,
        epsilon=rl.clip_eps_low, epsilon_high=rl.clip_eps_high, max_grad_norm=rl.max_grad_norm,
        loss_type="dapo" if rl.loss_agg == "token" else "grpo", scale_rewards="group" if rl.scale_rewards else "none",
        logging_steps=1, report_to="none", save_strategy="no", seed=recipe.seed, use_cpu=not _cuda(),
        disable_dropout=True, dataloader_num_workers=0, gradient_checkpointing=False,
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def train_trl(recipe, model_path: str, out_dir: str, reward_model_path: str | None = None):
    """Train with GRPOTrainer. Returns ``(trainer, history)``; history: one dict per step with reward_mean,
    reward_std, samples, gen_tokens (mean completion length x samples), step_s."""
    from trl import GRPOTrainer

    from posttrain.models import load_causal_lm, load_tokenizer
    from posttrain.rl.scoring import make_scorer

    tok, _ = load_tokenizer(model_path, recipe.model.chat_template)
    model = load_causal_lm(model_path, recipe.model.dtype)
    scorer = make_scorer(recipe.rl.rewards, reward_model_path)

    def reward(prompts, completions, answer, **_):
        return scorer.score(list(prompts), list(completions), list(answer))[0]

    reward.__name__ = "posttrain_reward"
    from posttrain.models import lora_config

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=_config(recipe, out_dir),
                          train_dataset=_dataset(recipe, tok), processing_class=tok,
                          peft_config=lora_config(recipe.model.lora))
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    return trainer, _history(trainer, recipe, wall)


def _history(trainer, recipe, wall: float) -> list[dict]:
    rl = recipe.rl
    samples = rl.prompts_per_step * rl.num_generations
    rows = [r for r in trainer.state.log_history if "reward" in r]
    step_s = wall / max(len(rows), 1)
    return [{"step": i + 1, "reward_mean": float(r["reward"]), "reward_std": float(r.get("reward_std", 0.0)),
             "samples": samples, "gen_tokens": float(r.get("completions/mean_length", 0.0)) * samples,
             "step_s": float(r.get("step_time", step_s)), "zero_std_groups": float(r.get("frac_reward_zero_std", 0.0)),
             "kl": float(r.get("kl", 0.0)), "entropy": float(r.get("entropy", 0.0)),
             "clip_fraction": float(r.get("clip_ratio/region_mean", 0.0))} for i, r in enumerate(rows)]


def run_trl(recipe, model_path: str, out_dir: str, reward_model_path: str | None = None):
    """The ``rl`` stage on TRL: trains, saves ``<out_dir>/model``, ``metrics.json``, ``manifest.json``; logs to
    MLflow as the nested ``rl`` run. Returns a ``StageResult``."""
    from posttrain import tracking
    from posttrain.artifacts import atomic_dir, sha256_tree, write_json_atomic
    from posttrain.models import save_model
    from posttrain.stages import StageResult

    t0 = time.time()
    out = Path(out_dir)
    with tracking.stage_run(recipe.tracking.uri, recipe.tracking.experiment, "rl",
                            params={"rl.engine": "trl", "algorithm": recipe.algorithm}) as run_id:
        trainer, hist = train_trl(recipe, model_path, out_dir, reward_model_path)
        for r in hist:
            tracking.log_metrics(r, step=r["step"])
        with atomic_dir(out / "model") as tmp:
            save_model(trainer.model, trainer.processing_class, str(tmp))
        k = max(1, len(hist) // 5)
        summary = {"steps": len(hist), "wall_s": sum(r["step_s"] for r in hist),
                   "reward_final": hist[-1]["reward_mean"] if hist else 0.0,
                   "reward_first_fifth": sum(r["reward_mean"] for r in hist[:k]) / k,
                   "reward_last_fifth": sum(r["reward_mean"] for r in hist[-k:]) / k}
        tracking.log_metrics({f"summary/{k_}": v for k_, v in summary.items()})
    write_json_atomic(out / "metrics.json", {"summary": summary, "history": hist, "mlflow_run_id": run_id,
                                             "engine": "trl"})
    metrics = {k_: float(v) for k_, v in summary.items()}
    inputs = {"model": sha256_tree(model_path) if Path(model_path).exists() else model_path}
    write_json_atomic(out / "manifest.json", {"stage": "rl", "recipe_hash": recipe.hash(), "inputs": inputs,
                                              "metrics": metrics})
    return StageResult(stage="rl", metrics=metrics, artifacts={"model": str(out / "model")}, wall_s=time.time() - t0,
                       mlflow_run_id=run_id, notes=["engine=trl (TRL GRPOTrainer)"])
