"""Held-out metrics of posttrain.evaluation against hand computations, and batching invariants on stories260K."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from posttrain import evaluation as ev

MODEL = Path(__file__).resolve().parents[2] / "shared" / "data" / "stories260K" / "hf"


# ------------------------------------------------------------------------------------------- pairwise accuracy


def test_pairwise_accuracy_counts_ties_as_half():
    # pair 1: 2.0 > 1.0 right; pair 2: 0.5 < 0.7 wrong; pair 3: tie -> 0.5; pair 4: -1 > -3 right
    assert ev.pairwise_accuracy([2.0, 0.5, 0.3, -1.0], [1.0, 0.7, 0.3, -3.0]) == pytest.approx((1 + 0 + 0.5 + 1) / 4)


def test_pairwise_accuracy_rejects_bad_input():
    with pytest.raises(ValueError, match="2 chosen scores but 1 rejected"):
        ev.pairwise_accuracy([1.0, 2.0], [0.0])
    with pytest.raises(ValueError, match="no pairs"):
        ev.pairwise_accuracy([], [])
    with pytest.raises(ValueError, match="NaN"):
        ev.pairwise_accuracy([float("nan")], [0.0])


# ------------------------------------------------------------------------------------------- DPO implicit reward


def _logits_for(probs_per_position):
    """[1, seq, 2] logits whose softmax at each position is the given 2-token distribution."""
    import torch

    return torch.log(torch.tensor([probs_per_position], dtype=torch.float32))


def test_dpo_metrics_on_two_token_toy_match_hand_computation():
    """Vocab {0, 1}; sequence = [prompt 0, completion a, completion b]; positions 0 and 1 predict a and b."""
    import torch

    beta = 0.1
    chosen = torch.tensor([[0, 1, 1]])
    rejected = torch.tensor([[0, 0, 1]])
    mask = torch.tensor([[0, 1, 1]])
    # policy: P(a=1)=0.8, P(b=1)=0.6 ; reference: P(a=1)=0.5, P(b=1)=0.5 (the last position predicts nothing)
    pol = _logits_for([[0.2, 0.8], [0.4, 0.6], [0.5, 0.5]])
    ref = _logits_for([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    lp = {(n, k): float(ev.sequence_logprobs(lg, ids, mask)[0])
          for n, lg in (("pol", pol), ("ref", ref)) for k, ids in (("c", chosen), ("r", rejected))}
    assert lp["pol", "c"] == pytest.approx(math.log(0.8) + math.log(0.6), abs=1e-6)
    assert lp["pol", "r"] == pytest.approx(math.log(0.2) + math.log(0.6), abs=1e-6)
    assert lp["ref", "c"] == pytest.approx(2 * math.log(0.5), abs=1e-6)
    m = ev.dpo_pair_metrics([lp["pol", "c"]], [lp["pol", "r"]], [lp["ref", "c"]], [lp["ref", "r"]], beta)
    r_c = beta * (math.log(0.8 * 0.6) - math.log(0.25))  # = 0.0652...
    r_r = beta * (math.log(0.2 * 0.6) - math.log(0.25))  # = -0.0734...
    assert m["chosen_reward"] == pytest.approx(r_c, abs=1e-6)
    assert m["rejected_reward"] == pytest.approx(r_r, abs=1e-6)
    assert m["margin"] == pytest.approx(beta * math.log(0.8 / 0.2), abs=1e-6)  # the shared b token cancels
    assert m["reward_accuracy"] == 1.0


def test_dpo_metrics_are_chance_when_policy_equals_reference():
    m = ev.dpo_pair_metrics([-3.0, -5.0], [-4.0, -1.0], [-3.0, -5.0], [-4.0, -1.0], beta=0.5)
    assert m == {"reward_accuracy": 0.5, "margin": 0.0, "chosen_reward": 0.0, "rejected_reward": 0.0}


def test_dpo_metrics_average_over_pairs():
    # rewards: chosen [0.5*(−1−(−2)), 0.5*(−3−(−1))] = [0.5, −1.0]; rejected [0.5*(−2−(−2)), 0.5*(−1−(−2))] = [0, 0.5]
    m = ev.dpo_pair_metrics([-1.0, -3.0], [-2.0, -1.0], [-2.0, -1.0], [-2.0, -2.0], beta=0.5)
    assert m["reward_accuracy"] == 0.5
    assert m["margin"] == pytest.approx(((0.5 - 0.0) + (-1.0 - 0.5)) / 2)


# ------------------------------------------------------------------------------------------- GSM8K


def test_gsm8k_metrics_on_fixed_completions():
    completions = [
        "She sold 48 + 24 = 72 clips.\n#### 72",  # right, formatted
        "The answer is 1,000",                    # right by last-number fallback, not formatted
        "#### 5",                                 # wrong, formatted
        "once upon a time there was a cat",       # no number at all
    ]
    golds = ["72", "1000", "6", "3"]
    m = ev.gsm8k_metrics(completions, golds)
    assert m["accuracy"] == pytest.approx(2 / 4)
    assert m["format_rate"] == pytest.approx(2 / 4)
    assert m["answer_rate"] == pytest.approx(3 / 4)


# ------------------------------------------------------------------------------------------- tokenisation / batching


@pytest.fixture(scope="module")
def tiny():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.pad_token = tok.unk_token
    model = AutoModelForCausalLM.from_pretrained(MODEL)
    return model, tok


def test_tokenize_prompt_completion_appends_eos_and_marks_completion_start(tiny):
    _, tok = tiny
    ids, start = ev.tokenize_prompt_completion(tok, "Question: hi\nAnswer:", " 5")
    prompt_ids = tok("Question: hi\nAnswer:")["input_ids"]
    assert ids[:start] == prompt_ids and ids[0] == tok.bos_token_id
    assert ids[-1] == tok.eos_token_id and start < len(ids) - 1
    ids2, start2 = ev.tokenize_prompt_completion(tok, "Question: hi\nAnswer:", " 5", max_len=start + 1)
    assert ids2 == ids[: start + 1] and start2 == start


def test_completion_logprobs_are_independent_of_batching_and_match_a_direct_forward(tiny):
    import torch

    model, tok = tiny
    prompts = ["Once upon a time", "Question: what is 2+2?\nAnswer:", "Lily"]
    comps = [" there was a dog.", " 4", " went to the park and played with her big red ball."]
    batched, n_b = ev.completion_logprobs(model, tok, prompts, comps, batch_size=3)
    single, n_s = ev.completion_logprobs(model, tok, prompts, comps, batch_size=1)
    assert n_b == n_s
    assert batched == pytest.approx(single, abs=1e-4)
    ids, start = ev.tokenize_prompt_completion(tok, prompts[2], comps[2])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
    direct = sum(float(logp[t - 1, ids[t]]) for t in range(start, len(ids)))
    assert batched[2] == pytest.approx(direct, abs=1e-4)
    assert n_b[2] == len(ids) - start
    nll = ev.completion_nll(model, tok, prompts, comps, batch_size=2)
    assert nll == pytest.approx(-sum(single) / sum(n_s), abs=1e-5)


def test_greedy_generation_with_left_padding_equals_one_prompt_at_a_time(tiny):
    model, tok = tiny
    prompts = ["Once upon a time", "Question: Tom has 3 apples and eats one. How many are left?\nAnswer:", "The cat"]
    batched = ev.generate_greedy(model, tok, prompts, max_new_tokens=12, batch_size=3, stop_ids=[1, 2])
    single = [ev.generate_greedy(model, tok, [p], max_new_tokens=12, batch_size=1, stop_ids=[1, 2])[0] for p in prompts]
    assert batched == single
    assert tok.padding_side == "right"  # restored
    assert batched[0].strip()  # the tiny model continues a story prompt with real text


def test_cut_at_stop():
    assert ev._cut_at_stop([5, 6, 2, 7], [1, 2]) == [5, 6]
    assert ev._cut_at_stop([5, 6], [1, 2]) == [5, 6]
