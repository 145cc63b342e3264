"""Training-health monitor: scripted metric sequences with hand-computed firing steps and numbers.

Each rule: fires at the exact step its condition (with its window / persistence) first holds, names the numbers,
fires once while the condition lasts, and re-arms after ``rearm_after`` (3) clear observations. A realistic healthy
RL run and a healthy SFT loss curve stay silent. The wiring tests use the real learner (``Learner.train_step`` on
stories260K), the real ``StepMeter`` and the real trainer callback, with MLflow logging stubbed out.
"""

import json
import math
from types import SimpleNamespace

import pytest

from posttrain.monitor import RL_KEYS, HealthMonitor, HealthWarning, Thresholds, emit, health_tag, report_text

NAN, INF = float("nan"), float("inf")
HEALTHY = dict(loss=0.01, grad_norm=0.5, entropy=2.0, reward_mean=0.3, reward_std=0.4, samples=16,
               zero_std_groups=0.25, iw_mean=1.0, iw_max=1.3, clip_fraction=0.0, kl=0.0, dropped=0,
               actor_busy_pct=80.0, learner_busy_pct=60.0)


def feed(mon: HealthMonitor, rows: list[dict], start: int = 1, every: int = 1) -> list[HealthWarning]:
    """Observe ``rows`` at steps start, start+every, ...; all new warnings in order."""
    out = []
    for i, r in enumerate(rows):
        out += mon.observe(start + i * every, r)
    return out


def rl_rows(key: str, values: list) -> list[dict]:
    return [{**HEALTHY, key: v} for v in values]


def fired(ws: list[HealthWarning], kind: str | None = None) -> list[tuple[str, int]]:
    return [(w.kind, w.step) for w in ws if kind is None or w.kind == kind]


# ---------------------------------------------------------------------- firing machinery
def test_nonfinite_fires_once_as_error_and_rearms_after_three_clear_steps():
    mon = HealthMonitor("rl")
    loss = [0.1, NAN, 0.1, 0.1, NAN, NAN, 0.1, 0.1, 0.1, 0.1]  # only 2 clear steps between 2 and 5: no re-fire
    ws = feed(mon, rl_rows("loss", loss))
    assert fired(ws) == [("nonfinite", 2)]
    assert ws[0].level == "error" and "loss is nan" in ws[0].message and "rl.learning_rate" in ws[0].message
    ws = mon.observe(11, {**HEALTHY, "grad_norm": INF})  # steps 7-9 were clear: re-armed
    assert fired(ws) == [("nonfinite", 11)] and "grad_norm is inf" in ws[0].message
    assert fired(mon.warnings) == [("nonfinite", 2), ("nonfinite", 11)]


def test_line_tag_report_and_emit(capsys):
    w = HealthWarning("entropy_collapse", 12, "entropy fell", "warning")
    e = HealthWarning("nonfinite", 13, "loss is nan", "error")
    assert w.line() == "[health] WARNING step 12 entropy_collapse: entropy fell"
    assert health_tag([]) == "ok" and report_text([]) == "no training-health warnings\n"
    assert health_tag([w, e, w]) == "error: entropy_collapse, nonfinite"
    assert report_text([w, e]).splitlines() == [w.line(), e.line()]
    emit([w, e])
    assert capsys.readouterr().out.splitlines() == [w.line(), e.line()]


def test_threshold_overrides_and_unknown_name():
    assert HealthMonitor(entropy_frac=0.1).t.entropy_frac == 0.1
    assert HealthMonitor(thresholds=Thresholds(window=7)).t.window == 7
    with pytest.raises(TypeError):
        HealthMonitor(entropy_fraction=0.1)


# ---------------------------------------------------------------------- RL rules
def test_entropy_collapse_against_the_early_mean():
    # steps 1-5: reference mean 13.75 / 5 = 2.75; threshold 0.25 * 2.75 = 0.6875 (0.69 at step 14 is still above)
    ent = [2.8, 2.7, 2.75, 2.8, 2.7, 2.5, 2.2, 1.9, 1.6, 1.3, 1.0, 0.8, 0.7, 0.69, 0.41, 0.3, 0.3,
           2.0, 2.0, 2.0, 0.5]
    ws = feed(HealthMonitor("rl"), rl_rows("entropy", ent))
    assert fired(ws) == [("entropy_collapse", 15), ("entropy_collapse", 21)]  # 18-20 clear -> re-armed
    assert "fell from 2.75" in ws[0].message and "to 0.41 in 10 steps" in ws[0].message
    assert "15%" in ws[0].message and "rl.kl_coef" in ws[0].message


