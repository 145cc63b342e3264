"""Actor-side rewards: verifiable + keyword + a real reward model (a sequence classifier saved from stories260K
with a freshly initialised score head), combined with the recipe's weights."""

import pytest
import torch

from posttrain.recipe import RLRewardsSpec
from posttrain.rl.scoring import make_scorer


def test_weights_combine_verifiable_keyword_and_reward_model(tmp_path, stories260k):
    from transformers import AutoModelForSequenceClassification

    from posttrain.models import load_tokenizer
    from posttrain.rewards import RewardModelScorer

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(stories260k, num_labels=1)
    tok, _ = load_tokenizer(stories260k)
    rm.config.pad_token_id = tok.pad_token_id
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    spec = RLRewardsSpec(correctness=1.0, format=0.5, reward_model=2.0, keyword="!", keyword_weight=0.25)
    scorer = make_scorer(spec, str(tmp_path / "rm"))
    prompts = ["Question: 2+2?\nAnswer:"] * 3
    completions = [" It is 4.\n#### 4", " Wow! 5", " no"]
    totals, parts = scorer.score(prompts, completions, ["4", "4", "4"])
    rm_scores = RewardModelScorer(str(tmp_path / "rm")).score(prompts, completions)
    assert parts["correctness"] == [1.0, 0.0, 0.0] and parts["format"] == [1.0, 0.0, 0.0]
    assert parts["keyword"] == [0.0, 1.0, 0.0]
    assert parts["reward_model"] == pytest.approx(rm_scores)
    expected = [1.0 + 0.5 + 2 * rm_scores[0], 0.25 + 2 * rm_scores[1], 2 * rm_scores[2]]
    assert totals == pytest.approx(expected, abs=1e-6)


def test_reward_model_weight_without_a_model_is_a_clear_error():
    with pytest.raises(ValueError, match="rl.rewards.reward_model > 0"):
        make_scorer(RLRewardsSpec(reward_model=1.0), None)
