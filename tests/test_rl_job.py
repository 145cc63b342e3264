"""Real 2-process gloo jobs (1 learner + 1 actor, torchrun) on stories260K.

Learnable task: GSM8K prompts, reward 1 when the completion contains "!" (rl.rewards.keyword; correctness and
format weights 0). stories260K writes dialogue, so about 20% of 16-token completions contain "!" at the start;
GRPO with lr 3e-3 pushes it to nearly every completion within ~10 steps. Asserted margin: the mean reward of the
last fifth of the steps beats the first fifth by at least 0.3 (fixed seed 0).
"""

import json
from pathlib import Path

import pytest

from posttrain.errors import JobError
from posttrain.recipe import validate_recipe


def _recipe(tmp_path, stories260k, shared_data, **rl):
    raw = {
        "name": "rl-job-test", "seed": 0, "algorithm": "grpo",
        "model": {"name_or_path": stories260k, "max_seq_len": 128},
        "data": {"prompts": {"source": str(shared_data / "gsm8k/train.jsonl"), "format": "gsm8k", "max_rows": 200}},
        "sft": {"enabled": False}, "reward": {"enabled": False},
        "rl": {"mode": "async", "max_steps": 15, "prompts_per_step": 4, "num_generations": 4, "max_new_tokens": 16,
               "learning_rate": 3e-3, "max_staleness": 1, "collective_timeout_s": 120,
               "rewards": {"correctness": 0.0, "format": 0.0, "keyword": "!"}, **rl},
        "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "rl-test"},
    }
    return validate_recipe(raw)


@pytest.mark.timeout(300)
def test_async_job_learns_and_syncs_weights(tmp_path, stories260k, shared_data):
    from posttrain.rl.launch import run_job

    recipe = _recipe(tmp_path, stories260k, shared_data)
    out = tmp_path / "rl"
    result = run_job(recipe, stories260k, str(out))
    data = json.loads((out / "metrics.json").read_text())
    hist, summary = data["history"], data["summary"]
    assert len(hist) == 15 and summary["steps"] == 15
    # learning: last fifth beats first fifth by >= 0.3 on the keyword reward
    assert summary["reward_last_fifth"] - summary["reward_first_fifth"] >= 0.3, summary
    # staleness bounded by the rule, nothing needed dropping
    assert max(r["staleness_max"] for r in hist) <= 1 and summary["dropped"] == 0
    # weight sync: an actor batch generated with version v >= 1 carries the probe log-prob of the learner's
    # version-v weights, and that differs from the version-0 probe (the sync changed the actor's outputs)
    probes = {int(v): p for r in hist for v, p in r["actor_probes"]}
    learner_probe = {r["policy_version"]: r["learner_probe"] for r in hist}
    synced = [v for v in probes if v >= 1]
    assert 0 in probes and synced
    for v in synced:
        assert probes[v] == pytest.approx(learner_probe[v], abs=1e-4)
    assert abs(probes[max(synced)] - probes[0]) > 1e-3
    # outputs: full HF model dir, manifest, StageResult
    assert (out / "model" / "config.json").is_file() and any((out / "model").glob("*.safetensors"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "rl" and manifest["recipe_hash"] == recipe.hash()
    assert result.artifacts["model"] == str(out / "model") and result.mlflow_run_id == data["mlflow_run_id"]
    assert all(r["sync_ms"] > 0 for r in hist)


@pytest.mark.timeout(300)
def test_failing_rank_raises_job_error_naming_it(tmp_path, stories260k, shared_data):
    """The actor (rank 1) cannot load its reward model; the job must fail naming rank 1 and the error."""
    from posttrain.rl.launch import run_job

    recipe = _recipe(tmp_path, stories260k, shared_data, max_steps=3)
    raw = json.loads(recipe.to_json())
    raw["rl"]["rewards"]["reward_model"] = 1.0
    raw["reward"]["enabled"] = True
    raw["data"]["preference"] = {"source": str(shared_data / "hh_rlhf/helpful-base/test.jsonl.gz"), "format": "hh_rlhf"}
    recipe = validate_recipe(raw)
    missing = str(tmp_path / "no-such-reward-model")
    with pytest.raises(JobError) as err:
        run_job(recipe, stories260k, str(tmp_path / "rl"), reward_model_path=missing)
    msg = str(err.value)
    assert "rank 1 (actor)" in msg and "ModelLoadError" in msg and "no-such-reward-model" in msg
    assert not (Path(tmp_path) / "rl" / "model").exists()


@pytest.mark.timeout(300)
def test_two_learners_take_identical_steps(tmp_path, stories260k, shared_data):
    """2 learners + 2 actors: each learner trains on its own actors' rollouts, gradients are summed over the
    learner group, so the learners' parameters stay identical; the step covers all prompts_per_step groups."""
    from posttrain.rl.launch import run_job

    recipe = _recipe(tmp_path, stories260k, shared_data, max_steps=3, num_learners=2, num_actors=2)
    run_job(recipe, stories260k, str(tmp_path / "rl"))
    hist = json.loads((tmp_path / "rl" / "metrics.json").read_text())["history"]
    assert len(hist) == 3
    assert all(r["samples"] == 4 * 4 for r in hist)
    assert all(r["learner_param_spread"] == 0.0 for r in hist)
    assert all(r["grad_norm"] > 0 for r in hist)
