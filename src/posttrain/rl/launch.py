"""Launch the RL job: a data description (``LaunchSpec``) and a local torchrun launcher.

``LaunchSpec`` holds everything a launcher needs (ranks, roles, entry command, environment, resources), as
plain data, so a Kubernetes launcher can turn it into a TrainJob (one pod per node, ``torchrun`` in each)
without touching the engine. ``launch_local`` runs it with ``python -m torch.distributed.run`` on this machine,
streams every rank's output, and raises ``JobError`` naming the failed rank and what it said.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from posttrain.errors import JobError


@dataclass
class LaunchSpec:
    """One RL job. ``command`` is the per-rank entry (run by torchrun on every rank); ``roles[rank]`` is
    'learner' or 'actor'; ``resources`` per rank: ``cpu`` (cores), ``gpu`` (count), ``memory_gib``."""

    name: str
    nproc_per_node: int
    nnodes: int
    roles: dict[int, str]
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)
    out_dir: str = ""
    max_steps: int = 0
    collective_timeout_s: float = 600.0

    def torchrun_argv(self) -> list[str]:
        """The local launch command: ``python -m torch.distributed.run --standalone ... -m posttrain.rl.job ...``."""
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nnodes={self.nnodes}",
                f"--nproc-per-node={self.nproc_per_node}", *self.command]

    def to_dict(self) -> dict:
        return asdict(self)


def build_launch_spec(recipe, model_path: str, out_dir: str, reward_model_path: str | None = None) -> LaunchSpec:
    """Describe the job for ``recipe`` (writes the recipe JSON to ``<out_dir>/.job/recipe.json``)."""
    rl = recipe.rl
    if rl.num_actors % rl.num_learners:
        raise JobError(f"rl.num_actors={rl.num_actors}: must be a multiple of rl.num_learners={rl.num_learners} "
                       "(each learner trains on the rollouts of its own actors); change one of them")
    job_dir = Path(out_dir) / ".job"
    job_dir.mkdir(parents=True, exist_ok=True)
    recipe_file = job_dir / "recipe.json"
    recipe_file.write_text(recipe.to_json())
    n = rl.num_learners + rl.num_actors
    cmd = ["-m", "posttrain.rl.job", "--recipe", str(recipe_file), "--model", str(model_path), "--out", str(out_dir)]
    if reward_model_path:
        cmd += ["--reward-model", str(reward_model_path)]
    roles = {r: ("learner" if r < rl.num_learners else "actor") for r in range(n)}
    env = {"OMP_NUM_THREADS": str(rl.threads_per_rank), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    return LaunchSpec(name=f"{recipe.name}-rl", nproc_per_node=n, nnodes=1, roles=roles, command=cmd, env=env,
                      resources={"cpu": float(rl.threads_per_rank), "gpu": 0.0, "memory_gib": 4.0},
                      out_dir=str(out_dir), max_steps=rl.max_steps, collective_timeout_s=rl.collective_timeout_s)


def launch_local(spec: LaunchSpec, echo: bool = True) -> None:
    """Run ``spec`` with torchrun and wait. Streams output (prefixed by rank when torchrun tees).

    Raises ``JobError`` naming the failed rank, its role and its error message.
    """
    from posttrain.rl.failures import clear_failures

    clear_failures(spec.out_dir)
    env = {**os.environ, **spec.env}
    tail: deque[str] = deque(maxlen=60)
    proc = subprocess.Popen(spec.torchrun_argv(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True, bufsize=1)
    with _progress(spec, echo) as show:
        for line in proc.stdout or []:
            tail.append(line.rstrip("\n"))
            show(line.rstrip("\n"))
    rc = proc.wait()
    if rc != 0:
        raise JobError(failure_message(spec, rc, list(tail)))


_STEP = re.compile(r"\[rl\] step\s+(\d+)")


@contextlib.contextmanager
def _progress(spec: LaunchSpec, echo: bool):
    """Yields ``show(line)``: prints job output above a progress bar advanced by the ``[rl] step N`` lines."""
    from tqdm import tqdm

    bar = tqdm(total=spec.max_steps or None, desc=spec.name, unit="step", dynamic_ncols=True, disable=not echo,
               file=sys.stderr)

    def show(line: str) -> None:
        if echo:
            bar.write(line, file=sys.stdout)
        m = _STEP.search(line)
        if m:
            bar.update(int(m.group(1)) - bar.n)

    try:
        yield show
    finally:
        bar.close()


def failure_message(spec: LaunchSpec, rc: int, tail: list[str]) -> str:
    """Which rank failed first and what it said (``failures.read_failures``), else torchrun's root cause."""
    from posttrain.rl.failures import read_failures

    infos = read_failures(spec.out_dir)
    if infos:
        first = infos[0]
        where = "" if first.get("where", "main") == "main" else f" in {first['where']}"
        others = "".join(f"; then rank {i['rank']} ({i['role']}): {i['error'][:160]}" for i in infos[1:3])
        hint = (f" [a collective exceeded rl.collective_timeout_s={spec.collective_timeout_s:g} s; raise it if a "
                "step or a generation batch legitimately takes longer]") if "Timed out" in first["error"] else ""
        return (f"RL job {spec.name!r} failed: rank {first['rank']} ({first['role']}){where} raised {first['error']}"
                f"{hint}{others}\n--- rank {first['rank']} traceback ---\n{first['traceback'][-3000:]}")
    cause = _torchrun_root_cause(spec, tail)
    return (f"RL job {spec.name!r} failed (torchrun exit code {rc}){cause} and no rank recorded an error (killed, "
            "out of memory, or a native crash)\n--- last output ---\n" + "\n".join(tail[-30:]))