def test_reward_collapse_after_a_rise():
    # 5-step running means (reward_std 0: no noise allowance): 0.1 (step 5, first) .. 0.6 (step 10, best);
    # then 0.52, 0.44, 0.36 (drop 0.24 < half the 0.5 gain), 0.28 at step 14 (drop 0.32 >= 0.25)
    r = [0.1] * 5 + [0.6] * 5 + [0.2] * 6
    ws = feed(HealthMonitor("rl"), [{**HEALTHY, "reward_mean": v, "reward_std": 0.0} for v in r])
    assert fired(ws) == [("reward_collapse", 14)]
    m = ws[0].message
    assert "fell to 0.280" in m and "best 0.600 (step 10)" in m and "from 0.100" in m and "64% of the gain" in m


def test_reward_collapse_needs_more_than_batch_noise():
    # rise 0.1 then back: fires without noise; with reward_std 0.5 over 8 samples the allowance is
    # 2 * sqrt(5 * 0.25 / 8) / 5 = 0.158 > the 0.1 rise, so the same means are noise
    r = [0.1] * 5 + [0.2] * 5 + [0.1] * 5
    quiet = [{**HEALTHY, "reward_mean": v, "reward_std": 0.5, "samples": 8} for v in r]
    exact = [{**row, "reward_std": 0.0} for row in quiet]
    assert fired(feed(HealthMonitor("rl"), exact)) == [("reward_collapse", 13)]  # mean 0.14 at 13: drop 0.06>=0.05
    assert feed(HealthMonitor("rl"), quiet) == []


