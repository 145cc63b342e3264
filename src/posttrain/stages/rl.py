"""Pipeline stage ``rl``: the async actor/learner RL job (or TRL's GRPOTrainer when ``rl.engine == 'trl'``).

``inputs``: ``{"model": <policy dir>, optional "reward_model": <reward model dir>}``. Launches the job with
torchrun (``posttrain.rl.launch``), waits, streams its logs; writes ``<out_dir>/model`` (full HF dir),
``<out_dir>/metrics.json`` and ``<out_dir>/manifest.json``. Raises ``JobError`` naming the failed rank.
"""

from __future__ import annotations

from posttrain.errors import StageError


def run(recipe, inputs: dict[str, str], out_dir: str):
    """Run the RL stage. Returns a ``StageResult``. Raises ``StageError`` without a policy model input."""
    model = inputs.get("model") or recipe.model.name_or_path
    if not model:
        raise StageError("stage rl: inputs['model'] is missing; pass the SFT (or base) model directory")
    reward_model = inputs.get("reward_model") if recipe.rl.rewards.reward_model > 0 else None
    if recipe.rl.engine == "trl":
        from posttrain.rl.trl_engine import run_trl

        return run_trl(recipe, model, out_dir, reward_model_path=reward_model)
    from posttrain.rl.launch import run_job

    return run_job(recipe, model, out_dir, reward_model_path=reward_model)
