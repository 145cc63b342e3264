"""Launch description and failure reporting (no processes started)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from posttrain.recipe import validate_recipe
from posttrain.rl.failures import read_failures, record_failure
from posttrain.rl.launch import build_launch_spec, failure_message


def _recipe(**rl):
    return validate_recipe({"name": "t", "model": {"name_or_path": "/m"}, "sft": {"enabled": False},
                            "reward": {"enabled": False},
                            "data": {"prompts": {"source": "/p.jsonl", "format": "gsm8k"}}, "rl": rl})


def test_launch_spec_is_plain_data_with_roles_and_torchrun_command(tmp_path):
    spec = build_launch_spec(_recipe(num_actors=2, threads_per_rank=3, collective_timeout_s=30), "/m", str(tmp_path))
    assert spec.roles == {0: "learner", 1: "actor", 2: "actor"} and spec.nproc_per_node == 3
    argv = spec.torchrun_argv()
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"] and "--nproc-per-node=3" in argv
    assert argv[argv.index("-m", 3):][:2] == ["-m", "posttrain.rl.job"]
    assert spec.env["OMP_NUM_THREADS"] == "3" and spec.to_dict()["collective_timeout_s"] == 30
    assert (tmp_path / ".job" / "recipe.json").is_file()


def test_root_cause_is_the_first_hand_error_not_the_peer_that_saw_the_connection_drop(tmp_path):
    record_failure(str(tmp_path), 0, "learner", RuntimeError("Connection closed by peer [127.0.0.1]:1"))
    record_failure(str(tmp_path), 1, "actor", ValueError("bad reward model path /x"), where="main")
    assert [i["rank"] for i in read_failures(str(tmp_path))] == [1, 0]
    spec = build_launch_spec(_recipe(num_actors=1), "/m", str(tmp_path))
    msg = failure_message(spec, 1, [])
    assert msg.startswith("RL job 't-rl' failed: rank 1 (actor) raised ValueError: bad reward model path /x")
    assert "then rank 0 (learner)" in msg and "collective_timeout_s" not in msg


def test_timeout_message_names_the_setting(tmp_path):
    record_failure(str(tmp_path), 1, "actor", RuntimeError("Timed out waiting 1000ms for recv"), where="weights")
    spec = build_launch_spec(_recipe(collective_timeout_s=1), "/m", str(tmp_path))
    msg = failure_message(spec, 1, [])
    assert "rank 1 (actor) in weights raised RuntimeError: Timed out" in msg
    assert "rl.collective_timeout_s=1 s" in msg


def test_killed_rank_without_a_record_is_named_from_torchruns_root_cause(tmp_path):
    tail = ["Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
            "  exitcode  : -9 (pid: 123)  (SIGKILL)"]
    spec = build_launch_spec(_recipe(), "/m", str(tmp_path))
    assert ": rank 1 (actor) exited with -9 (pid: 123)  (SIGKILL)" in failure_message(spec, 1, tail)


def test_standalone_defaults_never_touch_the_pipeline_rl_step(tmp_path):
    """`posttrain rl` must not overwrite the pipeline's rl output, and starts from the SFT model once it exists."""
    from posttrain.recipe import load_recipe
    from posttrain.rl.launch import standalone_paths

    recipe = load_recipe(ROOT / "pipelines/recipes/tiny-cpu.yaml", [f"output_dir={tmp_path}"])
    model, out = standalone_paths(recipe)
    assert model == recipe.model.name_or_path
    assert out == str(tmp_path / "tiny-cpu" / "rl-standalone")
    sft = tmp_path / "tiny-cpu" / "sft" / "model"
    sft.mkdir(parents=True)
    (sft / "config.json").write_text("{}")
    assert standalone_paths(recipe)[0] == str(sft)
    assert standalone_paths(recipe, out_dir="x", model_path="m") == ("m", "x")