def _torchrun_root_cause(spec: LaunchSpec, tail: list[str]) -> str:
    """``': rank N (role) exitcode E'`` from torchrun's "Root Cause" block, or ''."""
    text = "\n".join(tail)
    block = text.split("Root Cause", 1)[-1] if "Root Cause" in text else ""
    rank = re.search(r"rank\s*:\s*(\d+)", block)
    code = re.search(r"exitcode\s*:\s*(-?\d+)[^\n]*", block)
    if not rank:
        return ""
    role = spec.roles.get(int(rank.group(1)), "?")
    return f": rank {rank.group(1)} ({role}) exited with {code.group(0).split(':', 1)[1].strip() if code else '?'}"


def run_job(recipe, model_path: str, out_dir: str, reward_model_path: str | None = None):
    """Launch the job, then write ``<out_dir>/manifest.json`` and return a ``StageResult``.

    Raises ``JobError`` if any rank fails, ``ModelLoadError`` if ``model_path`` is not a directory.
    """
    from posttrain.artifacts import sha256_tree, write_json_atomic
    from posttrain.errors import ModelLoadError
    from posttrain.stages import StageResult

    if str(model_path).startswith((".", "/", "~")) and not Path(model_path).is_dir():
        raise ModelLoadError(f"RL policy model {model_path!r} is not a directory; pass a saved HF model directory "
                             "(an earlier stage's <out>/model) or a hub id")
    t0 = time.time()
    spec = build_launch_spec(recipe, model_path, out_dir, reward_model_path)
    launch_local(spec)
    data = json.loads((Path(out_dir) / "metrics.json").read_text())
    metrics = {k: float(v) for k, v in data["summary"].items() if isinstance(v, (int, float))}  # not health_warnings
    inputs = {"model": sha256_tree(model_path) if Path(model_path).exists() else str(model_path)}
    if reward_model_path:
        inputs["reward_model"] = sha256_tree(reward_model_path)
    result = StageResult(stage="rl", metrics=metrics, artifacts={"model": str(Path(out_dir) / "model"),
                         "metrics": str(Path(out_dir) / "metrics.json")}, wall_s=time.time() - t0,
                         mlflow_run_id=data.get("mlflow_run_id"),
                         notes=[f"mode={recipe.rl.mode} engine=posttrain algorithm={recipe.algorithm}"])
    write_json_atomic(Path(out_dir) / "manifest.json", {"stage": "rl", "recipe_hash": recipe.hash(),
                      "inputs": inputs, "metrics": metrics, "launch": spec.to_dict()})
    return result


def standalone_paths(recipe, out_dir: str | None = None, model_path: str | None = None) -> tuple[str, str]:
    """(policy path, output dir) for ``posttrain rl``; see ``run_standalone`` for the defaults."""
    run_root = Path(recipe.output_dir) / recipe.name
    sft = run_root / "sft" / "model"
    model = model_path or (str(sft) if (sft / "config.json").is_file() else recipe.model.name_or_path)
    return model, out_dir or str(run_root / "rl-standalone")


def run_standalone(recipe, out_dir: str | None = None, model_path: str | None = None):
    """``posttrain rl RECIPE``: the job on ``model_path`` into ``out_dir``. Dispatches to TRL when ``rl.engine == 'trl'``.

    Defaults never touch the pipeline's own outputs: ``out_dir`` is ``<output_dir>/<name>/rl-standalone`` (not the
    pipeline's ``rl`` step), and the policy starts from the pipeline's SFT model when one exists
    (``<output_dir>/<name>/sft/model``), else from ``model.name_or_path``.
    """
    import logging

    model, out = standalone_paths(recipe, out_dir, model_path)
    logging.getLogger("posttrain").warning("posttrain rl: policy %s -> %s", model, out)
    if recipe.rl.engine == "trl":
        from posttrain.rl.trl_engine import run_trl

        return run_trl(recipe, model, out)
    return run_job(recipe, model, out)
