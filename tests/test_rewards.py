"""Verifiable GSM8K rewards (truth tables) and the reward-model scorer against a direct forward pass."""

from __future__ import annotations

import json

import pytest

from posttrain.rewards import combined_reward, extract_answer, format_reward, gsm8k_correct


# ----------------------------------------------------------------------------------------------- extract_answer


def _gsm8k_row_with_comma_answer(path):
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row["answer"].rsplit("####", 1)[1].strip() == "9,492":
                return row
    raise AssertionError("the real train.jsonl has a '#### 9,492' row")


def test_extract_answer_real_comma_gold(shared_data):
    row = _gsm8k_row_with_comma_answer(shared_data / "gsm8k" / "train.jsonl")
    assert extract_answer(row["answer"]) == "9492"
    assert gsm8k_correct(row["answer"], "9492") == 1.0
    assert gsm8k_correct(row["answer"], "9,492") == 1.0
    assert gsm8k_correct(row["answer"], "9493") == 0.0


def test_extract_answer_first_real_rows(shared_data):
    rows = [json.loads(line) for line in open(shared_data / "gsm8k" / "train.jsonl")][:3]
    assert [extract_answer(r["answer"]) for r in rows] == ["72", "10", "5"]


@pytest.mark.parametrize("text,expected", [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
    ("#### -3.5", "-3.5"),
    ("#### 1,234,567", "1234567"),
    ("#### $1,000.00", "1000.00"),
    ("#### 72 apples", "72"),
    ("#### 3/2", "3/2"),
    ("first #### 5 then #### 6", "6"),
    ("she had 3 and gave 12 away", "12"),       # fallback: last number
    ("ends with <<2*3=6>> nothing", None),        # annotations ignored, no number left
    ("the loss was -47 dollars.", "-47"),
    ("", None),
    ("no digits here", None),
])
def test_extract_answer_table(text, expected):
    assert extract_answer(text) == expected


# ----------------------------------------------------------------------------------------------- gsm8k_correct


@pytest.mark.parametrize("completion,gold,expected", [
    ("... #### 72", "72", 1.0),
    ("... #### 72.0", "72", 1.0),        # numeric compare
    ("... #### 072", "72", 1.0),
    ("... #### 71", "72", 0.0),
    ("... #### -3.5", "-3.5", 1.0),
    ("... #### 3.5", "-3.5", 0.0),       # sign matters
    ("... #### 1,234", "1234", 1.0),
    ("... #### 1234", "1,234", 1.0),
    ("I think it is 72", "72", 1.0),     # fallback to last number
    ("72 is wrong, it is 73", "72", 0.0),
    ("#### 3/2", "1.5", 1.0),            # math-verify fallback
    ("so the answer is $\\frac{3}{2}$", "1.5", 1.0),
    ("#### seventy-two", "72", 0.0),     # math-verify cannot parse words: 0.0, no exception
    ("#### \\frac{", "72", 0.0),         # malformed LaTeX: 0.0, no exception
    ("", "72", 0.0),
])
def test_gsm8k_correct_table(completion, gold, expected):
    assert gsm8k_correct(completion, gold) == expected


def test_gsm8k_correct_never_raises_in_threads():
    """math-verify's timeout uses signal.alarm (main thread only); actors may score in threads."""
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(gsm8k_correct("#### 3/2", "1.5")))
    t.start()
    t.join()
    assert out == [1.0]


# ----------------------------------------------------------------------------------------------- format_reward


@pytest.mark.parametrize("completion,expected", [
    ("steps\n#### 72", 1.0),
    ("steps\n#### 72\n  ", 1.0),         # trailing whitespace ok
    ("#### -3.5", 1.0),
    ("#### 1,234", 1.0),
    ("####72", 1.0),
    ("#### 72 apples", 0.0),             # text after the number
    ("#### 72.", 0.0),
    ("#### seventy", 0.0),
    ("#### 72\nmore", 0.0),              # not at the end
    ("the answer is 72", 0.0),
    ("", 0.0),
])
def test_format_reward_table(completion, expected):
    assert format_reward(completion) == expected


# ----------------------------------------------------------------------------------------------- combined_reward


