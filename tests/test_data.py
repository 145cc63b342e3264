"""Data loading on the real files in shared/data, plus tiny hand-made fixtures with hand-computed expectations."""

from __future__ import annotations

import gzip
import json
import random
import re
import subprocess
import sys

import pytest

from posttrain.data import DataReport, load_preference, load_prompts, load_sft, read_rows, split_holdout
from posttrain.data.sources import _read_hf
from posttrain.errors import DataError
from posttrain.models import CHAT_TEMPLATE_PLAIN, load_tokenizer
from posttrain.recipe import DatasetSpec


@pytest.fixture(scope="module")
def stories_tok(stories260k):
    return load_tokenizer(stories260k)[0]


@pytest.fixture(scope="module")
def word_tok():
    """A word-level tokenizer: one token per whitespace-separated word, no BOS/EOS added, plain template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({"<unk>": 0, "<pad>": 1, "</s>": 2}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    tok.chat_template = CHAT_TEMPLATE_PLAIN
    return tok


def _write_jsonl(path, rows, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _invariant(report: DataReport):
    assert report.rows_read == report.rows_kept + sum(report.dropped.values())


# ----------------------------------------------------------------------------------------------- GSM8K


def test_gsm8k_sft_real_rows(shared_data, stories_tok):
    spec = DatasetSpec(source=str(shared_data / "gsm8k" / "train.jsonl"), format="gsm8k", max_rows=40)
    rows, [rep] = load_sft([spec], stories_tok, 100_000, "drop", seed=3)
    assert rep.rows_in_source == 7473 and rep.rows_read == 40 and rep.rows_kept == 40 and rep.dropped == {}
    for r in rows:
        assert "<<" not in r["completion"] and ">>" not in r["completion"]
        assert re.search(r"\n#### -?[\d,.]+$", r["completion"])
        assert r["prompt"].startswith("Question: ") and r["prompt"].endswith("\nAnswer:")
        assert r["completion"].startswith(" ")               # the plain template's assistant turn
    # max_rows = a seeded shuffle, then the first N
    src = [json.loads(x) for x in open(spec.source)]
    idx = list(range(len(src)))
    random.Random(3).shuffle(idx)
    assert [r["prompt"] for r in rows] == [f"Question: {src[i]['question'].strip()}\nAnswer:" for i in idx[:40]]
    again, _ = load_sft([spec], stories_tok, 100_000, "drop", seed=3)
    other, _ = load_sft([spec], stories_tok, 100_000, "drop", seed=4)
    assert again == rows and other != rows
    assert rep.sha256 == "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"  # README's sum


def test_gsm8k_gold_answers_real_comma_row(shared_data, stories_tok):
    spec = DatasetSpec(source=str(shared_data / "gsm8k" / "train.jsonl"), format="gsm8k")
    rows, rep = load_prompts(spec, stories_tok, 100_000, seed=0)
    assert rep.rows_kept == 7473 and rep.dropped == {}
    by_q = {r["question"]: r["answer"] for r in rows}
    comma = [json.loads(x) for x in open(spec.source) if '#### 9,492"' in x]
    assert len(comma) == 1 and by_q[comma[0]["question"].strip()] == "9492"
    assert rows[0]["answer"] == "72" and rows[0]["prompt"] == f"Question: {rows[0]['question']}\nAnswer:"
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", r["answer"]) for r in rows)
    assert sum(r["answer"].startswith("-") for r in rows) == 3      # grep -c "#### -" train.jsonl


def test_gsm8k_gold_hand_made(tmp_path, word_tok):
    path = _write_jsonl(tmp_path / "g.jsonl", [
        {"question": "neg", "answer": "x <<1-4.5=-3.5>>-3.5\n#### -3.5"},
        {"question": "dec", "answer": "so\n#### 1,234.5"},
        {"question": "int", "answer": "#### 1,000,000"},
        {"question": "none", "answer": "no final line"},
    ])
    rows, rep = load_prompts(DatasetSpec(source=path, format="gsm8k"), word_tok, 1000, seed=0)
    assert [r["answer"] for r in rows] == ["-3.5", "1234.5", "1000000"]
    assert rep.dropped == {"no_gold_answer": 1}
    sft, _ = load_sft([DatasetSpec(source=path, format="gsm8k")], word_tok, 1000, "drop", 0)
    assert sft[0]["completion"] == " x -3.5\n#### -3.5"       # annotation removed


# ----------------------------------------------------------------------------------------------- HH-RLHF


def test_hh_rlhf_prompt_split_real_row(shared_data, stories_tok):
    path = shared_data / "hh_rlhf" / "helpful-base" / "test.jsonl.gz"
    first = json.loads(gzip.open(path, "rt").readline())
    spec = DatasetSpec(source=str(path), format="hh_rlhf", max_rows=5)
    rows, rep = load_preference(spec, stories_tok, 100_000, "drop", seed=0)
    src = [json.loads(x) for x in gzip.open(path, "rt")]
    for r in rows:
        assert r["prompt"].endswith("\n\nAssistant:") and r["prompt"].startswith("\n\nHuman:")
        assert "\n\nAssistant:" not in r["chosen"] and "\n\nAssistant:" not in r["rejected"]
        assert {"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} in src
    from posttrain.data import split_hh

    prompt, chosen = split_hh(first["chosen"])
    assert first["chosen"].count("\n\nAssistant:") >= 1 and prompt + chosen == first["chosen"]
    assert prompt == first["chosen"][:first["chosen"].rfind("\n\nAssistant:") + len("\n\nAssistant:")]


def test_hh_rlhf_helpful_base_drops(shared_data, stories_tok):
    """The README: helpful-base has 2 pairs with chosen == rejected."""
    spec = DatasetSpec(source=str(shared_data / "hh_rlhf" / "helpful-base" / "test.jsonl.gz"), format="hh_rlhf")
    rows, rep = load_preference(spec, stories_tok, 1_000_000, "drop", seed=0)
    assert rep.rows_read == 2354
    assert rep.dropped["chosen_equals_rejected"] == 2
    assert rep.dropped["prompt_mismatch"] == 9        # extra or embedded "\n\nAssistant:" turns in one side
    assert "over_context" not in rep.dropped and rep.truncated == 0
    _invariant(rep)
    assert all(r["chosen"] != r["rejected"] for r in rows)


def test_preference_format_and_directory_source(tmp_path, word_tok):
    d = tmp_path / "prefs"
    (d / "a").mkdir(parents=True)
    _write_jsonl(d / "a" / "x.jsonl", [{"prompt": "p1", "chosen": "good", "rejected": "bad"}])
    _write_jsonl(d / "y.jsonl.gz", [{"prompt": "p2", "chosen": "same", "rejected": "same"},
                                    {"prompt": "p3", "chosen": "yes", "rejected": "no"}], gz=True)
    rows, rep = load_preference(DatasetSpec(source=str(d), format="preference"), word_tok, 100, "drop", 0)
    assert rows == [{"prompt": "Question: p1\nAnswer:", "chosen": " good", "rejected": " bad"},
                    {"prompt": "Question: p3\nAnswer:", "chosen": " yes", "rejected": " no"}]
    assert rep.dropped == {"chosen_equals_rejected": 1} and rep.rows_in_source == 3


# ----------------------------------------------------------------------------------------------- Dolly


def test_dolly_real_and_context(shared_data, tmp_path, word_tok):
    spec = DatasetSpec(source=str(shared_data / "dolly_open_qa" / "dolly_open_qa.jsonl"), format="dolly", max_rows=3)
    rows, rep = load_sft([spec], word_tok, 100_000, "drop", seed=0)
    src = {json.loads(x)["instruction"].strip(): json.loads(x)["response"].strip() for x in open(spec.source)}
    for r in rows:
        q = r["prompt"].removeprefix("Question: ").removesuffix("\nAnswer:")
        assert r["completion"] == " " + src[q]
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"instruction": "Summarise.", "context": "Cats sleep a lot.", "response": "Cats nap."},
        {"instruction": "Why?", "context": "", "response": "Because."},
        {"instruction": "Empty", "context": "", "response": "  "},
    ])
    rows, [rep] = load_sft([DatasetSpec(source=path, format="dolly")], word_tok, 100, "drop", 0)
    assert rows == [{"prompt": "Question: Summarise.\n\nContext: Cats sleep a lot.\nAnswer:", "completion": " Cats nap."},
                    {"prompt": "Question: Why?\nAnswer:", "completion": " Because."}]
    assert rep.dropped == {"empty_question_or_answer": 1}


# ----------------------------------------------------------------------------------------------- errors


def test_missing_file_error(tmp_path, word_tok):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(DataError) as e:
        load_sft([DatasetSpec(source=missing, format="gsm8k")], word_tok, 100, "drop", 0)
    assert missing in str(e.value) and "fix data.sft[0].source" in str(e.value)
    with pytest.raises(DataError, match=r"data.prompts.source=.*file not found"):
        load_prompts(DatasetSpec(source=missing, format="gsm8k"), word_tok, 100, 0)


def test_wrong_columns_error(shared_data, tmp_path, word_tok):
    gsm = str(shared_data / "gsm8k" / "test.jsonl")
    with pytest.raises(DataError) as e:
        load_preference(DatasetSpec(source=gsm, format="hh_rlhf"), word_tok, 100, "drop", 0, field="data.preference")
    msg = str(e.value)
    assert gsm in msg and "expects columns ['chosen', 'rejected']" in msg and "rows have ['answer', 'question']" in msg
    hh = str(shared_data / "hh_rlhf" / "harmless-base" / "test.jsonl.gz")
    with pytest.raises(DataError, match=r"format 'dolly' expects .* set data.sft\[0\].format=hh_rlhf"):
        load_sft([DatasetSpec(source=hh, format="dolly")], word_tok, 100, "drop", 0)
    with pytest.raises(DataError, match=r"rows have \['answer', 'question'\]; these columns match format 'gsm8k'"):
        load_sft([DatasetSpec(source=gsm, format="prompt_completion")], word_tok, 100, "drop", 0)
    pref = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}])
    # {prompt, chosen, rejected} has hh_rlhf's columns too, but the more specific 'preference' is named
    with pytest.raises(DataError, match="set data.sft\\[0\\].format=preference"):
        load_sft([DatasetSpec(source=pref, format="gsm8k")], word_tok, 100, "drop", 0)
    odd = _write_jsonl(tmp_path / "o.jsonl", [{"text": "### Human: q ### Assistant: a"}])
    with pytest.raises(DataError, match=r"rows have \['text'\]; rename the columns .*gsm8k: \['question', 'answer'\]"):
        load_sft([DatasetSpec(source=odd, format="gsm8k")], word_tok, 100, "drop", 0)
    with pytest.raises(DataError, match="data.prompts.format='dolly': this role needs one of"):
        load_prompts(DatasetSpec(source=odd, format="dolly"), word_tok, 100, 0)


def test_bad_json_line(tmp_path, word_tok):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 2 is not valid JSON"):
        load_sft([DatasetSpec(source=str(p), format="gsm8k")], word_tok, 100, "drop", 0)


def test_empty_after_filtering(shared_data, stories_tok):
    spec = DatasetSpec(source=str(shared_data / "gsm8k" / "test.jsonl"), format="gsm8k", max_rows=10)
    with pytest.raises(DataError) as e:
        load_sft([spec], stories_tok, 16, "drop", 0)
    msg = str(e.value)
    assert "data.sft[0]" in msg and "gsm8k/test.jsonl" in msg and "no rows left after filtering" in msg
    assert "over_context=10" in msg and "10 read" in msg


# ----------------------------------------------------------------------------------------------- over-length


OVERLENGTH_ROWS = [
    {"prompt": "a b", "completion": "c d"},                 # 4 prompt words + 2 = 6 tokens: fits in 8
    {"prompt": "a", "completion": "c d e f g h"},           # 3 + 6 = 9: over by one completion word
    {"prompt": "a b c d e f g", "completion": "x"},         # 9 + 1 = 10: the prompt alone (9) is over 8
]


def test_overlength_drop_vs_truncate(tmp_path, word_tok):
    """Hand-computed with a one-token-per-word tokenizer: "Question: a b\\nAnswer:" is 4 tokens."""
    path = _write_jsonl(tmp_path / "pc.jsonl", OVERLENGTH_ROWS)
    spec = DatasetSpec(source=path, format="prompt_completion")
    rows, [rep] = load_sft([spec], word_tok, 8, "drop", 0)
    assert rows == [{"prompt": "Question: a b\nAnswer:", "completion": " c d"}]
    assert rep.dropped == {"over_context": 2} and rep.truncated == 0
    assert rep.token_stats == {"min": 6.0, "median": 9.0, "p95": 10.0, "max": 10.0, "n_over_context": 2.0}
    rows, [rep] = load_sft([spec], word_tok, 8, "truncate", 0)
    assert rows == [{"prompt": "Question: a b\nAnswer:", "completion": " c d"},
                    {"prompt": "Question: a\nAnswer:", "completion": " c d e f g"}]
    assert rep.dropped == {"prompt_over_context": 1} and rep.truncated == 1 and rep.rows_kept == 2
    _invariant(rep)
    m = rep.to_metrics("data/sft")
    assert m["data/sft.truncated"] == 1.0 and m["data/sft.dropped_prompt_over_context"] == 1.0
    assert m["data/sft.tokens_max"] == 10.0 and m["data/sft.rows_kept"] == 2.0
    table = rep.render()
    assert "truncated" in table and "prompt_over_context" in table and "6 / 9 / 10 / 10" in table


def test_overlength_preference_truncates_both(tmp_path, word_tok):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "chosen": "c d e f g h", "rejected": "x y"}])
    rows, rep = load_preference(DatasetSpec(source=path, format="preference"), word_tok, 6, "truncate", 0)
    assert rows == [{"prompt": "Question: a\nAnswer:", "chosen": " c d e", "rejected": " x y"}]
    assert rep.truncated == 1 and rep.token_stats["max"] == 9.0


def test_prompts_reserve_tokens(tmp_path, word_tok):
    path = _write_jsonl(tmp_path / "pc.jsonl", OVERLENGTH_ROWS)
    rows, rep = load_prompts(DatasetSpec(source=path, format="prompt_completion"), word_tok, 8, 0, reserve_tokens=4)
    assert [r["question"] for r in rows] == ["a b", "a"]          # prompts of 4 and 3 tokens fit in 8 - 4
    assert rep.dropped == {"prompt_over_context": 1}


# ----------------------------------------------------------------------------------------------- split, sources


def test_split_holdout():
    rows = list(range(100))
    train, hold = split_holdout(rows, 0.1, seed=0)
    assert len(hold) == 10 and len(train) == 90 and sorted(train + hold) == rows
    assert split_holdout(rows, 0.1, seed=0) == (train, hold) and split_holdout(rows, 0.1, seed=1) != (train, hold)
    assert len(split_holdout([1, 2], 0.01, 0)[1]) == 1
    with pytest.raises(DataError, match="at least 2 rows"):
        split_holdout([1], 0.5, 0)


def test_hf_dataset_path_local_standin(tmp_path):
    """The real ``datasets.load_dataset`` path, on a local folder laid out like a Hub dataset repo (the Hub
    cannot be reached from tests)."""
    (tmp_path / "data").mkdir()
    _write_jsonl(tmp_path / "data" / "train.jsonl", [{"question": "q1", "answer": "#### 1"}])
    _write_jsonl(tmp_path / "data" / "test.jsonl", [{"question": "q2", "answer": "#### 2"},
                                                    {"question": "q3", "answer": "#### 3"}])
    raw = _read_hf(str(tmp_path), "test", None, "data.eval_prompts")
    assert raw.rows == [{"question": "q2", "answer": "#### 2"}, {"question": "q3", "answer": "#### 3"}]
    assert raw.files == [] and len(raw.sha256) == 64


def test_hf_dataset_unreachable_error():
    """An HF id that cannot be fetched (offline mode) is a DataError naming the field and the id."""
    code = ("from posttrain.data import read_rows\n"
            "try:\n    read_rows('openai/gsm8k', 'train', 'main', 'data.prompts')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert out.startswith("DataError data.prompts.source='openai/gsm8k' (split='train', subset='main')")
    assert "give a local .jsonl path" in out


def test_read_rows_json_list(tmp_path):
    p = tmp_path / "rows.json"
    p.write_text(json.dumps([{"prompt": "a", "completion": "b"}]))
    assert read_rows(str(p)).rows == [{"prompt": "a", "completion": "b"}]
    p.write_text(json.dumps({"prompt": "a"}))
    with pytest.raises(DataError, match="not a list of rows"):
        read_rows(str(p))


@pytest.mark.parametrize("tok_dir", ["stories260K/hf", "gpt2_tokenizer"])
def test_fit_completion_is_longest_fitting_prefix(shared_data, tok_dir):
    """On real GSM8K answers and real tokenizers: the cut fits, and one more non-blank character would not."""
    from posttrain.data.lengths import fit_completion

    tok, _ = load_tokenizer(str(shared_data / tok_dir))
    rows = [json.loads(x) for x in open(shared_data / "gsm8k" / "test.jsonl")][:15]
    n = lambda s: len(tok(s)["input_ids"])  # noqa: E731
    for r in rows:
        prompt, completion = f"Question: {r['question']}\nAnswer:", " " + r["answer"]
        budget = n(prompt) + 12
        cut = fit_completion(tok, prompt, completion, budget)
        assert completion.startswith(cut) and n(prompt + cut) <= budget < n(prompt + completion)
        j = len(cut)
        while completion[j].isspace():
            j += 1
        assert n(prompt + completion[:j + 1]) > budget


def test_completion_follows_the_tokenizers_own_template(tmp_path, word_tok):
    """With a ChatML-style template the completion is what the template renders after the generation prompt."""
    import copy

    tok = copy.deepcopy(word_tok)
    tok.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": "2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}])
    rows, _ = load_sft([DatasetSpec(source=path, format="gsm8k")], tok, 100, "drop", 0)
    assert rows == [{"prompt": "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n",
                     "completion": "2+2=4\n#### 4<|im_end|>\n"}]
