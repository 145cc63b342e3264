"""Model registry: stages as MLflow aliases, versions with metrics and lineage, recorded transitions, the gate.

Stages are the aliases ``candidate``, ``staging`` and ``production`` on a registered model (MLflow's stage API
is deprecated since 2.9). An alias points at one version at a time; a version may hold several aliases.

What is recorded, so the history survives alias moves:

- on every version, tag ``posttrain.transitions``: a JSON list of the transitions it took part in
  (``{"alias", "version", "from_stage", "replaced_version", "kind", "at", "who", "reason", "id"}``; a version that
  loses an alias gets a ``kind="replaced"`` entry);
- on the registered model, tag ``posttrain.history.<alias>``: the JSON list of holders of that alias over time,
  which ``rollback`` replays (promotions push a holder, rollbacks pop one) to find the previous holder;
- the gate's decision in version tags ``posttrain.gate.decision`` / ``posttrain.gate.reason`` / ``posttrain.gate.at``;
- evaluation metrics in version tags ``metric.<name>`` (e.g. ``metric.final/gsm8k_accuracy``).

Transitions are read-modify-write on tags, so they run under a registry-wide mutex per model: the registered
model ``posttrain-lock.<name>`` exists while a transition holds it (creating a registered model is atomic in
every MLflow backend: a unique name). A lock older than ``LOCK_STALE_S`` seconds is broken. An alias moved in
the MLflow UI is not recorded by us; ``rollback`` then returns the alias to the last holder posttrain recorded.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Mapping

from posttrain.errors import PosttrainError

STAGES = ("candidate", "staging", "production")
TAG_TRANSITIONS = "posttrain.transitions"
TAG_HISTORY = "posttrain.history."
TAG_GATE_DECISION = "posttrain.gate.decision"
TAG_GATE_REASON = "posttrain.gate.reason"
TAG_GATE_AT = "posttrain.gate.at"
METRIC_PREFIX = "metric."
LOCK_PREFIX = "posttrain-lock."
LOCK_TIMEOUT_S = 60.0
LOCK_STALE_S = 120.0
HISTORY_KEEP = 200
USER_ENV = "POSTTRAIN_USER"


# --------------------------------------------------------------------------------------------------- basics


def current_user() -> str:
    """Who is acting: ``$POSTTRAIN_USER``, else the login name, else ``"unknown"``."""
    user = os.environ.get(USER_ENV)
    if user:
        return user
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "unknown"


def now_iso() -> str:
    """UTC time, ISO 8601 with microseconds (sorts lexically)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def git_commit() -> str | None:
    """The project's git commit: ``$POSTTRAIN_GIT_COMMIT``, else ``git rev-parse HEAD`` of this checkout, else None."""
    env = os.environ.get("POSTTRAIN_GIT_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) >= 7 else None


def get_client(tracking_uri: str | None = None):
    """An ``MlflowClient`` for ``tracking_uri`` (None -> ``tracking.resolve_uri``), also used as registry URI."""
    from mlflow import MlflowClient

    from posttrain.tracking import resolve_uri

    uri = resolve_uri(tracking_uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _is_error(exc: Exception, code: str) -> bool:
    return getattr(exc, "error_code", None) == code


def _uri_of(client) -> str:
    from posttrain.tracking import redact_uri

    return redact_uri(str(getattr(client, "_registry_uri", "") or getattr(client, "tracking_uri", "")))


def get_model(client, name: str):
    """The registered model ``name``. Raises PosttrainError naming the known models when it does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as exc:
        if not _is_error(exc, "RESOURCE_DOES_NOT_EXIST"):
            raise
    known = sorted(m.name for m in client.search_registered_models(max_results=1000) if not m.name.startswith(LOCK_PREFIX))
    raise PosttrainError(f"registered model {name!r} not found in {_uri_of(client)}; known models: "
                         f"{', '.join(known) or '(none)'}; check the name or the --tracking-uri")


def get_version(client, name: str, version: str | int):
    """Model version ``name``/``version``. Raises PosttrainError listing existing versions when it does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        if not _is_error(exc, "RESOURCE_DOES_NOT_EXIST") and not _is_error(exc, "INVALID_PARAMETER_VALUE"):
            raise
    get_model(client, name)  # raises the clear "model not found" error first
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    raise PosttrainError(f"model {name!r} has no version {version!r}; existing versions: {versions or '(none)'}")


def holder(client, name: str, alias: str) -> str | None:
    """The version (string) that holds ``alias`` on model ``name``, or None."""
    return get_model(client, name).aliases.get(alias)


def json_tag(tags: Mapping[str, str], key: str) -> list[dict]:
    """A JSON-list tag, [] when absent or unreadable."""
    try:
        value = json.loads(tags.get(key) or "[]")
    except json.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def version_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    """Metrics recorded in ``metric.<name>`` tags of a version, as floats."""
    out = {}
    for key, value in tags.items():
        if key.startswith(METRIC_PREFIX):
            with contextlib.suppress(TypeError, ValueError):
                out[key[len(METRIC_PREFIX):]] = float(value)
    return out


def history(client, name: str, alias: str) -> list[dict]:
    """Recorded holders of ``alias`` (oldest first): ``{"version", "previous", "kind", "at", "who", "reason", "id"}``."""
    return json_tag(get_model(client, name).tags, TAG_HISTORY + alias)


def version_transitions(client, name: str, version: str | int) -> list[dict]:
    """The transitions recorded on one version (oldest first)."""
    return json_tag(get_version(client, name, version).tags, TAG_TRANSITIONS)


# --------------------------------------------------------------------------------------------------- lock


@contextlib.contextmanager
def registry_lock(client, name: str, timeout_s: float = LOCK_TIMEOUT_S, stale_s: float = LOCK_STALE_S) -> Iterator[None]:
    """Mutex over transitions of model ``name``, held as the registered model ``posttrain-lock.<name>``.

    Raises PosttrainError after ``timeout_s`` seconds of waiting, naming the holder and how to clear a stale lock.
    """
    from mlflow.exceptions import MlflowException

    lock = LOCK_PREFIX + name
    me = f"{current_user()}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            client.create_registered_model(lock, tags={"holder": me, "since": str(time.time())},
                                           description="posttrain transition lock (deleted when the transition ends)")
            break
        except MlflowException as exc:
            if not _is_error(exc, "RESOURCE_ALREADY_EXISTS"):
                raise
        held_by = _break_if_stale(client, lock, stale_s)
        if held_by == me:  # our create succeeded but its reply was lost and the client retried it
            break
        if time.monotonic() > deadline:
            raise PosttrainError(f"registry lock {lock!r} is held by {held_by}; wait for it, or delete the registered "
                                 f"model {lock!r} if that process is gone")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            client.delete_registered_model(lock)


def _break_if_stale(client, lock: str, stale_s: float) -> str:
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_registered_model(lock).tags
    except MlflowException:
        return "(released)"
    with contextlib.suppress(TypeError, ValueError, MlflowException):
        if time.time() - float(tags.get("since", "")) > stale_s:
            # re-read right before deleting, so a waiter does not delete a lock another waiter just re-created
            if client.get_registered_model(lock).tags.get("holder") == tags.get("holder"):
                client.delete_registered_model(lock)
    return tags.get("holder", "(unknown)")


# --------------------------------------------------------------------------------------------------- transitions


@dataclass
class Transition:
    """One alias move: ``version`` now holds ``alias``; ``replaced_version`` held it before (None if nobody)."""

    name: str
    alias: str
    version: str
    replaced_version: str | None
    from_stage: str
    kind: str
    reason: str
    who: str = field(default_factory=current_user)
    at: str = field(default_factory=now_iso)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def record(self) -> dict:
        d = asdict(self)
        d.pop("name")
        return d


def _highest_stage(aliases: list[str]) -> str:
    held = [s for s in STAGES if s in aliases]
    return held[-1] if held else "none"


def _append_tag(client, name: str, version: str | None, key: str, entry: dict, current: Mapping[str, str]) -> None:
    entries = (json_tag(current, key) + [entry])[-HISTORY_KEEP:]
    value = json.dumps(entries, sort_keys=True)
    if version is None:
        client.set_registered_model_tag(name, key, value)
    else:
        client.set_model_version_tag(name, version, key, value)


def move_alias(client, name: str, version: str | int, alias: str, reason: str, kind: str = "promote") -> Transition:
    """Point ``alias`` at ``version`` and record the transition (version tags + model history), under the lock.

    ``kind`` is ``register`` | ``gate`` | ``promote`` | ``rollback``. Raises PosttrainError for an unknown stage,
    model or version, or an empty reason.
    """
    if alias not in STAGES:
        raise PosttrainError(f"stage {alias!r} is not one of {list(STAGES)}; use e.g. --to staging")
    if not str(reason or "").strip():
        raise PosttrainError("a transition needs a reason; pass --reason 'why this version'")
    version = str(version)
    with registry_lock(client, name):
        mv = get_version(client, name, version)
        model = client.get_registered_model(name)
        replaced = model.aliases.get(alias)
        t = Transition(name=name, alias=alias, version=version, replaced_version=replaced,
                       from_stage=_highest_stage([a for a, v in model.aliases.items() if str(v) == version]),
                       kind=kind, reason=str(reason))
        client.set_registered_model_alias(name, alias, version)
        _append_tag(client, name, version, TAG_TRANSITIONS, t.record(), mv.tags)
        if replaced and replaced != version:
            old = client.get_model_version(name, replaced)
            _append_tag(client, name, replaced, TAG_TRANSITIONS, {**t.record(), "kind": "replaced"}, old.tags)
        entry = {"version": version, "previous": replaced, "kind": kind, "at": t.at, "who": t.who,
                 "reason": t.reason, "id": t.id}
        _append_tag(client, name, None, TAG_HISTORY + alias, entry, model.tags)
    return t


def previous_holder(events: list[dict], current: str | None) -> str | None:
    """The holder to roll back to, by replaying ``events`` (promotions push, rollbacks pop) as a stack.

    If ``current`` is the top of the stack, the one below it; if the alias was moved outside posttrain (``current``
    is not the top), the top: the last holder posttrain recorded. None when there is nothing to go back to.
    """
    stack: list[str] = []
    for ev in events:
        v = str(ev.get("version"))
        if ev.get("kind") == "rollback":
            while stack and stack[-1] == str(ev.get("previous")):
                stack.pop()
            if not stack or stack[-1] != v:
                stack.append(v)
        elif not stack or stack[-1] != v:
            stack.append(v)
    if current is not None and stack and stack[-1] == str(current):
        stack.pop()
    while stack and stack[-1] == str(current):
        stack.pop()
    return stack[-1] if stack else None


def promote(name: str, version: str | int, to: str, reason: str, tracking_uri: str | None = None) -> Transition:
    """Move stage ``to`` (candidate | staging | production) of ``name`` to ``version`` with a recorded reason."""
    client = get_client(tracking_uri)
    _warn_if_gate_blocked(client, name, version)
    t = move_alias(client, name, version, to, reason, kind="promote")
    print(f"{name}: {to} -> version {t.version} (was {t.replaced_version or 'none'}) by {t.who}: {t.reason}")
    return t


def _warn_if_gate_blocked(client, name: str, version: str | int) -> None:
    """A person may overrule the gate (the reason is recorded), but should see that they are doing so."""
    import logging
    import sys

    try:
        tags = client.get_model_version(name, str(version)).tags
    except Exception:  # noqa: BLE001 - move_alias reports unknown models/versions clearly
        return
    if tags.get(TAG_GATE_DECISION) == "blocked":
        msg = (f"warning: the gate blocked {name} v{version} ({tags.get(TAG_GATE_REASON, 'no reason recorded')}); "
               "promoting it anyway, with your reason recorded")
        print(msg, file=sys.stderr)
        logging.getLogger("posttrain").warning(msg)


def rollback(name: str, stage: str, reason: str = "rollback", tracking_uri: str | None = None) -> Transition:
    """Move ``stage`` of ``name`` back to its previous recorded holder. Raises PosttrainError if there is none."""
    if stage not in STAGES:
        raise PosttrainError(f"stage {stage!r} is not one of {list(STAGES)}; use e.g. --stage production")
    client = get_client(tracking_uri)
    current = holder(client, name, stage)
    target = previous_holder(history(client, name, stage), current)
    if target is None:
        raise PosttrainError(f"model {name!r}: stage {stage!r} has no previous holder to roll back to "
                             f"(current: {current or 'none'}); promote a version with `posttrain promote` instead")
    t = move_alias(client, name, target, stage, reason, kind="rollback")
    print(f"{name}: {stage} rolled back to version {t.version} (was {t.replaced_version or 'none'}) by {t.who}: {t.reason}")
    return t


# --------------------------------------------------------------------------------------------------- listing


def _alias_order(alias: str) -> tuple:
    return (STAGES.index(alias) if alias in STAGES else len(STAGES), alias)


def _key_metrics(metrics: Mapping[str, float], limit: int = 4) -> str:
    keys = [k for k in sorted(metrics) if k.startswith("final/")] or sorted(metrics)
    keys.sort(key=lambda k: "gsm8k_accuracy" not in k)  # the headline metric first (stable sort keeps the rest)
    return ", ".join(f"{k.removeprefix('final/')}={metrics[k]:.4g}" for k in keys[:limit]) or "-"


def model_rows(client, name: str | None = None) -> list[dict]:
    """One dict per model version (newest first per model): model, version, aliases, metrics, gate, created, run."""
    models = [get_model(client, name)] if name else [
        m for m in client.search_registered_models(max_results=1000) if not m.name.startswith(LOCK_PREFIX)]
    rows = []
    for m in sorted(models, key=lambda m: m.name):
        by_version: dict[str, list[str]] = {}
        for alias, v in (m.aliases or {}).items():  # search results carry no aliases; the model does
            by_version.setdefault(str(v), []).append(alias)
        for mv in sorted(client.search_model_versions(f"name='{m.name}'"), key=lambda v: -int(v.version)):
            tags = mv.tags or {}
            rows.append({
                "model": m.name, "version": str(mv.version),
                "aliases": sorted(by_version.get(str(mv.version), []), key=_alias_order),
                "metrics": version_metrics(tags), "gate": tags.get(TAG_GATE_DECISION, "-"),
                "gate_reason": tags.get(TAG_GATE_REASON, ""), "recipe_hash": tags.get("posttrain.recipe_hash", "-"),
                "created": datetime.fromtimestamp((mv.creation_timestamp or 0) / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M"),
                "run_id": mv.run_id or "-",
            })
    return rows


def print_models(tracking_uri: str | None = None, name: str | None = None, console=None) -> list[dict]:
    """Print a rich table of registered models and versions: aliases, key metrics, gate decision, lineage.

    Returns the rows printed (see ``model_rows``). Raises PosttrainError if ``name`` is not a registered model.
    """
    from rich.console import Console
    from rich.table import Table

    from posttrain.tracking import redact_uri, resolve_uri

    client = get_client(tracking_uri)
    rows = model_rows(client, name)
    table = Table(title=f"registered models at {redact_uri(resolve_uri(tracking_uri))}")
    for col in ("model", "version", "aliases", "key metrics", "gate", "recipe", "created (UTC)", "run"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["model"], r["version"], ", ".join(r["aliases"]) or "-", _key_metrics(r["metrics"]),
                      r["gate"], r["recipe_hash"], r["created"], r["run_id"][:12])
    if console is None:  # piped output (CI logs, tests) gets a wide table instead of 80 wrapped columns
        import sys

        console = Console() if sys.stdout.isatty() else Console(width=160)
    if rows:
        console.print(table)
    else:
        console.print("no registered models" + (f" named {name!r}" if name else ""))
    return rows


# --------------------------------------------------------------------------------------------------- gate


@dataclass
class GateDecision:
    """The gate's verdict: ``passed``, one line per check in ``checks`` and the failing ones in ``failures``."""

    passed: bool
    checks: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        lines = self.failures if not self.passed else self.checks
        return "; ".join(lines) or "no thresholds set"


def resolve_metric(name: str, metrics: Mapping[str, float]) -> str | None:
    """The key of ``name`` in ``metrics``: itself, else ``final/<name>`` (short names mean the final model)."""
    if name in metrics:
        return name
    if f"final/{name}" in metrics:
        return f"final/{name}"
    return None


def decide_gate(metrics: Mapping[str, float], thresholds: Mapping[str, float], max_regression: float,
                incumbents: Mapping[str, tuple[str, Mapping[str, float]]]) -> GateDecision:
    """Gate decision, pure: every threshold metric must be present, >= its minimum, and no more than
    ``max_regression`` (absolute, in the metric's units) below each incumbent's value.

    ``incumbents`` maps a stage (staging, production) to ``(version, metrics)`` of its current holder; a holder
    without the metric is not compared (noted in ``checks``).
    """
    d = GateDecision(passed=True)
    for name, minimum in sorted(thresholds.items()):
        key = resolve_metric(name, metrics)
        if key is None:
            d.failures.append(f"{name}: missing from the evaluation (have: {', '.join(sorted(metrics)) or 'none'})")
            continue
        value = float(metrics[key])
        if value < minimum:
            d.failures.append(f"{key}={value:.4g} < threshold {minimum:.4g}")
        else:
            d.checks.append(f"{key}={value:.4g} >= threshold {minimum:.4g}")
        for stage, (version, inc_metrics) in sorted(incumbents.items()):
            inc_key = resolve_metric(name, inc_metrics)
            if inc_key is None:
                d.checks.append(f"{key}: {stage} v{version} has no value to compare")
                continue
            drop = float(inc_metrics[inc_key]) - value
            line = (f"{key}={value:.4g} vs {stage} v{version} {float(inc_metrics[inc_key]):.4g} "
                    f"(drop {drop:.4g}, allowed {max_regression:.4g})")
            (d.failures if drop > max_regression + 1e-12 else d.checks).append(line)
    d.passed = not d.failures
    return d


def incumbents(client, name: str, version: str, stages: tuple[str, ...] = ("staging", "production")) -> dict:
    """``{stage: (version, metrics)}`` for the current holders of ``stages`` other than ``version`` itself."""
    out = {}
    aliases = get_model(client, name).aliases
    for stage in stages:
        held = aliases.get(stage)
        if held and str(held) != str(version):
            out[stage] = (str(held), version_metrics(client.get_model_version(name, held).tags))
    return out


def run_gate(client, name: str, version: str | int, metrics: Mapping[str, float], thresholds: Mapping[str, float],
             max_regression: float) -> GateDecision:
    """Decide, record the decision on the version's tags, and move ``staging`` to the version when it passed."""
    version = str(version)
    get_version(client, name, version)
    decision = decide_gate(metrics, thresholds, max_regression, incumbents(client, name, version))
    verdict = "passed" if decision.passed else "blocked"
    client.set_model_version_tag(name, version, TAG_GATE_DECISION, verdict)
    client.set_model_version_tag(name, version, TAG_GATE_REASON, decision.reason[:5000])
    client.set_model_version_tag(name, version, TAG_GATE_AT, now_iso())
    if decision.passed:
        move_alias(client, name, version, "staging", f"gate passed: {decision.reason}", kind="gate")
    return decision


def register_version(client, name: str, source: str, run_id: str, tags: Mapping[str, str],
                     reason: str = "registered by the pipeline"):
    """Create version of ``name`` (creating the model if needed) from ``source``, tag it, move ``candidate`` to it.

    Returns the ModelVersion.
    """
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="posttrain model (see version tags for lineage)")
    except MlflowException as exc:
        if not _is_error(exc, "RESOURCE_ALREADY_EXISTS"):
            raise
    mv = client.create_model_version(name, source, run_id=run_id, tags={k: str(v) for k, v in tags.items()})
    move_alias(client, name, mv.version, "candidate", reason, kind="register")
    return client.get_model_version(name, mv.version)
