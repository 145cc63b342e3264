"""Per-rank entry point of the RL job: ``python -m posttrain.rl.job --recipe R.json --model M --out D``.

Started by torchrun (``launch.py``), one process per rank. Ranks ``0 .. num_learners-1`` are learners, the rest
actors. Process groups: the default group (gloo on CPU, NCCL on GPU), a gloo group of all ranks for rollout
messages, and a weights group (learner 0 + actors) for the weight broadcast. Every collective times out after
``rl.collective_timeout_s``. With several learners, each trains on the rollouts of its own actors and the
gradients are summed over the learner group (loss denominators are global), so all learners take the same step;
learner 0 broadcasts weights, logs and saves. A rank that fails writes ``<out>/.ranks/rank<N>.json`` (role, error,
traceback)
before exiting non-zero, so the launcher can say which rank died and what it said.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _parse(argv):
    p = argparse.ArgumentParser(prog="posttrain.rl.job")
    p.add_argument("--recipe", required=True, help="recipe JSON file (Recipe.to_json)")
    p.add_argument("--model", required=True, help="policy model directory")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--reward-model", default=None, help="reward model directory (rl.rewards.reward_model > 0)")
    return p.parse_args(argv)


def init_groups(recipe, device: str):
    """Initialise torch.distributed and build the ``JobContext``. Raises ``JobError`` on a bad world size."""
    from datetime import timedelta

    import torch.distributed as dist

    from posttrain.errors import JobError
    from posttrain.rl.context import JobContext

    rl = recipe.rl
    timeout = timedelta(seconds=rl.collective_timeout_s)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != rl.num_learners + rl.num_actors:
        raise JobError(f"world size {world} != rl.num_learners + rl.num_actors = {rl.num_learners + rl.num_actors}")
    if rl.num_actors % rl.num_learners:
        raise JobError(f"rl.num_actors={rl.num_actors} must be a multiple of rl.num_learners={rl.num_learners} "
                       "(each learner trains on the rollouts of its own actors)")
    learners, actors = list(range(rl.num_learners)), list(range(rl.num_learners, world))
    rollout = dist.new_group(backend="gloo", timeout=timeout)
    weights = dist.new_group(ranks=[learners[0]] + actors, timeout=timeout)
    learner_group = dist.new_group(ranks=learners, timeout=timeout)
    return JobContext(rank=rank, world_size=world, learner_ranks=learners, actor_ranks=actors, recipe=recipe,
                      model_path="", out_dir="", device=device, rollout_group=rollout, weights_group=weights,
                      learner_group=learner_group)


def _device(rank_local: int) -> str:
    import torch

    if torch.cuda.is_available():
        dev = rank_local % torch.cuda.device_count()  # ranks share GPUs when there are fewer GPUs than ranks
        torch.cuda.set_device(dev)
        return f"cuda:{dev}"
    return "cpu"


def main(argv=None) -> int:
    import torch

    from posttrain.recipe import Recipe

    args = _parse(argv)
    rank, role = int(os.environ.get("RANK", "0")), "unknown"
    try:
        recipe = Recipe.from_json(Path(args.recipe).read_text())
        torch.set_num_threads(recipe.rl.threads_per_rank)
        ctx = init_groups(recipe, _device(int(os.environ.get("LOCAL_RANK", "0"))))
        ctx.model_path, ctx.out_dir, ctx.reward_model_path = args.model, args.out, args.reward_model
        role = ctx.role
        if role == "learner":
            from posttrain.rl.learner_loop import run_learner

            run_learner(ctx)
        else:
            from posttrain.rl.actor import run_actor

            run_actor(ctx)
        import torch.distributed as dist

        dist.barrier(group=ctx.rollout_group)
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - recorded for the launcher, then re-raised
        from posttrain.rl.failures import record_failure

        record_failure(args.out, rank, role, exc)
        print(f"[rank {rank} {role}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
