"""Load models and tokenizers, repair what base models lack, build LoRA configs, save full model directories.

Base models often ship without a pad token or a chat template (the offline demo model ``stories260K`` has
neither). ``load_tokenizer`` repairs both and *returns* the warnings it logged (logger ``posttrain``), so a stage
can put them in its report instead of letting them scroll by.

Heavy imports (torch, transformers, peft) happen inside the functions: importing this module is instant.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from posttrain.errors import ModelLoadError

log = logging.getLogger("posttrain")

#: A plain template for base models: a user turn renders as ``"Question: {content}\nAnswer:"`` and an assistant
#: turn as ``" {content}"``; a system turn renders as ``"{content}\n"``. Turns after the first user turn are
#: separated by a newline. ``add_generation_prompt`` adds nothing: the user turn already ends in ``Answer:``.
CHAT_TEMPLATE_PLAIN = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'user' -%}"
    "{%- if not loop.first and loop.previtem['role'] != 'system' -%}{{ '\\n' }}{%- endif -%}"
    "{{ 'Question: ' + message['content'] + '\\nAnswer:' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ ' ' + message['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _is_local(name_or_path: str) -> bool:
    """Local path or hub id, by the same rule as ``posttrain.recipe.check_paths``."""
    from posttrain.recipe import _looks_local

    return _looks_local(name_or_path)


def _check_local_dir(path: str, need: tuple[str, ...]) -> None:
    """Raise ModelLoadError naming every missing part of a local model directory.

    ``need`` is a subset of ``("config", "weights", "tokenizer")``.
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelLoadError(
            f"model path {path!r} is not a directory; give a local model directory (save_pretrained output) "
            "or an HF model id like Qwen/Qwen2.5-0.5B (recipe field model.name_or_path)")
    missing = []
    if "config" in need and not (p / "config.json").is_file():
        missing.append("config.json (save the model with model.save_pretrained(dir))")
    if "weights" in need and not any(any(p.glob(g)) for g in _WEIGHT_GLOBS):
        missing.append("weights (*.safetensors or *.bin; copy the weight files next to config.json)")
    if "tokenizer" in need and not any((p / f).is_file() for f in _TOKENIZER_FILES):
        missing.append("tokenizer files (tokenizer.json / tokenizer.model / vocab.json; "
                       "save them with tokenizer.save_pretrained(dir))")
    if missing:
        raise ModelLoadError(f"model directory {path!r} is missing: " + "; ".join(missing))


def load_tokenizer(name_or_path: str, chat_template: str = "auto", revision: str | None = None,
                   trust_remote_code: bool = False) -> tuple[Any, list[str]]:
    """Load a tokenizer and repair a missing pad token and chat template.

    Pad repair: ``pad = unk`` when the tokenizer has an unk token, else ``pad = eos`` (padding side is left to
    callers: left for generation, right for training). Chat template (``ModelSpec.chat_template``): ``"auto"``
    keeps the tokenizer's template and adds ``CHAT_TEMPLATE_PLAIN`` when it has none; ``"plain"`` always uses
    ``CHAT_TEMPLATE_PLAIN``; ``"none"`` leaves the tokenizer as is (``format_prompt`` then returns the raw question).

    Returns ``(tokenizer, warnings)``: every repair is logged as a warning on logger ``posttrain`` and returned.
    Raises ``ModelLoadError`` when the path has no tokenizer or the id cannot be loaded.
    """
    from transformers import AutoTokenizer

    if chat_template not in ("auto", "plain", "none"):
        raise ModelLoadError(f"model.chat_template={chat_template!r}: use 'auto', 'plain' or 'none'")
    if _is_local(name_or_path):
        _check_local_dir(name_or_path, ("tokenizer",))
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types (OSError, ValueError, ...)
        raise ModelLoadError(f"cannot load a tokenizer from {name_or_path!r} (model.name_or_path): {exc}") from None
    warnings: list[str] = []

    def warn(msg: str) -> None:
        log.warning(msg)
        warnings.append(msg)

    if tok.pad_token is None:
        if tok.unk_token is not None:
            tok.pad_token = tok.unk_token
            warn(f"tokenizer {name_or_path!r} has no pad token; using unk {tok.unk_token!r} "
                 f"(id {tok.pad_token_id}) for padding")
        elif tok.eos_token is not None:
            tok.pad_token = tok.eos_token
            warn(f"tokenizer {name_or_path!r} has no pad token; using eos {tok.eos_token!r} "
                 f"(id {tok.pad_token_id}) for padding")
        else:
            raise ModelLoadError(f"tokenizer {name_or_path!r} has no pad, unk or eos token to pad with; "
                                 "add one (tokenizer.add_special_tokens) and save it")
    has_template = bool(getattr(tok, "chat_template", None))
    if chat_template == "plain" and has_template:
        tok.chat_template = CHAT_TEMPLATE_PLAIN
        warn(f"tokenizer {name_or_path!r}: replaced its chat template with the plain 'Question:/Answer:' one "
             "(model.chat_template='plain')")
    elif chat_template in ("auto", "plain") and not has_template:
        tok.chat_template = CHAT_TEMPLATE_PLAIN
        warn(f"tokenizer {name_or_path!r} has no chat template; added the plain 'Question: ...\\nAnswer:' one "
             f"(model.chat_template={chat_template!r})")
    return tok, warnings