def test_combined_reward_weights():
    r = combined_reward("so\n#### 72", "72", {"correctness": 1.0, "format": 0.2, "reward_model": 0.0})
    assert r == {"correctness": 1.0, "format": 1.0, "total": pytest.approx(1.2)}
    r = combined_reward("it is 72 apples", "72", {"correctness": 1.0, "format": 0.2})
    assert r["correctness"] == 1.0 and r["format"] == 0.0 and r["total"] == pytest.approx(1.0)
    r = combined_reward("#### 5", "72", {"correctness": 1.0, "format": 0.5, "reward_model": 2.0},
                        reward_model_score=-0.25)
    assert r["total"] == pytest.approx(0.0 + 0.5 - 0.5)


def test_combined_reward_errors():
    with pytest.raises(ValueError, match="unknown reward component.*'length'"):
        combined_reward("#### 1", "1", {"length": 1.0})
    with pytest.raises(ValueError, match="reward_model_score"):
        combined_reward("#### 1", "1", {"reward_model": 1.0})


# ----------------------------------------------------------------------------------------------- RewardModelScorer


def _tiny_reward_model(tokenizer_path, out_dir, vocab_size, seed):
    """A randomly initialised 1-layer LlamaForSequenceClassification (1 label) saved with a real tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from posttrain.models import load_tokenizer

    tok, _ = load_tokenizer(str(tokenizer_path), chat_template="none")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      num_labels=1, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    model = LlamaForSequenceClassification(cfg)
    model.score.weight.data.normal_(0, 1.0)     # make scores spread out
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return model.eval(), tok


PROMPTS = ["Question: What is 2+2?\nAnswer:", "\n\nHuman: Tell me a story.\n\nAssistant:", "Hi"]
COMPLETIONS = [" 4\n#### 4", " Once upon a time there was a very long story about a cat.", " there"]


def _direct_scores(model, tok, texts):
    import torch

    out = []
    with torch.no_grad():
        for t in texts:     # one at a time: no padding involved
            ids = torch.tensor([tok(t)["input_ids"]])
            out.append(float(model(input_ids=ids).logits[0, 0]))
    return out


@pytest.mark.parametrize("tokenizer", ["stories260K/hf", "gpt2_tokenizer"])
def test_reward_model_scorer_matches_forward(shared_data, tmp_path, tokenizer):
    """Batched, padded scoring equals unpadded forward passes on prompt + completion + eos, with the reward
    model's own tokenizer (stories260K's 512-piece SentencePiece or GPT-2's 50,257 BPE)."""
    from posttrain.rewards import RewardModelScorer

    vocab = 512 if tokenizer.startswith("stories") else 50257
    model, tok = _tiny_reward_model(shared_data / tokenizer, tmp_path, vocab, seed=1)
    scorer = RewardModelScorer(str(tmp_path), batch_size=2)
    texts = [p + c + tok.eos_token for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scorer.texts(PROMPTS, COMPLETIONS) == texts
    got = scorer.score(PROMPTS, COMPLETIONS)
    want = _direct_scores(model, tok, texts)
    assert all(isinstance(x, float) for x in got)
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(x, 4) for x in got)) == 3     # distinct texts, distinct scores


def test_reward_model_scorer_retokenises(shared_data, tmp_path):
    """The same text gets different token ids under the two tokenizers; each scorer uses its own."""
    from posttrain.models import load_tokenizer
    from posttrain.rewards import RewardModelScorer

    policy_tok, _ = load_tokenizer(str(shared_data / "stories260K" / "hf"))
    gpt2_model, gpt2_tok = _tiny_reward_model(shared_data / "gpt2_tokenizer", tmp_path, 50257, seed=2)
    text = PROMPTS[0] + COMPLETIONS[0]
    assert policy_tok(text)["input_ids"] != gpt2_tok(text)["input_ids"]
    scorer = RewardModelScorer(str(tmp_path))
    assert scorer.tokenizer.vocab_size == 50257
    assert scorer.score([PROMPTS[0]], [COMPLETIONS[0]]) == pytest.approx(
        _direct_scores(gpt2_model, gpt2_tok, [text + gpt2_tok.eos_token]), abs=1e-5)


def test_reward_model_scorer_errors(tmp_path):
    from posttrain.errors import ModelLoadError
    from posttrain.rewards import RewardModelScorer

    with pytest.raises(ModelLoadError, match="missing: config.json"):
        (tmp_path / "tokenizer.json").write_text("{}")
        RewardModelScorer(str(tmp_path))
