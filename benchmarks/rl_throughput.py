"""RL throughput benchmark: TRL's GRPOTrainer vs our engine in sync mode vs async mode.

Same model, prompts, batch (prompts_per_step x num_generations), completion length, learning rate, reward and
number of samples; run one after another in one invocation. Prints samples/s and generated tokens/s of each,
the ratios async/sync and async/TRL, and reward vs samples for all three.

Throughput is measured over the training steps after the first (the first also loads models and starts the
processes): our engine from its per-step wall times, TRL from its logged ``step_time``.

Cores: every process gets ``--threads`` torch threads (default 1): TRL's one process, and each rank (learner,
actor) of sync and async mode. Sync mode's ranks take turns; async mode's run at once on separate cores, which
is the point of it (on GPUs: separate devices). On a CPU shared with other work, more threads per process only
adds OpenMP contention (measured here: 2 threads per rank made sync mode 2-4x slower per step).

    python benchmarks/rl_throughput.py                       # stories260K on CPU (this machine)
    python benchmarks/rl_throughput.py --model-config qwen2.5-0.5b --random-init --device cuda --steps 20

``--model-config NAME --random-init`` builds a randomly initialised model of that architecture (offline; the
vocabulary is the tokenizer's, default stories260K's), saved to a temp directory. ``--device cuda`` only checks a
GPU is present: the job puts each rank on a GPU by itself (NCCL for weights, gloo for rollouts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORIES = ROOT.parent / "shared" / "data" / "stories260K" / "hf"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"

MODEL_CONFIGS = {  # architecture shapes only (no weights), for --random-init
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "llama-tiny": dict(model_type="llama", hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024),
}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(STORIES), help="model directory (default stories260K)")
    p.add_argument("--model-config", choices=sorted(MODEL_CONFIGS), default=None)
    p.add_argument("--random-init", action="store_true", help="random weights of --model-config's shape")
    p.add_argument("--tokenizer", default=str(STORIES), help="tokenizer for --random-init models")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--prompts", default=str(GSM8K))
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=160)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--keyword", default="!", help="reward: 1 if the completion contains this string")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (TRL, and each rank)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", default=[], choices=["trl", "sync", "async"])
    p.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    return p.parse_args(argv)


def build_model(args, work: Path) -> str:
    """The model path to benchmark: --model, or a random-init --model-config saved under ``work``."""
    if not args.model_config:
        return args.model
    if not args.random_init:
        sys.exit("--model-config needs --random-init (no weights are downloaded)")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    spec = dict(MODEL_CONFIGS[args.model_config])
    cfg = AutoConfig.for_model(spec.pop("model_type"), vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                               eos_token_id=tok.eos_token_id, **spec)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(cfg)
    out = work / f"{args.model_config}-random"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def recipe_for(args, model: str, work: Path, engine: str, mode: str, threads: int):
    from posttrain.recipe import validate_recipe

    return validate_recipe({
        "name": f"bench-{engine}-{mode}", "seed": args.seed, "algorithm": "grpo",
        "model": {"name_or_path": model, "max_seq_len": args.max_seq_len},
        "data": {"prompts": {"source": args.prompts, "format": "gsm8k", "max_rows": 400}},
        "sft": {"enabled": False}, "reward": {"enabled": False},
        "rl": {"engine": engine, "mode": mode, "max_steps": args.steps, "prompts_per_step": args.prompts_per_step,
               "num_generations": args.num_generations, "max_new_tokens": args.max_new_tokens,
               "learning_rate": args.lr, "max_staleness": args.max_staleness, "threads_per_rank": threads,
               "rewards": {"correctness": 0.0, "format": 0.0, "keyword": args.keyword}},
        "tracking": {"uri": f"sqlite:///{work}/mlflow.db", "experiment": "rl-bench"},
    })


def run_ours(args, model, work, mode) -> list[dict]:
    from posttrain.rl.launch import run_job

    out = work / mode
    run_job(recipe_for(args, model, work, "posttrain", mode, args.threads), model, str(out))
    return json.loads((out / "metrics.json").read_text())["history"]


def run_trl(args, model, work) -> list[dict]:
    import torch

    from posttrain.rl.trl_engine import train_trl

    torch.set_num_threads(args.threads)
    _, hist = train_trl(recipe_for(args, model, work, "trl", "sync", args.threads), model, str(work / "trl"))
    return hist


def throughput(hist: list[dict]) -> tuple[float, float]:
    steady = hist[1:] or hist
    secs = max(sum(r["step_s"] for r in steady), 1e-9)
    return sum(r["samples"] for r in steady) / secs, sum(r["gen_tokens"] for r in steady) / secs


def report(results: dict[str, list[dict]]) -> str:
    lines = ["", f"{'engine':<8} {'steps':>5} {'samples/s':>10} {'gen tok/s':>10} {'reward 1st 1/5':>15} "
             f"{'reward last 1/5':>16}"]
    tp = {}
    for name, hist in results.items():
        s, t = throughput(hist)
        tp[name] = s
        k = max(1, len(hist) // 5)
        first = sum(r["reward_mean"] for r in hist[:k]) / k
        last = sum(r["reward_mean"] for r in hist[-k:]) / k
        lines.append(f"{name:<8} {len(hist):>5} {s:>10.2f} {t:>10.1f} {first:>15.3f} {last:>16.3f}")
    if "async" in tp and "sync" in tp:
        lines.append(f"async/sync samples/s: {tp['async'] / tp['sync']:.2f}x")
    if "async" in tp and "trl" in tp:
        lines.append(f"async/TRL  samples/s: {tp['async'] / tp['trl']:.2f}x")
    lines += ["", "reward vs samples (mean reward of the step that reached each sample count):"]
    n = max(len(h) for h in results.values())
    marks = sorted({max(0, round(n * f) - 1) for f in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)})
    lines.append(f"{'samples':>8} " + " ".join(f"{k:>8}" for k in results))
    for i in marks:
        samples = sum(r["samples"] for r in next(iter(results.values()))[: i + 1])
        cells = [f"{h[i]['reward_mean']:>8.3f}" if i < len(h) else f"{'-':>8}" for h in results.values()]
        lines.append(f"{samples:>8} " + " ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA GPU visible")
    work = Path(args.out or tempfile.mkdtemp(prefix="rl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    model = build_model(args, work)
    results: dict[str, list[dict]] = {}
    for name in ("trl", "sync", "async"):
        if name in args.skip:
            continue
        t0 = time.time()
        results[name] = run_trl(args, model, work) if name == "trl" else run_ours(args, model, work, name)
        print(f"[bench] {name} done in {time.time() - t0:.0f} s", flush=True)
    text = report(results)
    print(text)
    (work / "report.txt").write_text(text)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