def test_zero_std_groups_persist_fire_once_and_rearm():
    z = [0.25, 0.25, 0.75, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    ws = feed(HealthMonitor("rl"), rl_rows("zero_std_groups", z))
    assert fired(ws) == [("zero_std_groups", 5), ("zero_std_groups", 12)]
    assert "100% of groups" in ws[0].message and "steps 3-5" in ws[0].message
    assert "every completion in a group got the same reward" in ws[0].message


def test_importance_weight_mean_off():
    ws = feed(HealthMonitor("rl"), rl_rows("iw_mean", [1.0, 1.05, 1.35, 1.3, 0.7, 0.75]))
    assert fired(ws) == [("iw_mean_off", 5)] and "0.700 for 3 steps" in ws[0].message


def test_importance_weights_at_the_cap_most_steps():
    # hits at steps 3-8 and 10 (7 of 10 at step 10), step 11 makes steps 2-11 hold 8 hits >= 0.8 * 10
    iw = [1.5, 1.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.9, 2.0, 2.0]
    ws = feed(HealthMonitor("rl", iw_cap=2.0), rl_rows("iw_max", iw))
    assert fired(ws) == [("iw_at_cap", 11)] and "cap 2 in 8 of the last 10 steps" in ws[0].message
    assert feed(HealthMonitor("rl", iw_cap=None), rl_rows("iw_max", iw)) == []  # decoupled / no correction


def test_clip_fraction_high_needs_consecutive_steps():
    ws = feed(HealthMonitor("rl"), rl_rows("clip_fraction", [0.1, 0.35, 0.35, 0.1, 0.4, 0.4, 0.4, 0.4]))
    assert fired(ws) == [("clip_fraction_high", 7)] and "clip fraction 0.40 for 3 steps" in ws[0].message


def test_kl_exploding_growth_and_absolute():
    # growth: step 6 kl 0.25 >= 4 x 0.05 (step 1) and >= 0.2; 7: 0.4 >= 4 x 0.06; 8: 0.6 >= 4 x 0.08 -> 3 steps
    kl = [0.05, 0.06, 0.08, 0.1, 0.15, 0.25, 0.4, 0.6]
    ws = feed(HealthMonitor("rl"), rl_rows("kl", kl))
    assert fired(ws) == [("kl_exploding", 8)] and "0.600 nats/token (was 0.080 5 steps ago" in ws[0].message
    assert fired(feed(HealthMonitor("rl"), rl_rows("kl", [0.5, 1.5, 1.5, 1.5]))) == [("kl_exploding", 4)]
    assert feed(HealthMonitor("rl"), rl_rows("kl", [0.01 * i for i in range(12)])) == []  # slow, below the floor


def test_staleness_drops_fraction_over_the_window():
    # 16 samples trained per step; at step 8 the last 5 steps dropped 32 - 0 = 32: 32 / (32 + 80) = 29% >= 20%
    # (steps 6 and 7: 16 / 96 = 17%)
    ws = feed(HealthMonitor("rl"), rl_rows("dropped", [0, 0, 0, 0, 0, 16, 16, 32, 48]))
    assert fired(ws) == [("staleness_drops", 8)]
    assert "dropped 32 samples in the last 5 steps (29% of those generated; 32 in all)" in ws[0].message


def test_idle_learner_is_a_pipeline_bubble_only_in_async_mode():
    # step 1 skipped (actor start-up); steps 2-6 mean 72 / 5 = 14.4% < 15%
    busy = [2.0, 12.0, 10.0, 14.0, 20.0, 16.0]
    ws = feed(HealthMonitor("rl"), rl_rows("learner_busy_pct", busy))
    assert fired(ws) == [("learner_idle", 6)] and "learner busy 14% (mean of steps 2-6" in ws[0].message
    assert feed(HealthMonitor("rl", check_busy=False), rl_rows("learner_busy_pct", busy)) == []
    ws = feed(HealthMonitor("rl"), rl_rows("actor_busy_pct", busy))
    assert fired(ws) == [("actor_idle", 6)] and "wait for new weights" in ws[0].message


def _healthy_rl_run(steps: int = 40) -> list[dict]:
    """Rising reward with batch noise, slowly falling entropy, small KL, weights near 1, busy roles."""
    noise = [0.08, -0.1, 0.05, -0.03, 0.1, -0.07, 0.02, -0.09, 0.06, 0.0]
    rows = []
    for s in range(steps):
        rows.append(dict(loss=0.02 * noise[s % 10], grad_norm=0.3 + 0.1 * (s % 3), entropy=2.8 - 0.03 * s,
                         reward_mean=0.1 + 0.5 * s / steps + noise[s % 10], reward_std=0.4, samples=16,
                         zero_std_groups=(0.25, 0.5, 0.0, 0.75)[s % 4], iw_mean=1.0 + 0.01 * noise[s % 10],
                         iw_max=1.2 + (s % 5) * 0.2, clip_fraction=0.0, kl=0.002 * s, dropped=0 if s < 20 else 4,
                         actor_busy_pct=60.0 + 10 * (s % 2), learner_busy_pct=45.0 if s else 3.0))
    return rows


def test_healthy_rl_run_is_silent():
    rows = _healthy_rl_run()
    assert rows[-1]["entropy"] / rows[0]["entropy"] < 0.6  # entropy really does fall
    assert feed(HealthMonitor("rl", iw_cap=2.0), rows) == []


# ---------------------------------------------------------------------- SFT / reward / DPO
def test_supervised_divergence():
    # 3-log running means: 1.8 1.6 1.4 1.2 (best, step 60) 1.233 1.667 (<= 1.5 x 1.2) 2.333 at step 90
    loss = [2.0, 1.8, 1.6, 1.4, 1.2, 1.0, 1.5, 2.5, 3.0]
    ws = feed(HealthMonitor("dpo"), [{"loss": v, "grad_norm": 1.0} for v in loss], start=10, every=10)
    assert fired(ws) == [("loss_divergence", 90)]
    assert "loss rose to 2.333 (3-log mean) from its best 1.200 (step 60)" in ws[0].message
    assert "dpo.learning_rate" in ws[0].message
    tiny = [0.01, 0.01, 0.01, 0.02, 0.05, 0.06, 0.06]  # 6x the best but only 0.05 nats above it
    assert feed(HealthMonitor("reward"), [{"loss": v} for v in tiny]) == []


def test_supervised_plateau_and_nan():
    flat = [2.30, 2.31, 2.29, 2.30, 2.31, 2.30, 2.29, 2.30, 2.31, 2.30, float("nan")]
    ws = feed(HealthMonitor("sft"), [{"loss": v, "learning_rate": 1e-4} for v in flat], start=5, every=5)
    assert fired(ws) == [("loss_plateau", 50), ("nonfinite", 55)]
    assert "not decreased in 10 logged steps: 2.300 at the start" in ws[0].message
    assert "sft.learning_rate" in ws[0].message
    assert ws[1].level == "error"


def test_healthy_sft_curve_is_silent():
    noise = [0.04, -0.03, 0.02, -0.05, 0.03, 0.0, -0.02, 0.05]
    loss = [1.2 + 1.1 * math.exp(-i / 8) + noise[i % 8] for i in range(30)]
    rows = [{"loss": v, "grad_norm": 2.0 - i * 0.03, "learning_rate": 1e-4, "epoch": i / 30}
            for i, v in enumerate(loss)]
    assert feed(HealthMonitor("sft"), rows) == []
    assert feed(HealthMonitor("rl"), rows) == []  # RL rules ignore a supervised loss curve


# ---------------------------------------------------------------------- wiring
def _tiny_train_step(stories260k) -> dict:
    """Metrics of one real ``Learner.train_step`` on 2 groups of 2 random completions (one zero-std group)."""
    import torch

    from posttrain.models import load_causal_lm
    from posttrain.rl.collate import TrainBatch
    from posttrain.rl.learner import Learner, LearnerConfig
    from posttrain.rl.logprobs import forward_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = load_causal_lm(stories260k)
    pid, cid = torch.randint(3, 512, (4, 4)), torch.randint(3, 512, (4, 5))
    pm, cm = torch.ones_like(pid), torch.ones_like(cid)
    with torch.no_grad():
        bl = forward_logprobs(model, pid, pm, cid, cm, 1.0)[0]
    batch = TrainBatch(pid, pm, cid, cm, bl, torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long), 2)
    return Learner(model, LearnerConfig(), lr=1e-4).train_step(batch)


