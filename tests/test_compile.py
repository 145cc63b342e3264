"""Committed generated files (compiled pipeline YAML, component specs) match a fresh compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def compiled(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("POSTTRAIN_IMAGE", raising=False)
    from posttrain.orchestrate.kfp_pipeline import compile_components, compile_pipeline
    from posttrain.recipe import load_recipe

    recipe = load_recipe(ROOT / "pipelines/recipes/tiny-cpu.yaml")
    pipe = compile_pipeline(recipe, tmp_path / "posttrain.yaml")
    comps = compile_components(tmp_path / "components")
    return pipe, comps, tmp_path


def test_compiled_pipeline_matches_committed(compiled):
    pipe, _, _ = compiled
    committed = ROOT / "pipelines/kfp/posttrain.yaml"
    assert committed.read_text() == pipe.read_text(), "run `make compile` and commit pipelines/kfp/posttrain.yaml"


def test_component_specs_match_committed(compiled):
    _, comps, tmp = compiled
    for path in comps:
        rel = path.relative_to(tmp / "components")
        committed = ROOT / "components" / rel
        assert committed.is_file(), f"missing components/{rel}; run `make compile`"
        assert committed.read_text() == path.read_text(), f"components/{rel} is stale; run `make compile`"


def test_run_form_parameters_have_defaults_and_descriptions(compiled):
    pipe, _, _ = compiled
    spec = yaml.safe_load(pipe.read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"recipe_json", "algorithm", "model_name_or_path", "overrides", "parent_run_id"}
    for name, p in params.items():
        assert p.get("description"), f"{name} has no description"
    assert params["algorithm"]["defaultValue"] == "grpo"
    # both branches are in the DAG, each with its own evaluate -> register -> gate -> push tail
    tasks = spec["root"]["dag"]["tasks"]
    assert {"rl-branch", "dpo-branch"} <= {t.get("taskInfo", {}).get("name") for t in tasks.values()}
