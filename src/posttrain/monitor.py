"""Training-health warnings: tell the user, while it runs, when training goes wrong and what to try.

``HealthMonitor`` is pure Python (no torch, no mlflow). It is fed one dict of step metrics at a time
(``observe(step, metrics)``) and returns the NEW ``HealthWarning``s of that step. Feeders:

- the RL learner (``rl/metrics.StepMeter.step``) feeds every learner step's row (keys ``RL_KEYS``);
- the SFT/reward/DPO trainer callback (``stages/_common.loss_history_callback``) feeds every trainer log entry
  (keys ``SUPERVISED_KEYS``; ``step`` is the trainer's global step).

Firing: a kind fires once when its condition becomes true, then stays quiet until the condition has been false
for ``rearm_after`` consecutive observations; after that it can fire again. A rule whose metrics are missing from
an observation, or that still lacks its warm-up history, is not evaluated and keeps its state. Per-step
conditions that are noisy (zero-std groups, importance-weight mean, clip fraction, KL) must hold for
``persist_steps`` consecutive steps: one odd batch is not a trend.

Kinds (``HealthWarning.kind``): every run: ``nonfinite`` (loss or grad_norm NaN/inf; level "error"). RL:
``entropy_collapse``, ``reward_collapse``, ``zero_std_groups``, ``iw_mean_off``, ``iw_at_cap``,
``clip_fraction_high``, ``kl_exploding``, ``staleness_drops``, ``learner_idle``, ``actor_idle``. SFT/reward/DPO:
``loss_divergence``, ``loss_plateau``. Thresholds and why: ``Thresholds``.

``emit`` prints each warning on one ``[health]`` line (and logs it to logger ``posttrain`` at WARNING when that
logger has a handler); ``record_mlflow`` writes ``health.txt`` and the ``posttrain.health`` tag on the active run.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import asdict, dataclass, field, replace

log = logging.getLogger("posttrain")

RL_KEYS = ("loss", "grad_norm", "entropy", "reward_mean", "reward_std", "samples", "zero_std_groups", "iw_mean",
           "iw_max", "clip_fraction", "kl", "dropped", "actor_busy_pct", "learner_busy_pct")
"""Metric names the RL rules read from a learner step row (``rl/learner.Learner.train_step`` + ``StepMeter.step``)."""
SUPERVISED_KEYS = ("loss", "grad_norm")
"""Metric names the SFT/reward/DPO rules read from a transformers Trainer log entry."""


@dataclass(frozen=True)
class HealthWarning:
    """One warning: ``kind`` (rule name), ``step`` (learner/trainer step it fired at), ``message`` (what is wrong,
    the numbers, what to try), ``level`` ("warning" | "error")."""

    kind: str
    step: int
    message: str
    level: str = "warning"

    def line(self) -> str:
        """The console line: ``[health] WARNING step 12 entropy_collapse: ...``."""
        return f"[health] {self.level.upper()} step {self.step} {self.kind}: {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Thresholds:
    """Rule thresholds. Defaults are set so a healthy run (rising reward, slowly falling entropy) stays quiet."""

    rearm_after: int = 3
    """Clear observations before a fired kind may fire again: long enough that a flickering condition warns once."""
    persist_steps: int = 3
    """Consecutive steps a noisy per-step condition must hold before it fires (a single bad batch is common)."""
    window: int = 5
    """Steps in the running means (reward, busy %, staleness drops): smooths per-batch noise of a few groups."""
    entropy_warmup: int = 5
    """Steps whose mean entropy is the early reference: the policy's entropy before RL reshaped it."""
    entropy_frac: float = 0.25
    """Entropy below this fraction of the early reference = collapse. Healthy GRPO runs lose well under half their
    entropy; below a quarter the completions of a group rarely differ and learning stalls (DAPO, Yu et al. 2025)."""
    reward_min_rise: float = 0.05
    """The running mean reward must first have risen this much (reward units) above its first value: a run that
    never learned has nothing to collapse from (rewards in [0, 1]: 5% of the range)."""
    reward_drop_frac: float = 0.5
    """Collapse when the running mean has lost this fraction of its gain (best - first): half the progress gone."""
    noise_k: float = 2.0
    """A reward rise or drop must also exceed this many standard errors of the running mean (from reward_std and
    samples): batch noise alone must not look like a collapse."""
    zero_std_frac: float = 0.75
    """Fraction of groups with identical rewards that counts as "most": their advantages are all 0."""
    iw_mean_tol: float = 0.2
    """|iw_mean - 1| above this: the actors' behaviour policy is far from the learner's (on-policy it is 1.0)."""
    iw_cap_frac: float = 0.8
    """iw_max at the cap in at least this fraction of the last ``iw_window`` steps: truncation every step."""
    iw_window: int = 10
    """Steps over which ``iw_cap_frac`` is measured."""
    clip_max: float = 0.3
    """Clip fraction above this: healthy PPO-style updates clip 0.05-0.2 of tokens; more means too-large steps."""
    kl_max: float = 1.0
    """KL to the reference (nats/token, k3) above this: the policy has left the reference far behind."""
    kl_growth: float = 4.0
    """KL grew this many times over ``window`` steps (while above ``kl_floor``): it is running away."""
    kl_floor: float = 0.2
    """KL growth below this many nats/token is not reported (it starts at 0 and rises early on by design)."""
    drop_frac: float = 0.2
    """Staleness drops above this fraction of the samples generated over ``window`` steps: a fifth of the actors'
    work thrown away."""
    busy_min_pct: float = 15.0
    """Actor or learner busy below this percent (``window`` mean): that role mostly waits (a pipeline bubble)."""
    busy_skip: int = 1
    """First steps left out of the busy means (step 1 also waits for the actors to load)."""
    loss_window: int = 3
    """Logged losses in the running mean of the supervised rules (one batch's loss is noisy)."""
    diverge_factor: float = 1.5
    """Supervised loss divergence: running mean above this multiple of its best value ..."""
    diverge_min_abs: float = 0.1
    """... and above it by at least this many nats (tiny losses near 0 can double from noise)."""
    plateau_logs: int = 10
    """Logged losses after which a loss that has not improved is reported."""
    plateau_min_drop: float = 0.02
    """The best running mean must be at least this fraction below the first one by ``plateau_logs`` logs."""


