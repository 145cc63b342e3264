"""Recipe validation: every shipped recipe validates; broken ones are rejected naming field, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from posttrain.recipe import Recipe, RecipeError, apply_overrides, check_paths, load_recipe, validate_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "pipelines" / "recipes").glob("*.yaml"))


def _raw(name: str = "tiny-cpu.yaml") -> dict:
    return yaml.safe_load((ROOT / "pipelines" / "recipes" / name).read_text())


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_validates(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe)
    # local paths named by the shipped recipes exist (the GPU recipe uses hub ids, which are not checked)
    assert check_paths(recipe) == []


def test_there_are_shipped_recipes():
    names = {p.name for p in RECIPES}
    assert "tiny-cpu.yaml" in names and len(names) >= 2


def _problems(raw: dict) -> dict[str, object]:
    with pytest.raises(RecipeError) as info:
        validate_recipe(raw)
    return {p.field: p for p in info.value.problems}


def test_unknown_key_is_rejected_with_its_path():
    raw = _raw()
    raw["rl"]["max_stalenes"] = 3
    probs = _problems(raw)
    assert "rl.max_stalenes" in probs
    assert "unknown key" in probs["rl.max_stalenes"].message


def test_wrong_type_and_out_of_range_reported_together():
    raw = _raw()
    raw["sft"]["max_steps"] = "many"
    raw["rl"]["temperature"] = -1.0
    raw["dpo"]["beta"] = 0
    probs = _problems(raw)
    assert set(probs) >= {"sft.max_steps", "rl.temperature", "dpo.beta"}
    assert probs["sft.max_steps"].value == "many"
    assert probs["rl.temperature"].value == -1.0
    assert "greater than 0" in probs["rl.temperature"].message


def test_unknown_algorithm_names_the_choices():
    raw = _raw()
    raw["algorithm"] = "reinforce"
    probs = _problems(raw)
    assert probs["algorithm"].value == "reinforce"
    assert "grpo" in probs["algorithm"].message and "dpo" in probs["algorithm"].message


def test_grpo_needs_two_generations():
    raw = _raw()
    raw["rl"]["num_generations"] = 1
    probs = _problems(raw)
    assert probs["rl.num_generations"].value == 1
    assert "set it to 2 or more" in probs["rl.num_generations"].message


def test_missing_model_is_reported():
    raw = _raw()
    del raw["model"]
    assert "model" in _problems(raw)


def test_overrides_parse_yaml_scalars_and_nested_keys():
    raw = apply_overrides(_raw(), ["rl.max_steps=7", "rl.mode=sync", "model.lora.enabled=true", "rl.temperature=0.7"])
    r = validate_recipe(raw)
    assert (r.rl.max_steps, r.rl.mode, r.model.lora.enabled, r.rl.temperature) == (7, "sync", True, 0.7)


def test_override_without_equals_is_an_error():
    with pytest.raises(RecipeError, match="dotted.key=value"):
        apply_overrides(_raw(), ["rl.max_steps"])


def test_missing_paths_are_reported_before_loading(tmp_path):
    raw = _raw()
    raw["model"]["name_or_path"] = str(tmp_path / "nope")
    raw["data"]["prompts"]["source"] = str(tmp_path / "missing.jsonl")
    probs = {p.field: p for p in check_paths(validate_recipe(raw))}
    assert "directory not found" in probs["model.name_or_path"].message
    assert probs["data.prompts.source"].value.endswith("missing.jsonl")


def test_model_dir_without_weights_or_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    raw = _raw()
    raw["model"]["name_or_path"] = str(tmp_path)
    messages = " | ".join(p.message for p in check_paths(validate_recipe(raw)))
    assert "no weights" in messages and "no tokenizer" in messages


def test_recipe_hash_is_stable_and_sensitive():
    a = validate_recipe(_raw())
    b = validate_recipe(_raw())
    raw = _raw()
    raw["rl"]["max_steps"] += 1
    assert a.hash() == b.hash() != validate_recipe(raw).hash()
    assert Recipe.from_json(a.to_json()) == a


def test_actors_must_divide_among_learners():
    raw = _raw()
    raw["rl"].update(num_actors=3, num_learners=2)
    probs = _problems(raw)
    assert probs["rl.num_actors"].value == 3 and "multiple of rl.num_learners=2" in probs["rl.num_actors"].message


def test_completion_must_fit_the_context():
    raw = _raw()
    raw["rl"]["max_new_tokens"] = 600
    probs = _problems(raw)
    assert "model.max_seq_len=512" in probs["rl.max_new_tokens"].message


def test_schema_spells_out_choices_and_nested_dataset_fields():
    from posttrain.recipe import schema_markdown

    md = schema_markdown()
    assert "`data.sft[].format`" in md and "'hh_rlhf'" in md
    assert "`data.prompts.max_rows`" in md
    assert "'sigmoid' \\| 'ipo' \\| 'hinge'" in md
    assert "| `model.name_or_path` | str | **required** |" in md
