"""``rl.engine: trl`` — TRL's GRPOTrainer through the rl stage: a full HF model, metrics and a manifest come out,
and the TRL settings mirror ours (one optimizer step per prompts_per_step x num_generations completions)."""

import json

import pytest

from posttrain.recipe import validate_recipe


@pytest.mark.timeout(240)
def test_trl_engine_through_the_rl_stage(tmp_path, stories260k, shared_data):
    from posttrain.stages import rl as rl_stage

    recipe = validate_recipe({
        "name": "rl-trl-test", "model": {"name_or_path": stories260k, "max_seq_len": 96},
        "data": {"prompts": {"source": str(shared_data / "gsm8k/train.jsonl"), "format": "gsm8k", "max_rows": 40}},
        "sft": {"enabled": False}, "reward": {"enabled": False},
        "rl": {"engine": "trl", "max_steps": 2, "prompts_per_step": 2, "num_generations": 2, "max_new_tokens": 8,
               "rewards": {"correctness": 0.0, "format": 0.0, "keyword": " "}},
        "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "rl-trl"},
    })
    out = tmp_path / "rl"
    result = rl_stage.run(recipe, {"model": stories260k}, str(out))
    data = json.loads((out / "metrics.json").read_text())
    assert data["engine"] == "trl" and len(data["history"]) == 2
    assert all(r["samples"] == 4 for r in data["history"])
    # 8 tokens of story text almost always contain a space: the keyword reward is computed by our Scorer
    assert data["history"][0]["reward_mean"] > 0.5
    assert (out / "model" / "config.json").is_file() and result.metrics["steps"] == 2.0
    assert json.loads((out / "manifest.json").read_text())["recipe_hash"] == recipe.hash()