def test_learner_step_rows_carry_every_key_the_monitor_reads(stories260k, monkeypatch, capsys):
    from posttrain import tracking
    from posttrain.recipe import RLSpec
    from posttrain.rl.buffer import StalenessFilter
    from posttrain.rl.metrics import StepMeter

    monkeypatch.setattr(tracking, "log_metrics", lambda *a, **k: None)
    m = _tiny_train_step(stories260k)
    meter = StepMeter(SimpleNamespace(recipe=SimpleNamespace(rl=RLSpec())), enabled=True)
    batch = SimpleNamespace(gen_seconds=1.0, wait_seconds=0.5, reward_parts={"correctness": [1, 0, 1, 1]},
                            policy_version=0, probe_logp=-1.0)
    filt, sync = StalenessFilter(1), SimpleNamespace(ms=1.0, mib=0.1)
    filt.accept(0, 0, 4)
    rows = [meter.step(i, i + 1, [batch], {**m, "learner_param_spread": 0.0, "learner_probe": -1.0, **extra},
                       0.1, sync, 0, filt) for i, extra in enumerate([{}, {"loss": NAN}])]
    assert set(RL_KEYS) <= set(rows[0]), set(RL_KEYS) - set(rows[0])
    assert rows[0]["zero_std_groups"] == 0.5 and abs(rows[0]["iw_mean"] - 1.0) < 1e-4
    assert "[health] ERROR step 2 nonfinite: loss is nan" in capsys.readouterr().out
    summary = json.loads(json.dumps(meter.summary()))
    assert summary["health_warning_count"] == 1 and summary["health_warnings"][0]["kind"] == "nonfinite"


def test_trainer_callback_feeds_the_monitor(monkeypatch, capsys):
    from posttrain import tracking
    from posttrain.stages._common import loss_history_callback

    monkeypatch.setattr(tracking, "log_metrics", lambda *a, **k: None)
    cb = loss_history_callback("reward")
    for step, loss in ((1, 0.69), (2, float("nan"))):
        cb.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": loss, "grad_norm": 1.0})
    assert fired(cb.health.warnings) == [("nonfinite", 2)] and len(cb.history) == 2
    assert "[health] ERROR step 2 nonfinite: loss is nan" in capsys.readouterr().out