def _torch_dtype(dtype: str):
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}
    if dtype not in table:
        raise ModelLoadError(f"model.dtype={dtype!r}: use one of {sorted(table)}")
    return table[dtype]


def load_causal_lm(name_or_path: str, dtype: str = "float32", revision: str | None = None,
                   trust_remote_code: bool = False, load_in_4bit: bool = False, require_tokenizer: bool = True):
    """Load an ``AutoModelForCausalLM`` (the mode is left as ``from_pretrained`` leaves it; callers call
    ``.train()``/``.eval()``).

    A local directory is checked first for ``config.json``, weights and (unless ``require_tokenizer=False``)
    tokenizer files, so the error names every missing part. ``load_in_4bit`` (QLoRA) needs CUDA and bitsandbytes.
    Raises ``ModelLoadError`` naming the path, what is missing and how to fix it.
    """
    from transformers import AutoModelForCausalLM

    if _is_local(name_or_path):
        _check_local_dir(name_or_path, ("config", "weights") + (("tokenizer",) if require_tokenizer else ()))
    kwargs: dict[str, Any] = {"dtype": _torch_dtype(dtype), "revision": revision,
                              "trust_remote_code": trust_remote_code}
    if load_in_4bit:
        kwargs["quantization_config"] = _bnb_4bit_config()
    try:
        return AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load a causal LM from {name_or_path!r} (model.name_or_path): {exc}") from None


def _bnb_4bit_config():
    import torch

    if not torch.cuda.is_available():
        raise ModelLoadError("model.lora.load_in_4bit=true needs a CUDA GPU; set it to false on CPU")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelLoadError("model.lora.load_in_4bit=true needs bitsandbytes; pip install bitsandbytes") from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def lora_config(spec, task_type: str = "CAUSAL_LM"):
    """A ``peft.LoraConfig`` from a ``LoraSpec`` (None when LoRA is off).

    ``target_modules=["all-linear"]`` becomes PEFT's ``"all-linear"`` shorthand. ``task_type`` is
    ``"CAUSAL_LM"`` for policies and ``"SEQ_CLS"`` for reward models.
    """
    if not spec.enabled:
        return None
    from peft import LoraConfig

    targets = spec.target_modules
    target = "all-linear" if list(targets) == ["all-linear"] else list(targets)
    return LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=target,
                      task_type=task_type, bias="none")


def format_prompt(tokenizer, question: str) -> str:
    """The chat-templated prompt for one user question (``add_generation_prompt=True``), as a string.

    With ``CHAT_TEMPLATE_PLAIN``: ``"Question: {question}\\nAnswer:"``. A tokenizer without a template
    (``model.chat_template='none'``) gets the raw question back. BOS is not in the string: the tokenizer adds it.
    """
    if not getattr(tokenizer, "chat_template", None):
        return question
    out = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                        add_generation_prompt=True)
    return out if isinstance(out, str) else tokenizer.decode(out)


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(i) for i in x] if isinstance(x, (list, tuple)) else [int(x)]


def stop_token_ids(tokenizer, model) -> list[int]:
    """Token ids that end a completion: ``generation_config.eos_token_id`` first, then the model config's and
    the tokenizer's eos, without duplicates. stories260K: ``[2, 1]`` (it never learnt EOS and "stops" by
    emitting BOS id 1, which its generation_config lists).
    """
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    cfg = getattr(model, "config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(cfg, "eos_token_id", None),
                   getattr(tokenizer, "eos_token_id", None)):
        for i in _as_list(source):
            if i not in ids:
                ids.append(i)
    return ids


def save_model(model, tokenizer, out_dir: str) -> str:
    """Save a FULL model directory: LoRA adapters merged into the weights, ``save_pretrained`` of model
    (safetensors) and tokenizer (with its repaired pad token and chat template) into ``out_dir``.

    Returns ``out_dir``. Writes in place: callers wrap it in ``posttrain.artifacts.atomic_dir`` for atomicity.
    """
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        PeftModel = ()  # type: ignore[assignment]
    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    if tokenizer.pad_token_id is not None and getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