def _number(m: dict, key: str) -> float | None:
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


@dataclass
class _Arm:
    armed: bool = True
    clear: int = 0


@dataclass
class _State:
    """Histories the rules need (bounded)."""

    entropy_ref: list = field(default_factory=list)
    entropy_ref_step: int = 0
    reward: deque = field(default_factory=deque)          # (reward_mean, squared standard error)
    reward_first: float | None = None
    reward_best: tuple = (-math.inf, 0)                   # (running mean, step)
    streaks: dict = field(default_factory=dict)           # kind -> consecutive active steps
    iw_cap_hits: deque = field(default_factory=deque)
    kl: deque = field(default_factory=deque)
    drops: deque = field(default_factory=deque)           # (dropped cumulative, samples)
    busy: dict = field(default_factory=dict)              # key -> deque of (step, pct)
    busy_seen: int = 0
    loss: deque = field(default_factory=deque)
    loss_first: float | None = None
    loss_best: tuple = (math.inf, 0)
    loss_count: int = 0


class HealthMonitor:
    """Turns a stream of step metrics into training-health warnings (see the module docstring)."""

    def __init__(self, section: str = "rl", *, iw_cap: float | None = None, check_busy: bool = True,
                 thresholds: Thresholds | None = None, **overrides: float):
        """``section``: recipe section the run trains ("rl" = RL rules; "sft" | "reward" | "dpo" = loss rules), used
        in the hints. ``iw_cap``: the importance-weight cap when weights are truncated at it (``rl.tis_cap`` with
        ``off_policy_correction="tis"``), else None. ``check_busy``: report idle actors/learner (off for the
        lock-step ``rl.mode="sync"``, where each role waits for the other by design). ``overrides``: Thresholds
        fields, e.g. ``entropy_frac=0.1``. Raises TypeError for an unknown threshold name."""
        self.section, self.iw_cap, self.check_busy = section, iw_cap, check_busy
        self.t = replace(thresholds or Thresholds(), **overrides)
        self.rl = section == "rl"
        self.keys = RL_KEYS if self.rl else SUPERVISED_KEYS
        self.warnings: list[HealthWarning] = []
        self._arms: dict[str, _Arm] = {}
        self._s = _State()

    def observe(self, step: int, metrics: dict) -> list[HealthWarning]:
        """Feed the metrics of ``step``; returns the warnings that fire now (also appended to ``.warnings``).
        Non-numeric values are ignored."""
        m = {k: v for k in self.keys if (v := _number(metrics, k)) is not None}
        rules = [self._nonfinite]
        if self.rl:
            rules += [self._entropy, self._reward, self._zero_std, self._iw_mean, self._iw_cap, self._clip,
                      self._kl, self._drops, self._busy]
        else:
            rules.append(self._supervised)
        new: list[HealthWarning] = []
        for rule in rules:
            for kind, verdict in rule(step, m).items():
                w = self._fire(kind, step, verdict)
                if w is not None:
                    new.append(w)
        self.warnings.extend(new)
        return new

    def _fire(self, kind: str, step: int, verdict) -> HealthWarning | None:
        """``verdict``: None (not evaluated), False (healthy) or ``(level, message)`` (condition holds)."""
        if verdict is None:
            return None
        arm = self._arms.setdefault(kind, _Arm())
        if verdict is False:
            arm.clear += 1
            if arm.clear >= self.t.rearm_after:
                arm.armed = True
            return None
        arm.clear = 0
        if not arm.armed:
            return None
        arm.armed = False
        return HealthWarning(kind, step, verdict[1], verdict[0])

    def _streak(self, kind: str, active: bool) -> int:
        n = self._s.streaks.get(kind, 0) + 1 if active else 0
        self._s.streaks[kind] = n
        return n

    # ------------------------------------------------------------------ every run
    def _nonfinite(self, step: int, m: dict) -> dict:
        bad = {k: m[k] for k in ("loss", "grad_norm") if k in m and not math.isfinite(m[k])}
        if not any(k in m for k in ("loss", "grad_norm")):
            return {"nonfinite": None}
        if not bad:
            return {"nonfinite": False}
        what = ", ".join(f"{k} is {v}" for k, v in bad.items())
        return {"nonfinite": ("error", f"{what} (training diverged; the weights may now be NaN): lower "
                                       f"{self.section}.learning_rate or {self.section}.max_grad_norm, use "
                                       "float32 (model.dtype) and check the data for empty or broken rows")}

    # ------------------------------------------------------------------ RL
    def _entropy(self, step: int, m: dict) -> dict:
        e, s, t = m.get("entropy"), self._s, self.t
        if e is None or not math.isfinite(e):
            return {"entropy_collapse": None}
        if len(s.entropy_ref) < t.entropy_warmup:
            s.entropy_ref.append(e)
            s.entropy_ref_step = step
            return {"entropy_collapse": None}
        ref = sum(s.entropy_ref) / len(s.entropy_ref)
        if ref <= 0 or e >= t.entropy_frac * ref:
            return {"entropy_collapse": False}
        return {"entropy_collapse": ("warning", (
            f"entropy fell from {ref:.2f} (mean of the first {len(s.entropy_ref)} steps) to {e:.2f} in "
            f"{step - s.entropy_ref_step} steps ({e / ref:.0%} of its early value; policy collapse): completions "
            "are becoming deterministic and groups stop differing; lower rl.learning_rate or add rl.kl_coef "
            "(or raise rl.clip_eps_high / rl.temperature)"))}

    def _reward(self, step: int, m: dict) -> dict:
        r, s, t = m.get("reward_mean"), self._s, self.t
        if r is None or not math.isfinite(r):
            return {"reward_collapse": None}
        std, n = m.get("reward_std", 0.0), max(m.get("samples", 1.0), 1.0)
        s.reward.append((r, (std * std / n) if math.isfinite(std) else 0.0))
        if len(s.reward) > t.window:
            s.reward.popleft()
        if len(s.reward) < t.window:
            return {"reward_collapse": None}
        w = len(s.reward)
        mean = sum(v for v, _ in s.reward) / w
        noise = t.noise_k * math.sqrt(sum(e for _, e in s.reward)) / w  # k x standard error of the running mean
        if s.reward_first is None:
            s.reward_first = mean
        if mean > s.reward_best[0]:
            s.reward_best = (mean, step)
        best, best_step = s.reward_best
        rise, drop = best - s.reward_first, best - mean
        if rise < max(t.reward_min_rise, noise) or drop < max(t.reward_drop_frac * rise, noise):
            return {"reward_collapse": False}
        return {"reward_collapse": ("warning", (
            f"reward fell to {mean:.3f} ({w}-step mean) from its best {best:.3f} (step {best_step}) after rising "
            f"from {s.reward_first:.3f}: {drop / rise:.0%} of the gain lost (reward collapse; the policy is "
            "unlearning); lower rl.learning_rate, add rl.kl_coef, or lower rl.max_staleness"))}

    def _zero_std(self, step: int, m: dict) -> dict:
        z = m.get("zero_std_groups")
        if z is None:
            return {"zero_std_groups": None}
        n = self._streak("zero_std_groups", z >= self.t.zero_std_frac)
        if n < self.t.persist_steps:
            return {"zero_std_groups": False}
        r = m.get("reward_mean", math.nan)
        return {"zero_std_groups": ("warning", (
            f"{z:.0%} of groups had zero reward std for {n} steps (steps {step - n + 1}-{step}, reward mean "
            f"{r:.3f}): every completion in a group got the same reward, so advantages are 0 and there is no "
            "learning signal; if the reward is at its maximum the task is solved (stop, or use harder prompts), "
            "otherwise pick prompts the policy sometimes solves, raise rl.num_generations or rl.temperature, or "
            "add a partial-credit reward (rl.rewards.format)"))}

    def _iw_mean(self, step: int, m: dict) -> dict:
        iw = m.get("iw_mean")
        if iw is None:
            return {"iw_mean_off": None}
        n = self._streak("iw_mean_off", abs(iw - 1.0) > self.t.iw_mean_tol)
        if n < self.t.persist_steps:
            return {"iw_mean_off": False}
        return {"iw_mean_off": ("warning", (
            f"importance weight mean {iw:.3f} for {n} steps (|iw_mean - 1| > {self.t.iw_mean_tol:g}; 1.0 when "
            "the actors sample from the learner's policy): behaviour/learner mismatch or samples too stale; "
            "lower rl.max_staleness or rl.learning_rate, or check the actor backend's log-probs (rl.backend)"))}

    def _iw_cap(self, step: int, m: dict) -> dict:
        iw, s, t = m.get("iw_max"), self._s, self.t
        if iw is None or self.iw_cap is None:
            return {"iw_at_cap": None}
        s.iw_cap_hits.append(iw >= self.iw_cap * (1 - 1e-6))
        if len(s.iw_cap_hits) > t.iw_window:
            s.iw_cap_hits.popleft()
        if len(s.iw_cap_hits) < t.iw_window:
            return {"iw_at_cap": None}
        hits = sum(s.iw_cap_hits)
        if hits < t.iw_cap_frac * t.iw_window:
            return {"iw_at_cap": False}
        return {"iw_at_cap": ("warning", (
            f"iw_max hit the cap {self.iw_cap:g} in {hits} of the last {t.iw_window} steps (iw_mean "
            f"{m.get('iw_mean', math.nan):.3f}): some tokens are far more likely under the learner than under the "
            "actors' behaviour policy (stale samples or a numerics mismatch) and get truncated every step; lower "
            "rl.max_staleness or rl.learning_rate"))}

    def _clip(self, step: int, m: dict) -> dict:
        c = m.get("clip_fraction")
        if c is None:
            return {"clip_fraction_high": None}
        n = self._streak("clip_fraction_high", c > self.t.clip_max)
        if n < self.t.persist_steps:
            return {"clip_fraction_high": False}
        return {"clip_fraction_high": ("warning", (
            f"clip fraction {c:.2f} for {n} steps (> {self.t.clip_max:g}): most probability ratios leave the "
            "trust region, the updates are too large or the samples too off-policy; lower rl.learning_rate or "
            "rl.max_staleness"))}

    def _kl(self, step: int, m: dict) -> dict:
        kl, s, t = m.get("kl"), self._s, self.t
        if kl is None or not math.isfinite(kl):
            return {"kl_exploding": None}
        s.kl.append(kl)
        if len(s.kl) > t.window + 1:
            s.kl.popleft()
        then = s.kl[0]
        grew = len(s.kl) == t.window + 1 and kl >= t.kl_floor and kl >= t.kl_growth * then
        n = self._streak("kl_exploding", kl > t.kl_max or grew)
        if n < t.persist_steps:
            return {"kl_exploding": False}
        return {"kl_exploding": ("warning", (
            f"KL to the reference is {kl:.3f} nats/token (was {then:.3f} {len(s.kl) - 1} steps ago; limit "
            f"{t.kl_max:g}, or {t.kl_growth:g}x growth above {t.kl_floor:g}): the policy is running away from the "
            "reference; raise rl.kl_coef or lower rl.learning_rate"))}

    def _drops(self, step: int, m: dict) -> dict:
        d, s, t = m.get("dropped"), self._s, self.t
        if d is None:
            return {"staleness_drops": None}
        s.drops.append((d, m.get("samples", 0.0)))
        if len(s.drops) > t.window + 1:
            s.drops.popleft()
        if len(s.drops) < t.window + 1:
            return {"staleness_drops": None}
        new = d - s.drops[0][0]
        trained = sum(n for _, n in list(s.drops)[1:])
        frac = new / max(new + trained, 1.0)
        if new <= 0 or frac < t.drop_frac:
            return {"staleness_drops": False}
        return {"staleness_drops": ("warning", (
            f"the staleness filter dropped {new:.0f} samples in the last {t.window} steps ({frac:.0%} of those "
            f"generated; {d:.0f} in all): actors run further ahead than rl.max_staleness allows and their rollouts "
            "are thrown away; raise rl.max_staleness (the off-policy correction handles it) or use fewer actors"))}

    _BUSY_HINTS = {
        "learner_busy_pct": ("learner_idle", "the learner waits for rollouts most of each step (generation is the "
                             "bottleneck); add actors (rl.num_actors), let them run ahead (rl.max_staleness) or "
                             "shorten rl.max_new_tokens"),
        "actor_busy_pct": ("actor_idle", "the actors wait for new weights most of the time (the learner is the "
                           "bottleneck); raise rl.max_staleness, add learners (rl.num_learners) or use fewer "
                           "actors"),
    }

    def _busy(self, step: int, m: dict) -> dict:
        s, t, out = self._s, self.t, {}
        if any(k in m for k in self._BUSY_HINTS):
            s.busy_seen += 1
        for key, (kind, hint) in self._BUSY_HINTS.items():
            p = m.get(key)
            if p is None or not self.check_busy or s.busy_seen <= t.busy_skip:
                out[kind] = None
                continue
            q = s.busy.setdefault(key, deque(maxlen=t.window))
            q.append((step, p))
            if len(q) < t.window:
                out[kind] = None
                continue
            mean = sum(v for _, v in q) / len(q)
            out[kind] = False if mean >= t.busy_min_pct else ("warning", (
                f"{key.split('_')[0]} busy {mean:.0f}% (mean of steps {q[0][0]}-{q[-1][0]}, below "
                f"{t.busy_min_pct:g}%; pipeline bubble): {hint}"))
        return out

    # ------------------------------------------------------------------ SFT / reward / DPO
    def _loss_mean(self, step: int, m: dict) -> float | None:
        """Update the loss running mean once per observation; None until ``loss_window`` losses are in."""
        s, t = self._s, self.t
        x = m.get("loss")
        if x is None or not math.isfinite(x):
            return None
        s.loss.append(x)
        s.loss_count += 1
        if len(s.loss) > t.loss_window:
            s.loss.popleft()
        if len(s.loss) < t.loss_window:
            return None
        mean = sum(s.loss) / len(s.loss)
        if s.loss_first is None:
            s.loss_first = mean
        if mean < s.loss_best[0]:
            s.loss_best = (mean, step)
        return mean

    def _supervised(self, step: int, m: dict) -> dict:
        mean, s, t = self._loss_mean(step, m), self._s, self.t
        if mean is None:
            return {"loss_divergence": None, "loss_plateau": None}
        (best, best_step), first, sec = s.loss_best, s.loss_first, self.section
        out: dict = {"loss_divergence": False, "loss_plateau": None}
        if mean > best * t.diverge_factor and mean - best >= t.diverge_min_abs:
            out["loss_divergence"] = ("warning", (
                f"loss rose to {mean:.3f} ({t.loss_window}-log mean) from its best {best:.3f} (step {best_step}) "
                f"(divergence): lower {sec}.learning_rate or {sec}.max_grad_norm, or raise {sec}.warmup_ratio"))
        if s.loss_count >= t.plateau_logs:
            out["loss_plateau"] = False if best < first * (1 - t.plateau_min_drop) else ("warning", (
                f"loss has not decreased in {s.loss_count} logged steps: {first:.3f} at the start, best "
                f"{best:.3f} (needs {t.plateau_min_drop:.0%} lower; plateau, the model is not learning): raise "
                f"{sec}.learning_rate, or check that the data gives a training signal (labels not all masked, "
                "chosen and rejected not identical)"))
        return out



