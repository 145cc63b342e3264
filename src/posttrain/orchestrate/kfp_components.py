"""KFP lightweight components: each body calls ``posttrain.orchestrate.steps.execute`` for one stage.

Imported only when a pipeline is built (kfp is a heavy import). The component bodies are shipped as source to
the KFP executor, so each one imports what it needs inside. ``BASE_IMAGE`` is our pipeline image (images/);
locally ``kfp.local.SubprocessRunner(use_venv=False)`` runs the bodies with this interpreter instead.
"""


import os
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Output

BASE_IMAGE = os.environ.get("POSTTRAIN_IMAGE", "ghcr.io/posttrain/posttrain-python-train:0.1.0")


@dsl.component(base_image=BASE_IMAGE)
def plan(recipe_json: str, algorithm: str, model_name_or_path: str, overrides: list,
         parent_run_id: str) -> NamedTuple("Plan", [("recipe_json", str), ("branch", str), ("parent_run_id", str)]):
    """Apply the run form's overrides to the recipe, validate it, and open the MLflow parent run if none."""
    from posttrain.orchestrate.steps import plan_run

    return plan_run(recipe_json, algorithm, model_name_or_path, overrides, parent_run_id)


@dsl.component(base_image=BASE_IMAGE)
def base(recipe_json: str, parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Load and repair the base model; baseline evaluation."""
    from posttrain.orchestrate.steps import component_body

    return component_body("base", recipe_json, {}, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def sft(recipe_json: str, model: str, parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Supervised fine-tuning (TRL SFTTrainer)."""
    from posttrain.orchestrate.steps import component_body

    return component_body("sft", recipe_json, {"model": model}, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def reward(recipe_json: str, model: str, parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Reward model on preference pairs (TRL RewardTrainer)."""
    from posttrain.orchestrate.steps import component_body

    return component_body("reward", recipe_json, {"model": model}, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def rl(recipe_json: str, model: str, reward_model: str, parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Asynchronous RL (GRPO | RLOO | PPO): launches the actor/learner job and waits for it."""
    from posttrain.orchestrate.steps import component_body

    return component_body("rl", recipe_json, {"model": model, "reward_model": reward_model}, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def dpo(recipe_json: str, model: str, parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Direct preference optimisation (TRL DPOTrainer)."""
    from posttrain.orchestrate.steps import component_body

    return component_body("dpo", recipe_json, {"model": model}, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def evaluate(recipe_json: str, model: str, base_model: str, reward_model: str, reference: str,
             parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Held-out evaluation of the final and the base model."""
    from posttrain.orchestrate.steps import component_body

    inputs = {"model": model, "base_model": base_model, "reward_model": reward_model, "reference": reference}
    return component_body("evaluate", recipe_json, inputs, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def register(recipe_json: str, model: str, evaluation: str, parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Register the model in MLflow with alias 'candidate'."""
    from posttrain.orchestrate.steps import component_body

    return component_body("register", recipe_json, {"model": model, "evaluation": evaluation}, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def gate(recipe_json: str, registration: str, evaluation: str, parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Move 'candidate' to 'staging' when the evaluation passes the recipe's gate."""
    from posttrain.orchestrate.steps import component_body

    inputs = {"registration": registration, "evaluation": evaluation}
    return component_body("gate", recipe_json, inputs, parent_run_id, metrics)


@dsl.component(base_image=BASE_IMAGE)
def push(recipe_json: str, model: str, evaluation: str, registration: str, gate_result: str,
         parent_run_id: str, metrics: Output[Metrics]) -> str:
    """Push the model, its card and a manifest to the recipe's destination."""
    from posttrain.orchestrate.steps import component_body

    inputs = {"model": model, "evaluation": evaluation, "registration": registration, "gate": gate_result}
    return component_body("push", recipe_json, inputs, parent_run_id, metrics)


STAGE_COMPONENTS = {"base": base, "sft": sft, "reward": reward, "rl": rl, "dpo": dpo, "evaluate": evaluate,
                    "register": register, "gate": gate, "push": push}
