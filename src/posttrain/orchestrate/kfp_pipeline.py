"""The posttrain pipeline, defined once with kfp's DSL.

    plan -> base -> sft -> reward -> If(branch == "rl"):  rl  -> evaluate -> register -> gate -> push
                                     If(branch == "dpo"): dpo -> evaluate -> register -> gate -> push

Each branch carries its own evaluate/register/gate/push tail, so no ``dsl.OneOf`` is needed (it does not run
under ``kfp.local``). Runs locally through ``kfp.local.SubprocessRunner(use_venv=False)`` (see ``local.py``) and on
a cluster after ``compile_pipeline``. The run form's parameters are the pipeline function's arguments; their
descriptions come from its docstring.
"""


import json
from pathlib import Path

from posttrain.recipe import Recipe

PIPELINE_NAME = "posttrain"


def _tail(c, plan_task, trained, base_task, reward_task, reference):
    """evaluate -> register -> gate -> push after a trained model (one copy per branch)."""
    rj, parent = plan_task.outputs["recipe_json"], plan_task.outputs["parent_run_id"]
    ev = c.evaluate(recipe_json=rj, model=trained.outputs["Output"], base_model=base_task.outputs["Output"],
                    reward_model=reward_task.outputs["Output"], reference=reference or "", parent_run_id=parent)
    ev.set_display_name("evaluate")
    reg = c.register(recipe_json=rj, model=trained.outputs["Output"], evaluation=ev.outputs["Output"], parent_run_id=parent)
    gt = c.gate(recipe_json=rj, registration=reg.outputs["Output"], evaluation=ev.outputs["Output"], parent_run_id=parent)
    c.push(recipe_json=rj, model=trained.outputs["Output"], evaluation=ev.outputs["Output"],
           registration=reg.outputs["Output"], gate_result=gt.outputs["Output"], parent_run_id=parent)


def build_pipeline(default_recipe: Recipe):
    """Return the ``@dsl.pipeline`` function whose defaults come from ``default_recipe``."""
    from kfp import dsl

    from posttrain.orchestrate import kfp_components as c

    default_json = default_recipe.to_json()

    @dsl.pipeline(name=PIPELINE_NAME, description="LLM post-training: SFT, reward model, async RL or DPO, evaluate, register, gate, push.")
    def posttrain_pipeline(recipe_json: str = default_json, algorithm: str = default_recipe.algorithm,
                           model_name_or_path: str = default_recipe.model.name_or_path,
                           overrides: list = [], parent_run_id: str = ""):  # noqa: B006 (KFP default)
        """Run the posttrain pipeline.

        Args:
            recipe_json: The full recipe as JSON (see `posttrain validate --schema`); the fields below override it.
            algorithm: Branch after the reward model: grpo, rloo or ppo (async RL) or dpo. Required.
            model_name_or_path: Base model: an HF model id or a path visible to the pipeline's pods.
            overrides: Recipe overrides as a list of "dotted.key=value" strings, e.g. ["rl.max_steps=50"].
            parent_run_id: MLflow parent run to nest stage runs under; empty = a new run.
        """
        p = c.plan(recipe_json=recipe_json, algorithm=algorithm, model_name_or_path=model_name_or_path,
                   overrides=overrides, parent_run_id=parent_run_id)
        rj, parent = p.outputs["recipe_json"], p.outputs["parent_run_id"]
        b = c.base(recipe_json=rj, parent_run_id=parent)
        s = c.sft(recipe_json=rj, model=b.outputs["Output"], parent_run_id=parent)
        r = c.reward(recipe_json=rj, model=s.outputs["Output"], parent_run_id=parent)
        # Branch on the pipeline parameter (kfp.local cannot resolve a task output in a condition); ``plan``
        # applies the same parameter to the recipe, so the branch and the recipe agree.
        with dsl.If(algorithm != "dpo", name="rl-branch"):
            t = c.rl(recipe_json=rj, model=s.outputs["Output"], reward_model=r.outputs["Output"], parent_run_id=parent)
            _tail(c, p, t, b, r, reference=None)
        with dsl.If(algorithm == "dpo", name="dpo-branch"):
            d = c.dpo(recipe_json=rj, model=s.outputs["Output"], parent_run_id=parent)
            _tail(c, p, d, b, r, reference=s.outputs["Output"])

    return posttrain_pipeline


def compile_pipeline(recipe: Recipe, output_path) -> Path:
    """Compile the pipeline (defaults from ``recipe``) to KFP IR YAML at ``output_path``; returns the path."""
    from kfp import compiler

    out = Path(output_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(recipe), package_path=str(out))
    return out


def recipe_for_pipeline(recipe: Recipe) -> str:
    """The recipe JSON passed to the pipeline (paths as the caller resolved them)."""
    return json.dumps(recipe.model_dump(mode="json"), sort_keys=True)


def compile_components(out_dir) -> list[Path]:
    """Write each component's spec to ``<out_dir>/<step>/component.yaml`` (the committed ``components/``)."""
    from kfp import compiler

    from posttrain.orchestrate import kfp_components as c

    written = []
    for name, comp in {"plan": c.plan, **c.STAGE_COMPONENTS}.items():
        path = Path(out_dir) / name / "component.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(comp, package_path=str(path))
        written.append(path)
    return written