def emit(warnings: list[HealthWarning]) -> list[HealthWarning]:
    """Print each warning on its own ``[health]`` line (stdout, flushed) and log it to logger ``posttrain`` at
    WARNING when that logger has a handler (without one Python would print the same text again to stderr).
    Returns ``warnings``."""
    for w in warnings:
        print(w.line(), flush=True)
        if log.hasHandlers():
            log.warning(w.line())
    return warnings


def report_text(warnings: list[HealthWarning]) -> str:
    """The ``health.txt`` text: one warning per line, or a line saying there were none."""
    if not warnings:
        return "no training-health warnings\n"
    return "".join(w.line() + "\n" for w in warnings)


def health_tag(warnings: list[HealthWarning]) -> str:
    """The ``posttrain.health`` tag value: "ok", or "<worst level>: <kinds>" e.g. "error: nonfinite, kl_exploding"."""
    if not warnings:
        return "ok"
    level = "error" if any(w.level == "error" for w in warnings) else "warning"
    return f"{level}: " + ", ".join(dict.fromkeys(w.kind for w in warnings))


def record_mlflow(warnings: list[HealthWarning]) -> None:
    """Log ``health.txt`` and the ``posttrain.health`` tag on the active MLflow run (no-op without one)."""
    import mlflow

    if mlflow.active_run() is None:
        return
    mlflow.set_tag("posttrain.health", health_tag(warnings))
    mlflow.log_text(report_text(warnings), "health.txt")
