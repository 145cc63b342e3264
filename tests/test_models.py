"""Model/tokenizer loading and repair on the real stories260K model, LoRA config, LoRA-merging save."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from posttrain.errors import ModelLoadError
from posttrain.models import (
    CHAT_TEMPLATE_PLAIN,
    format_prompt,
    load_causal_lm,
    load_tokenizer,
    lora_config,
    save_model,
    stop_token_ids,
)
from posttrain.recipe import LoraSpec

torch.set_num_threads(1)


def test_tokenizer_repair_stories260k(stories260k, caplog):
    with caplog.at_level(logging.WARNING, logger="posttrain"):
        tok, warnings = load_tokenizer(stories260k)
    assert tok.pad_token == "<unk>" and tok.pad_token_id == 0      # pad = unk (it exists)
    assert tok.chat_template == CHAT_TEMPLATE_PLAIN
    assert len(warnings) == 2
    assert "no pad token" in warnings[0] and "no chat template" in warnings[1]
    logged = [r.getMessage() for r in caplog.records if r.name == "posttrain"]
    assert logged == warnings


def test_format_prompt_plain_template(stories260k):
    tok, _ = load_tokenizer(stories260k)
    assert format_prompt(tok, "What is 2+2?") == "Question: What is 2+2?\nAnswer:"
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"},
             {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert tok.apply_chat_template(convo, tokenize=False) == "Be brief.\nQuestion: a\nAnswer: b\nQuestion: c\nAnswer:"
    ids = tok(format_prompt(tok, "hi"))["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1   # BOS added once, by the tokenizer


def test_chat_template_none_and_plain(stories260k, tmp_path):
    tok, warnings = load_tokenizer(stories260k, chat_template="none")
    assert not tok.chat_template and len(warnings) == 1            # only the pad repair
    assert format_prompt(tok, "raw question") == "raw question"
    # a tokenizer that already has a template: 'auto' keeps it silently, 'plain' replaces it with a warning
    repaired, _ = load_tokenizer(stories260k)
    repaired.chat_template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    repaired.save_pretrained(tmp_path)
    tok, warnings = load_tokenizer(str(tmp_path), chat_template="auto")
    assert warnings == [] and format_prompt(tok, "q") == "<<q>>"
    tok, warnings = load_tokenizer(str(tmp_path), chat_template="plain")
    assert len(warnings) == 1 and "replaced" in warnings[0]
    assert format_prompt(tok, "q") == "Question: q\nAnswer:"


def test_gpt2_tokenizer_pad_is_unk(shared_data):
    tok, warnings = load_tokenizer(str(shared_data / "gpt2_tokenizer"))
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 50256
    assert tok("Hello world")["input_ids"] == [15496, 995]


def test_stop_token_ids_stories260k(stories260k):
    tok, _ = load_tokenizer(stories260k)
    model = load_causal_lm(stories260k)
    # generation_config.eos_token_id is [2, 1]: the model stops by emitting BOS (id 1)
    assert list(model.generation_config.eos_token_id) == [2, 1]
    assert stop_token_ids(tok, model) == [2, 1]


def _copy_model_dir(src, dst, skip):
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name not in skip:
            shutil.copy(f, dst / f.name)
    return str(dst)


def test_load_causal_lm_errors(shared_data, tmp_path):
    src = shared_data / "stories260K" / "hf"
    with pytest.raises(ModelLoadError, match="not a directory.*model.name_or_path"):
        load_causal_lm(str(tmp_path / "nope"))
    no_weights = _copy_model_dir(src, tmp_path / "a", {"model.safetensors"})
    with pytest.raises(ModelLoadError) as e:
        load_causal_lm(no_weights)
    assert no_weights in str(e.value) and "weights (*.safetensors or *.bin" in str(e.value)
    assert "missing: weights" in str(e.value) and "missing: config.json" not in str(e.value)
    no_tok = _copy_model_dir(src, tmp_path / "b", {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                                   "special_tokens_map.json"})
    with pytest.raises(ModelLoadError, match="missing: tokenizer files.*tokenizer.save_pretrained"):
        load_causal_lm(no_tok)
    with pytest.raises(ModelLoadError, match="missing: tokenizer files"):
        load_tokenizer(no_tok)
    no_cfg = _copy_model_dir(src, tmp_path / "c", {"config.json"})
    with pytest.raises(ModelLoadError, match=r"missing: config.json \(save the model"):
        load_causal_lm(no_cfg)
    with pytest.raises(ModelLoadError, match="model.dtype='int3'"):
        load_causal_lm(str(src), dtype="int3")


def test_lora_config():
    assert lora_config(LoraSpec(enabled=False)) is None
    cfg = lora_config(LoraSpec(enabled=True, r=4, alpha=8, dropout=0.1))
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (4, 8, 0.1)
    assert set(cfg.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert lora_config(LoraSpec(enabled=True, target_modules=["all-linear"])).target_modules == "all-linear"
    assert str(lora_config(LoraSpec(enabled=True), task_type="SEQ_CLS").task_type) == "SEQ_CLS"


def test_save_model_merges_lora(stories260k, tmp_path):
    """The saved directory is a plain model whose logits equal the LoRA-wrapped model's."""
    from peft import get_peft_model

    tok, _ = load_tokenizer(stories260k)
    torch.manual_seed(0)                    # lora_A init and our lora_B values are seeded: no flakiness
    model = get_peft_model(load_causal_lm(stories260k), lora_config(LoraSpec(enabled=True, r=2)))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.1)          # non-zero B: the adapter changes the output
    ids = torch.tensor([tok("Once upon a time")["input_ids"]])
    model.eval()
    with torch.no_grad():
        want = model(ids).logits
        base = model.get_base_model()
    out = save_model(model, tok, str(tmp_path / "m"))
    assert not any(p.name.startswith("adapter") for p in (tmp_path / "m").iterdir())
    reloaded = load_causal_lm(out).eval()
    with torch.no_grad():
        got = reloaded(ids).logits
    assert (got - want).abs().max().item() < 1e-3      # float32 rounding of W + BA vs W x + B(A x)
    plain = load_causal_lm(stories260k).eval()
    with torch.no_grad():
        assert (plain(ids).logits - want).abs().max().item() > 0.1     # the adapter mattered
    tok2, warnings = load_tokenizer(out)
    assert warnings == [] and tok2.pad_token_id == 0 and tok2.chat_template == CHAT_TEMPLATE_PLAIN
    assert reloaded.config.pad_token_id == 0
    del base
