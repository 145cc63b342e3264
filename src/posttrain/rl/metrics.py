"""Per-step learner metrics: one console line per step + a progress bar, MLflow (learner rank), metrics.json.

Definitions (per learner step, over the wall time since the previous step ended):
- samples/s: completions trained on / step wall seconds; gen_tokens/s: their generated tokens / wall seconds.
  The summary's samples/s and gen_tokens/s leave out step 1 (it also waits for the actors to load).
- actor_busy_pct: actor generation seconds / (generation + waiting) seconds of the batches in this step.
- learner_busy_pct: learner train seconds / step wall seconds (the rest is waiting for rollouts + sync).
- staleness mean/max: learner version - sample version of the trained samples; dropped: cumulative count.
- sync_ms: learner-side weight broadcast time (pack + send), milliseconds.
- health: each row also feeds ``posttrain.monitor.HealthMonitor``; new warnings print as ``[health]`` lines, the
  summary lists them (``health_warnings``, ``health_warning_count``), the MLflow run gets ``health.txt``.
"""

from __future__ import annotations

import contextlib
import time

from posttrain.monitor import HealthMonitor, emit, record_mlflow


def _health_monitor(rl):
    """The training-health monitor for recipe section ``rl``: iw_max is compared with ``tis_cap`` only when TIS
    truncates there; idle-role warnings only in async mode (lock-step roles wait for each other by design)."""
    return HealthMonitor("rl", iw_cap=rl.tis_cap if rl.off_policy_correction == "tis" else None,
                         check_busy=rl.mode == "async")


class StepMeter:
    def __init__(self, ctx, enabled: bool = True):
        """``enabled=False`` (learners other than rank 0): no MLflow run, no output."""
        self.ctx, self.history, self.run_id, self.enabled = ctx, [], None, enabled
        self.t_last = self.t_start = time.perf_counter()
        self.health = _health_monitor(ctx.recipe.rl)

    @contextlib.contextmanager
    def tracking(self):
        """Open the MLflow stage run (nested under $POSTTRAIN_PARENT_RUN_ID). The progress bar is drawn by the
        launcher from the step lines (ranks write to a pipe, not a terminal)."""
        from posttrain import tracking

        if not self.enabled:
            yield self
            return
        r = self.ctx.recipe
        params = {f"rl.{k}": v for k, v in r.rl.model_dump().items() if k != "rewards"}
        params.update({"algorithm": r.algorithm, "recipe_hash": r.hash(), "actors": len(self.ctx.actor_ranks)})
        with tracking.stage_run(r.tracking.uri, r.tracking.experiment, "rl", params=params) as run_id:
            self.run_id = run_id
            print(f"[rl] mlflow run {run_id}; {r.rl.max_steps} steps, mode={r.rl.mode}", flush=True)
            yield self

    def step(self, step, version, batches, m, wait_s, sync, depth, filt) -> dict:
        from posttrain import tracking

        now = time.perf_counter()
        wall, self.t_last = now - self.t_last, now
        samples, tokens = m.pop("samples"), m.pop("tokens")  # over all learners
        gen = sum(b.gen_seconds for b in batches)
        idle = sum(b.wait_seconds for b in batches)
        st = filt.pop_window()
        row = dict(m, step=step + 1, policy_version=version, samples=samples, gen_tokens=tokens,
                   samples_per_s=samples / wall, gen_tokens_per_s=tokens / wall, step_s=wall,
                   actor_busy_pct=100.0 * gen / max(gen + idle, 1e-9),
                   learner_busy_pct=100.0 * m["train_s"] / wall, wait_s=wait_s, queue_depth=depth,
                   staleness_mean=sum(st) / max(len(st), 1), staleness_max=max(st) if st else 0,
                   dropped=filt.dropped, sync_ms=sync.ms, sync_mib=sync.mib, elapsed_s=now - self.t_start)
        for name in sorted({k for b in batches for k in b.reward_parts}):
            vals = [float(v) for b in batches for v in b.reward_parts.get(name, [])]
            row[f"reward_{name}"] = sum(vals) / max(len(vals), 1)
        row["actor_probes"] = [[b.policy_version, b.probe_logp] for b in batches]  # weight-sync check
        self.history.append(row)
        tracking.log_metrics(row, step=step + 1)
        print(self.line(row), flush=True)
        emit(self.health.observe(step + 1, row))  # [health] lines after the step line
        return row

    @staticmethod
    def line(r: dict) -> str:
        return (f"[rl] step {r['step']:>4} v{r['policy_version']} "
                f"reward {r['reward_mean']:+.3f}±{r['reward_std']:.3f} "
                f"loss {r['loss']:+.4f} kl {r['kl']:.4f} ent {r['entropy']:.2f} clip {r['clip_fraction']:.2f} "
                f"iw {r['iw_mean']:.3f}/{r['iw_max']:.2f} | {r['samples_per_s']:.1f} samp/s "
                f"{r['gen_tokens_per_s']:.0f} tok/s actor {r['actor_busy_pct']:.0f}% learner "
                f"{r['learner_busy_pct']:.0f}% q{r['queue_depth']} stale {r['staleness_mean']:.1f}/"
                f"{r['staleness_max']} drop {r['dropped']} sync {r['sync_ms']:.1f}ms "
                f"zero-std {r['zero_std_groups']:.2f}")

    def summary(self) -> dict:
        h = self.history
        k = max(1, len(h) // 5)
        mean = lambda rows, key: sum(r[key] for r in rows) / max(len(rows), 1)  # noqa: E731
        total_s = time.perf_counter() - self.t_start
        steady = h[1:] or h  # the first step also waits for the actors to start
        steady_s = max(sum(r["step_s"] for r in steady), 1e-9)
        return {
            "steps": len(h), "wall_s": total_s,
            "reward_final": h[-1]["reward_mean"] if h else 0.0,
            "reward_first_fifth": mean(h[:k], "reward_mean"),
            "reward_last_fifth": mean(h[-k:], "reward_mean"),
            "samples_per_s": sum(r["samples"] for r in steady) / steady_s,
            "gen_tokens_per_s": sum(r["gen_tokens"] for r in steady) / steady_s,
            "sync_ms_mean": mean(h, "sync_ms"), "staleness_mean": mean(h, "staleness_mean"),
            "dropped": h[-1]["dropped"] if h else 0,
            "actor_busy_pct": mean(h, "actor_busy_pct"), "learner_busy_pct": mean(h, "learner_busy_pct"),
            "health_warning_count": len(self.health.warnings),
            "health_warnings": [w.to_dict() for w in self.health.warnings],  # not a metric: MLflow skips it
        }

    def finish(self, learner, tokenizer) -> None:
        """Save the policy (atomically) to ``<out>/model`` and write ``<out>/metrics.json``."""
        from pathlib import Path

        from posttrain import tracking
        from posttrain.artifacts import atomic_dir, write_json_atomic
        from posttrain.models import save_model

        out = Path(self.ctx.out_dir)
        with atomic_dir(out / "model") as tmp:
            save_model(learner.model, tokenizer, str(tmp))
        summary = self.summary()
        tracking.log_metrics({f"summary/{k}": v for k, v in summary.items()})
        record_mlflow(self.health.warnings)  # health.txt + posttrain.health tag
        write_json_atomic(out / "metrics.json", {"summary": summary, "history": self.history,
                                                 "mlflow_run_id": self.run_id, "mode": self.ctx.recipe.rl.mode})
