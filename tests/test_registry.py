"""Registry: register -> gate -> promote -> rollback against a real ``mlflow server`` on loopback (session fixture).

Every step checks the aliases and the recorded transition history; the gate's blocking decisions and reasons;
two concurrent promotions leave one holder and both transitions recorded.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest

from posttrain import registry
from posttrain.artifacts import sha256_file
from posttrain.errors import PosttrainError, StageError
from posttrain.recipe import Recipe

# ----------------------------------------------------------------------------------------------- pure logic


def test_decide_gate_thresholds_short_names_and_regression():
    metrics = {"final/gsm8k_accuracy": 0.30, "base/gsm8k_accuracy": 0.10, "final/pref_acc": 0.6}
    ok = registry.decide_gate(metrics, {"gsm8k_accuracy": 0.25}, 0.05, {"staging": ("2", {"final/gsm8k_accuracy": 0.34})})
    assert ok.passed, ok.reason  # drop 0.04 <= 0.05 allowed
    low = registry.decide_gate(metrics, {"gsm8k_accuracy": 0.31}, 0.0, {})
    assert not low.passed and "final/gsm8k_accuracy=0.3 < threshold 0.31" in low.reason
    reg = registry.decide_gate(metrics, {"final/gsm8k_accuracy": 0.1}, 0.05, {"production": ("7", {"final/gsm8k_accuracy": 0.40})})
    assert not reg.passed and "production v7" in reg.reason and "drop 0.1" in reg.reason
    missing = registry.decide_gate(metrics, {"reward_accuracy": 0.5}, 0.0, {})
    assert not missing.passed and "reward_accuracy: missing" in missing.reason and "final/pref_acc" in missing.reason
    assert registry.decide_gate(metrics, {}, 0.0, {"staging": ("1", {"final/gsm8k_accuracy": 0.9})}).passed


def test_previous_holder_replays_promotions_and_rollbacks():
    ev = lambda v, kind="promote", prev=None: {"version": v, "kind": kind, "previous": prev}  # noqa: E731
    h = [ev("1"), ev("2"), ev("3")]
    assert registry.previous_holder(h, "3") == "2"
    h.append(ev("2", "rollback", "3"))
    assert registry.previous_holder(h, "2") == "1"  # a second rollback goes further back, not back to 3
    h.append(ev("1", "rollback", "2"))
    assert registry.previous_holder(h, "1") is None
    assert registry.previous_holder([ev("1"), ev("2")], "5") == "2"  # moved in the UI: back to the last recorded
    assert registry.previous_holder([], None) is None


# ----------------------------------------------------------------------------------------------- against mlflow server


@pytest.fixture()
def env(mlflow_server, tmp_path, monkeypatch, shared_data):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("POSTTRAIN_USER", "alice")
    monkeypatch.setenv("POSTTRAIN_PARENT_RUN_ID", "")
    monkeypatch.chdir(tmp_path)
    name = f"m-{uuid.uuid4().hex[:8]}"
    recipe = Recipe.model_validate({
        "name": "tiny", "model": {"name_or_path": str(shared_data / "stories260K" / "hf")},
        "sft": {"enabled": False}, "reward": {"enabled": False}, "algorithm": "grpo",
        "data": {"prompts": {"source": str(shared_data / "gsm8k" / "test.jsonl"), "format": "gsm8k"}},
        "tracking": {"uri": mlflow_server, "experiment": "registry-tests", "registered_model": name},
        "gate": {"thresholds": {"gsm8k_accuracy": 0.1}, "max_regression": 0.05},
    })
    return recipe, name, tmp_path


def _evaluation(tmp: Path, tag: str, acc: float) -> str:
    d = tmp / f"eval-{tag}"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"final/gsm8k_accuracy": acc, "base/gsm8k_accuracy": 0.02}))
    return str(d)


def _tiny_model(tmp: Path) -> str:
    d = tmp / "fake-model"
    if not d.exists():
        d.mkdir()
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"0" * 16)
    return str(d)


def _register(recipe, tmp: Path, tag: str, acc: float, model: str | None = None, fast: bool = False) -> dict:
    """Register a version: through the real register stage, or (``fast``) straight through the registry with the
    same metric tags and a registration.json written here (fewer server round trips on a busy machine)."""
    from posttrain.artifacts import write_json_atomic
    from posttrain.stages import register

    out = tmp / f"register-{tag}"
    if fast:
        name = recipe.tracking.registered_model
        ev = _evaluation(tmp, tag, acc)
        tags = {f"metric.{k}": repr(v) for k, v in register.read_metrics(ev).items()}
        mv = registry.register_version(registry.get_client(None), name, "s3://posttrain-tests/model", None, tags)
        reg = {"name": name, "version": str(mv.version), "run_id": None, "tags": tags}
        write_json_atomic(out / "registration.json", reg)
        return reg
    res = register.run(recipe, {"model": model or _tiny_model(tmp), "evaluation": _evaluation(tmp, tag, acc)}, str(out))
    assert res.metrics["register/version"] >= 1
    return json.loads((out / "registration.json").read_text())


def _gate(recipe, tmp: Path, reg_tag: str, eval_tag: str):
    from posttrain.stages import gate

    return gate.run(recipe, {"registration": str(tmp / f"register-{reg_tag}"), "evaluation": str(tmp / f"eval-{eval_tag}")},
                    str(tmp / f"gate-{reg_tag}"))


def test_register_gate_promote_rollback_push(env, shared_data):
    from posttrain import hub

    recipe, name, tmp = env
    client = registry.get_client(None)
    model_dir = str(shared_data / "stories260K" / "hf")
    r1 = _register(recipe, tmp, "1", 0.30, model=model_dir)
    assert (r1["name"], r1["version"]) == (name, "1")
    mv1 = client.get_model_version(name, "1")
    assert mv1.aliases == ["candidate"]
    assert float(mv1.tags["metric.final/gsm8k_accuracy"]) == 0.30
    assert mv1.tags["posttrain.recipe_hash"] == recipe.hash()
    gsm = str(shared_data / "gsm8k" / "test.jsonl")
    assert json.loads(mv1.tags["posttrain.data_hashes"])[gsm] == sha256_file(gsm)
    t = json.loads(mv1.tags[registry.TAG_TRANSITIONS])
    assert [(x["alias"], x["kind"], x["from_stage"], x["who"]) for x in t] == [("candidate", "register", "none", "alice")]

    g1 = _gate(recipe, tmp, "1", "1")
    assert g1.metrics["gate/passed"] == 1.0 and "final/gsm8k_accuracy=0.3 >= threshold 0.1" in g1.notes[0]
    assert registry.holder(client, name, "staging") == "1"
    assert client.get_model_version(name, "1").tags[registry.TAG_GATE_DECISION] == "passed"

    registry.promote(name, 1, "production", "first release", tracking_uri=None)
    _register(recipe, tmp, "2", 0.50, fast=True)
    assert registry.holder(client, name, "candidate") == "2" and registry.holder(client, name, "production") == "1"
    assert _gate(recipe, tmp, "2", "2").metrics["gate/passed"] == 1.0
    registry.promote(name, "2", "production", "better on gsm8k", tracking_uri=None)
    assert registry.holder(client, name, "production") == "2"
    v1_kinds = [(x["alias"], x["kind"]) for x in registry.version_transitions(client, name, 1)]
    assert v1_kinds == [("candidate", "register"), ("staging", "gate"), ("production", "promote"),
                        ("candidate", "replaced"), ("staging", "replaced"), ("production", "replaced")]

    t_back = registry.rollback(name, "production", "v2 breaks the chat format", tracking_uri=None)
    assert (t_back.version, t_back.replaced_version, t_back.kind) == ("1", "2", "rollback")
    assert registry.holder(client, name, "production") == "1"
    last = registry.version_transitions(client, name, 1)[-1]
    assert (last["alias"], last["kind"], last["reason"], last["who"]) == ("production", "rollback", "v2 breaks the chat format", "alice")
    assert [h["version"] for h in registry.history(client, name, "production")] == ["1", "2", "1"]
    with pytest.raises(PosttrainError, match="no previous holder"):
        registry.rollback(name, "production", "again", tracking_uri=None)

    from rich.console import Console

    console = Console(record=True, width=200)
    rows = registry.print_models(None, name=name, console=console)
    assert [(r["version"], r["aliases"], r["gate"]) for r in rows] == [
        ("2", ["candidate", "staging"], "passed"), ("1", ["production"], "passed")]
    text = console.export_text()
    assert "gsm8k_accuracy=0.5" in text and "candidate, staging" in text

    dest = tmp / "pushed"
    report = hub.push_registered(f"{name}@production", str(dest), tracking_uri=None)
    manifest = hub.verify_push(str(dest))
    assert manifest["source"]["version"] == "1" and report.uploaded == 8  # 7 model files + README.md
    for f in Path(model_dir).iterdir():
        assert sha256_file(dest / f.name) == sha256_file(f)
    card = (dest / "README.md").read_text()
    assert "| gsm8k_accuracy | 0.02 | 0.3 | +0.28 |" in card and recipe.hash() in card and "| MIT |" in card


def test_gate_blocks_below_threshold_and_on_regression(env, capsys):
    recipe, name, tmp = env
    client = registry.get_client(None)
    _register(recipe, tmp, "1", 0.50, fast=True)
    assert _gate(recipe, tmp, "1", "1").metrics["gate/passed"] == 1.0
    _register(recipe, tmp, "2", 0.05, fast=True)  # below the 0.1 threshold
    res = _gate(recipe, tmp, "2", "2")
    assert res.metrics["gate/passed"] == 0.0 and "final/gsm8k_accuracy=0.05 < threshold 0.1" in res.notes[0]
    tags = client.get_model_version(name, "2").tags
    assert tags[registry.TAG_GATE_DECISION] == "blocked" and "< threshold 0.1" in tags[registry.TAG_GATE_REASON]
    assert registry.holder(client, name, "staging") == "1"
    _register(recipe, tmp, "3", 0.40, fast=True)  # above threshold, but 0.10 below staging v1 (allowed 0.05)
    recipe.gate.fail_on_block = True
    with pytest.raises(StageError, match=r"staging v1 0.5 \(drop 0.1, allowed 0.05\)"):
        _gate(recipe, tmp, "3", "3")
    assert client.get_model_version(name, "3").tags[registry.TAG_GATE_DECISION] == "blocked"
    assert registry.holder(client, name, "staging") == "1"
    # a person may overrule the gate, but is told so; the move is recorded with their reason
    registry.promote(name, 2, "production", "hotfix: accepted lower accuracy", tracking_uri=None)
    assert "the gate blocked" in capsys.readouterr().err
    assert registry.holder(client, name, "production") == "2"


def test_concurrent_promotions_leave_one_holder_and_both_recorded(env):
    recipe, name, tmp = env
    client = registry.get_client(None)
    for _ in range(2):
        registry.register_version(client, name, "s3://posttrain-tests/model", None, {})
    barrier, errors = threading.Barrier(2), []

    def go(v):
        barrier.wait()
        try:
            registry.promote(name, v, "production", f"race {v}", tracking_uri=None)
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(v,)) for v in ("1", "2")]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    hist = registry.history(client, name, "production")
    assert sorted(h["reason"] for h in hist) == ["race 1", "race 2"]
    final = registry.holder(client, name, "production")
    assert final == hist[-1]["version"] and hist[-1]["previous"] == hist[0]["version"] and hist[0]["previous"] is None
    for v in ("1", "2"):
        assert [x["reason"] for x in registry.version_transitions(client, name, v) if x["kind"] == "promote"] == [f"race {v}"]
    assert not [m for m in client.search_registered_models() if m.name == registry.LOCK_PREFIX + name]


def test_clear_errors_for_unknown_model_version_and_stage(env):
    recipe, name, tmp = env
    with pytest.raises(PosttrainError, match="registered model 'nope-.*' not found"):
        registry.promote(f"nope-{name}", 1, "staging", "x", tracking_uri=None)
    registry.register_version(registry.get_client(None), name, "s3://posttrain-tests/model", None, {})
    with pytest.raises(PosttrainError, match=r"has no version '9'; existing versions: \[1\]"):
        registry.promote(name, 9, "staging", "x", tracking_uri=None)
    with pytest.raises(PosttrainError, match="not one of"):
        registry.promote(name, 1, "prod", "x", tracking_uri=None)
    with pytest.raises(PosttrainError, match="no previous holder"):
        registry.rollback(name, "staging", "x", tracking_uri=None)


def test_push_stage_respects_gate_and_cli_commands(env, capsys):
    from posttrain import hub
    from posttrain.cli import main
    from posttrain.stages import push

    recipe, name, tmp = env
    recipe.push.destination = "buckets/{name}"  # relative: resolves against the CWD (tmp)
    model = _tiny_model(tmp)
    _register(recipe, tmp, "1", 0.05, fast=True)
    assert _gate(recipe, tmp, "1", "1").metrics["gate/passed"] == 0.0
    inputs = {"model": model, "evaluation": str(tmp / "eval-1"), "registration": str(tmp / "register-1"),
              "gate_result": str(tmp / "gate-1")}
    res = push.run(recipe, inputs, str(tmp / "push-1"))
    assert res.metrics["push/pushed"] == 0.0 and "the gate blocked version 1" in res.notes[0]
    assert not (tmp / "buckets").exists()
    _register(recipe, tmp, "2", 0.5, fast=True)
    _gate(recipe, tmp, "2", "2")
    inputs = {"model": model, "evaluation": str(tmp / "eval-2"), "registration": str(tmp / "register-2"),
              "gate_result": str(tmp / "gate-2")}
    res = push.run(recipe, inputs, str(tmp / "push-2"))
    assert res.metrics["push/pushed"] == 1.0 and res.metrics["push/uploaded"] == 3  # config, weights, README.md
    manifest = hub.verify_push(str(tmp / "buckets" / "tiny"))
    assert manifest["source"]["version"] == "2" and manifest["source"]["gate"] == "passed"
    client = registry.get_client(None)
    assert client.get_model_version(name, "2").tags["posttrain.push.destination"] == str(tmp / "buckets" / "tiny")

    capsys.readouterr()
    assert main(["promote", name, "--version", "2", "--to", "production", "--reason", "ship it"]) == 0
    assert main(["models", name]) == 0
    out = capsys.readouterr().out
    assert "production -> version 2" in out and "candidate, staging, production" in out and "blocked" in out
    assert main(["rollback", name, "--stage", "production"]) == 1
    assert "no previous holder" in capsys.readouterr().err


def test_lock_times_out_naming_the_holder_and_breaks_when_stale(env):
    import time

    recipe, name, tmp = env
    client = registry.get_client(None)
    lock = registry.LOCK_PREFIX + name
    client.create_registered_model(lock, tags={"holder": "bob@other-host:42", "since": str(time.time())})
    with pytest.raises(PosttrainError, match="held by bob@other-host:42"):
        with registry.registry_lock(client, name, timeout_s=0.3):
            pass
    client.set_registered_model_tag(lock, "since", str(time.time() - registry.LOCK_STALE_S - 1))
    with registry.registry_lock(client, name, timeout_s=10):  # the crashed holder's lock is broken
        assert client.get_registered_model(lock).tags["holder"].startswith("alice@")
    assert not [m for m in client.search_registered_models() if m.name == lock]
