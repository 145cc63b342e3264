"""The one validated configuration of a posttrain run.

A recipe is YAML validated by strict pydantic models: every field is typed, bounded, defaulted and documented,
and unknown keys are errors. ``load_recipe(path, overrides)`` applies ``--set a.b=c`` overrides (values parsed as
YAML scalars) before validation. ``validate_recipe`` returns *every* problem at once as ``RecipeProblem``s, each
naming the field, the bad value and the fix; ``RecipeError`` carries them.

This module imports no torch: ``posttrain validate`` is instant.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Algorithm = Literal["grpo", "rloo", "ppo", "dpo"]
RL_ALGORITHMS = ("grpo", "rloo", "ppo")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------------------------------- model


class LoraSpec(_Strict):
    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    r: int = Field(8, ge=1, le=1024, description="LoRA rank.")
    alpha: int = Field(16, ge=1, le=4096, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that get adapters ('all-linear' for every linear layer).",
    )
    load_in_4bit: bool = Field(False, description="QLoRA: load the base in 4-bit (needs a GPU and bitsandbytes).")


class ModelSpec(_Strict):
    name_or_path: str = Field(..., min_length=1, description="HF model id or local directory with config, weights and tokenizer.")
    revision: Optional[str] = Field(None, description="HF revision (branch, tag or commit) when name_or_path is a hub id.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("float32", description="Weights dtype when loading.")
    max_seq_len: int = Field(512, ge=16, le=1_048_576, description="Tokens per example (prompt + completion); longer examples follow data.overlength.")
    trust_remote_code: bool = Field(False, description="Allow model code from the hub (off unless you trust it).")
    chat_template: Literal["auto", "plain", "none"] = Field(
        "auto",
        description="'auto': keep the tokenizer's template, add a plain 'Question:/Answer:' one when missing; 'plain': always use the plain one; 'none': never template.",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA / QLoRA settings shared by every training stage.")


# --------------------------------------------------------------------------------------------------- data

DataFormat = Literal["gsm8k", "hh_rlhf", "dolly", "prompt_completion", "preference"]


class DatasetSpec(_Strict):
    source: str = Field(..., min_length=1, description="Local .jsonl/.jsonl.gz file (or directory of them) or an HF dataset id.")
    format: DataFormat = Field(..., description="Row schema: gsm8k {question, answer}; hh_rlhf {chosen, rejected}; dolly {instruction, context, response}; prompt_completion {prompt, completion}; preference {prompt, chosen, rejected}.")
    split: str = Field("train", description="Split name for HF dataset ids (ignored for local files).")
    max_rows: Optional[int] = Field(None, ge=1, description="Use at most this many rows (after shuffling with the recipe seed); None = all.")
    subset: Optional[str] = Field(None, description="HF dataset config name, if any.")


class DataSpec(_Strict):
    sft: list[DatasetSpec] = Field(default_factory=list, description="Instruction/answer data for SFT (mixed in order given).")
    preference: Optional[DatasetSpec] = Field(None, description="Preference pairs for the reward model and DPO.")
    prompts: Optional[DatasetSpec] = Field(None, description="Prompts with gold answers for RL.")
    eval_prompts: Optional[DatasetSpec] = Field(None, description="Held-out prompts with gold answers for evaluation.")
    eval_preference: Optional[DatasetSpec] = Field(None, description="Held-out preference pairs for pairwise accuracy.")
    eval_fraction: float = Field(0.1, gt=0.0, lt=0.9, description="When no eval_preference is given, this fraction of preference pairs is held out.")
    overlength: Literal["truncate", "drop"] = Field("drop", description="What to do with examples longer than model.max_seq_len: 'drop' them, or 'truncate' (prompt kept, completion cut). Always counted in the validation report.")


# --------------------------------------------------------------------------------------------------- stages


class TrainSpec(_Strict):
    enabled: bool = Field(True, description="Run this stage; when off, the previous model passes through.")
    max_steps: int = Field(100, ge=1, le=10_000_000, description="Optimizer steps.")
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    batch_size: int = Field(8, ge=1, le=65_536, description="Examples per device per micro-batch.")
    grad_accum: int = Field(1, ge=1, le=4096, description="Micro-batches per optimizer step.")
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of steps with linear warm-up.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    logging_steps: int = Field(10, ge=1, description="Log metrics every this many steps.")


class SFTSpec(TrainSpec):
    completion_only_loss: bool = Field(True, description="Loss on completion tokens only (prompt tokens masked).")


class RewardSpec(TrainSpec):
    learning_rate: float = Field(5e-4, gt=0.0, le=1.0, description="Peak learning rate.")


class DPOSpec(TrainSpec):
    learning_rate: float = Field(5e-5, gt=0.0, le=1.0, description="Peak learning rate.")
    beta: float = Field(0.1, gt=0.0, le=10.0, description="DPO inverse temperature beta (Rafailov et al. 2023).")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field("sigmoid", description="DPO loss variant.")


class RLRewardsSpec(_Strict):
    correctness: float = Field(1.0, ge=0.0, description="Weight of the verifiable GSM8K correctness reward (1 if the final answer equals the gold one).")
    format: float = Field(0.2, ge=0.0, description="Weight of the format reward (answer ends in '#### <number>').")
    reward_model: float = Field(0.0, ge=0.0, description="Weight of the trained reward model's score (0 = unused).")
    keyword: Optional[str] = Field(None, description="Optional extra reward: 1 when the completion text contains this string (e.g. '!'); None = off. For tiny-model smoke tasks.")
    keyword_weight: float = Field(1.0, ge=0.0, description="Weight of the keyword reward (used only when keyword is set).")


class RLSpec(_Strict):
    engine: Literal["posttrain", "trl"] = Field("posttrain", description="'posttrain': our async actor/learner engine; 'trl': TRL's GRPOTrainer (comparison).")
    mode: Literal["async", "sync"] = Field("async", description="'async': actors generate while the learner trains; 'sync': the same engine in lock-step (baseline).")
    max_steps: int = Field(20, ge=1, le=10_000_000, description="Learner optimizer steps.")
    prompts_per_step: int = Field(4, ge=1, le=65_536, description="Prompts per learner step (each gets num_generations completions).")
    num_generations: int = Field(4, ge=1, le=1024, description="Completions per prompt (the group). GRPO/RLOO need at least 2.")
    max_new_tokens: int = Field(64, ge=1, le=131_072, description="Completion length cap in tokens.")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature of the actors (behaviour log-probs use it too).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="Learner learning rate.")
    grad_accum: int = Field(1, ge=1, le=4096, description="Micro-batches per learner step; does not change the result.")
    max_staleness: int = Field(2, ge=0, le=1024, description="Max policy versions a sample may lag the learner; older ones are dropped, actors block when this far ahead.")
    clip_eps_low: float = Field(0.2, ge=0.0, le=10.0, description="Lower PPO clip: ratio >= 1 - eps_low.")
    clip_eps_high: float = Field(0.28, ge=0.0, le=10.0, description="Upper PPO clip: ratio <= 1 + eps_high (DAPO clip-higher).")
    off_policy_correction: Literal["tis", "decoupled", "none"] = Field("tis", description="'tis': truncated importance sampling (cap tis_cap); 'decoupled': AReaL decoupled objective with a recomputed proximal policy; 'none'.")
    tis_cap: float = Field(2.0, ge=1.0, le=1000.0, description="Cap C on importance weights: 'tis' truncates them at C, 'decoupled' masks tokens above C.")
    scale_rewards: bool = Field(True, description="GRPO: divide group-centred rewards by the group std (off = Dr. GRPO).")
    loss_agg: Literal["token", "sequence"] = Field("token", description="'token': mean over all tokens of the batch (DAPO); 'sequence': mean per sequence, then over sequences (GRPO paper).")
    kl_coef: float = Field(0.0, ge=0.0, le=100.0, description="Weight of the KL penalty to the reference policy (0 = no reference model).")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="PPO discount.")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="PPO GAE lambda.")
    vf_coef: float = Field(0.5, ge=0.0, le=100.0, description="PPO value-loss weight.")
    num_actors: int = Field(1, ge=1, le=1024, description="Actor ranks (generation).")
    num_learners: int = Field(1, ge=1, le=1024, description="Learner ranks (training).")
    collective_timeout_s: float = Field(600.0, gt=0.0, description="Seconds a collective may wait before the job fails.")
    rewards: RLRewardsSpec = Field(default_factory=RLRewardsSpec, description="Reward weights.")
    backend: Literal["auto", "hf", "vllm"] = Field("auto", description="Actor generation backend: 'auto' = vLLM when importable and a GPU is present, else transformers ('hf').")
    weight_bucket_mib: float = Field(64.0, gt=0.0, le=65_536.0, description="Size (MiB) of the packed parameter buckets broadcast learner -> actors.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Learner gradient clipping norm.")
    threads_per_rank: int = Field(1, ge=1, le=1024, description="torch CPU threads per rank (OMP_NUM_THREADS).")


class EvalSpec(_Strict):
    gsm8k_samples: int = Field(50, ge=1, le=100_000, description="Held-out GSM8K prompts to score (greedy).")
    preference_pairs: int = Field(100, ge=1, le=1_000_000, description="Held-out preference pairs for pairwise accuracy.")
    max_new_tokens: int = Field(128, ge=1, le=131_072, description="Greedy completion length for GSM8K evaluation.")
    batch_size: int = Field(16, ge=1, le=65_536, description="Prompts per generation batch.")


class TrackingSpec(_Strict):
    uri: str = Field("sqlite:///mlflow.db", description="MLflow tracking URI.")
    experiment: str = Field("posttrain", min_length=1, description="MLflow experiment name.")
    registered_model: Optional[str] = Field(None, description="Registry model name; default: the recipe name.")


class GateSpec(_Strict):
    enabled: bool = Field(True, description="Run the candidate -> staging gate after register.")
    thresholds: dict[str, float] = Field(default_factory=dict, description="Metric name -> minimum value the candidate must reach.")
    max_regression: float = Field(0.0, ge=0.0, description="Largest allowed drop in each threshold metric against the current staging/production holder.")
    fail_on_block: bool = Field(False, description="Fail the pipeline when the gate blocks.")


class PushSpec(_Strict):
    enabled: bool = Field(True, description="Push the final model.")
    destination: str = Field("buckets/{name}", min_length=1, description="Local path, hf://buckets/<ns>/<bucket>/<prefix>, hf://<ns>/<repo> or s3://bucket/prefix; '{name}' is replaced by the recipe name.")


class Recipe(_Strict):
    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Run name: letters, digits, '-', '_', '.'.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Random seed for data order, sampling and init.")
    algorithm: Algorithm = Field("grpo", description="Branch after the reward model: 'grpo' | 'rloo' | 'ppo' (RL stage) or 'dpo'.")
    output_dir: str = Field("runs", min_length=1, description="Where stage outputs go: <output_dir>/<name>/<stage>.")
    model: ModelSpec
    data: DataSpec = Field(default_factory=DataSpec)
    sft: SFTSpec = Field(default_factory=SFTSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    dpo: DPOSpec = Field(default_factory=DPOSpec)
    rl: RLSpec = Field(default_factory=RLSpec)
    evaluate: EvalSpec = Field(default_factory=EvalSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    gate: GateSpec = Field(default_factory=GateSpec)
    push: PushSpec = Field(default_factory=PushSpec)

    @model_validator(mode="after")
    def _cross_checks(self) -> "Recipe":
        problems = _cross_field_problems(self)
        if problems:
            raise _CrossFieldError(problems)
        return self

    @property
    def is_rl(self) -> bool:
        return self.algorithm in RL_ALGORITHMS

    def hash(self) -> str:
        """sha256 (hex, 16 chars) of the canonical JSON of this recipe."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Recipe":
        return cls.model_validate(json.loads(text))


# --------------------------------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class RecipeProblem:
    field: str
    value: Any
    message: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.message}"


class _CrossFieldError(ValueError):
    """Raised inside validation; carries the structured problems through pydantic's ValidationError."""

    def __init__(self, problems: list[RecipeProblem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


class RecipeError(ValueError):
    """A recipe that cannot run. ``problems`` lists every problem found."""

    def __init__(self, problems: list[RecipeProblem], source: str = "recipe"):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


def _cross_field_problems(r: Recipe) -> list[RecipeProblem]:
    out: list[RecipeProblem] = []
    if r.algorithm in ("grpo", "rloo") and r.rl.num_generations < 2:
        out.append(RecipeProblem("rl.num_generations", r.rl.num_generations,
                                 f"{r.algorithm.upper()} needs at least 2 completions per prompt to compare; set it to 2 or more"))
    if r.is_rl and r.rl.max_new_tokens >= r.model.max_seq_len:
        out.append(RecipeProblem("rl.max_new_tokens", r.rl.max_new_tokens, f"must be below model.max_seq_len={r.model.max_seq_len} (prompt + completion share the context); lower it or raise model.max_seq_len"))
    if r.is_rl and r.rl.num_actors % r.rl.num_learners != 0:
        out.append(RecipeProblem("rl.num_actors", r.rl.num_actors, f"must be a multiple of rl.num_learners={r.rl.num_learners} (each learner feeds the same number of actors); change one of them"))
    if r.is_rl and r.rl.engine == "trl" and r.algorithm != "grpo":
        out.append(RecipeProblem("rl.engine", r.rl.engine, f"TRL's GRPOTrainer runs only GRPO, not {r.algorithm}; set rl.engine=posttrain"))
    if r.is_rl and r.data.prompts is None:
        out.append(RecipeProblem("data.prompts", None, "RL needs prompts with gold answers; set data.prompts to e.g. {source: .../gsm8k/train.jsonl, format: gsm8k}"))
    if r.algorithm == "dpo" and r.data.preference is None:
        out.append(RecipeProblem("data.preference", None, "DPO needs preference pairs; set data.preference to e.g. {source: .../hh_rlhf/helpful-base/test.jsonl.gz, format: hh_rlhf}"))
    if r.is_rl and r.rl.rewards.reward_model > 0 and (r.data.preference is None or not r.reward.enabled):
        out.append(RecipeProblem("rl.rewards.reward_model", r.rl.rewards.reward_model, "a reward-model reward needs the reward stage: set reward.enabled=true and data.preference, or set this weight to 0"))
    if r.sft.enabled and not r.data.sft:
        out.append(RecipeProblem("data.sft", [], "SFT is enabled but has no data; add a dataset or set sft.enabled=false"))
    if r.reward.enabled and r.data.preference is None:
        out.append(RecipeProblem("data.preference", None, "the reward stage needs preference pairs; set data.preference or reward.enabled=false"))
    for fmt_field, spec, allowed in (
        ("data.prompts", r.data.prompts, ("gsm8k", "prompt_completion")),
        ("data.eval_prompts", r.data.eval_prompts, ("gsm8k", "prompt_completion")),
        ("data.preference", r.data.preference, ("hh_rlhf", "preference")),
        ("data.eval_preference", r.data.eval_preference, ("hh_rlhf", "preference")),
    ):
        if spec is not None and spec.format not in allowed:
            out.append(RecipeProblem(f"{fmt_field}.format", spec.format, f"must be one of {list(allowed)} for this role"))
    return out


# --------------------------------------------------------------------------------------------------- loading


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict, overrides: list[str] | None) -> dict:
    """Apply ``a.b=c`` overrides to a raw recipe dict (values parsed as YAML). Raises RecipeError on bad syntax."""
    data = copy.deepcopy(raw)
    problems = []
    for item in overrides or []:
        if "=" not in item:
            problems.append(RecipeProblem("--set", item, "write overrides as dotted.key=value, e.g. --set rl.max_steps=10"))
            continue
        key, value = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {} if node.get(part) is None else node[part]
            if not isinstance(node[part], dict):
                problems.append(RecipeProblem(key, value, f"'{part}' is not a section"))
                break
            node = node[part]
        else:
            node[parts[-1]] = _parse_scalar(value)
    if problems:
        raise RecipeError(problems, "overrides")
    return data


def _loc_to_field(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-after"))


def _lookup(raw: Any, loc: tuple) -> Any:
    node = raw
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def problems_from_validation_error(err: ValidationError, raw: dict) -> list[RecipeProblem]:
    out: list[RecipeProblem] = []
    for e in err.errors():
        loc = tuple(e["loc"])
        field = _loc_to_field(loc) or "<recipe>"
        if e["type"] == "extra_forbidden":
            out.append(RecipeProblem(field, e.get("input"), "unknown key; remove it or check its spelling (see `posttrain validate --schema`)"))
        elif e["type"] == "missing":
            out.append(RecipeProblem(field, None, "required field is missing; add it"))
        elif isinstance((e.get("ctx") or {}).get("error"), _CrossFieldError):
            out.extend(e["ctx"]["error"].problems)
        else:
            out.append(RecipeProblem(field, _lookup(raw, loc), f"{e['msg']}; fix the value"))
    return out


def validate_recipe(raw: dict, source: str = "recipe") -> Recipe:
    """Validate a raw dict into a Recipe. Raises RecipeError listing every problem (field, value, fix)."""
    if not isinstance(raw, dict):
        raise RecipeError([RecipeProblem("<recipe>", type(raw).__name__, "a recipe is a YAML mapping of sections")], source)
    try:
        return Recipe.model_validate(raw)
    except ValidationError as err:
        raise RecipeError(problems_from_validation_error(err, raw), source) from None


def read_recipe_file(path: str | Path) -> dict:
    """Read a recipe YAML into a dict. Raises RecipeError if missing or not YAML."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError([RecipeProblem("<file>", str(p), "recipe file not found; pass a path like pipelines/recipes/tiny-cpu.yaml")], str(p))
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError([RecipeProblem("<file>", str(p), f"not valid YAML: {exc}")], str(p)) from None
    return raw or {}


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load, override and validate a recipe file. Relative data/model paths stay as written (resolved from the CWD)."""
    raw = apply_overrides(read_recipe_file(path), overrides)
    return validate_recipe(raw, str(path))


def check_paths(recipe: Recipe) -> list[RecipeProblem]:
    """Problems with local paths named by the recipe (missing files), found before any model is loaded."""
    out: list[RecipeProblem] = []
    mp = recipe.model.name_or_path
    if _looks_local(mp):
        p = Path(mp)
        if not p.is_dir():
            out.append(RecipeProblem("model.name_or_path", mp, "directory not found" + _cwd_hint(mp) + "; give a local model directory or an HF model id like Qwen/Qwen2.5-0.5B"))
        else:
            if not (p / "config.json").is_file():
                out.append(RecipeProblem("model.name_or_path", mp, "no config.json in this directory; point at a saved HF model (save_pretrained output)"))
            if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")) and not any(p.glob("*.safetensors.index.json")):
                out.append(RecipeProblem("model.name_or_path", mp, "no weights (*.safetensors or *.bin) in this directory; copy the weights next to config.json"))
            if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")):
                out.append(RecipeProblem("model.name_or_path", mp, "no tokenizer files (tokenizer.json / tokenizer.model / vocab.json) in this directory; save the tokenizer next to the model"))
    specs = [("data.sft[%d]" % i, s) for i, s in enumerate(recipe.data.sft)]
    specs += [(f"data.{k}", getattr(recipe.data, k)) for k in ("preference", "prompts", "eval_prompts", "eval_preference")]
    for field, spec in specs:
        if spec is not None and _looks_local(spec.source) and not Path(spec.source).exists():
            out.append(RecipeProblem(f"{field}.source", spec.source, "file not found" + _cwd_hint(spec.source) + "; give an existing .jsonl/.jsonl.gz path or an HF dataset id like openai/gsm8k"))
    return out


def _cwd_hint(ref: str) -> str:
    """For a relative path: say where it was looked for (paths resolve from the current directory)."""
    return "" if Path(ref).is_absolute() else f" (relative paths resolve from the current directory, {Path.cwd()})"


def _looks_local(ref: str) -> bool:
    """A reference is local when it is an existing path, starts like a path, or has a data-file suffix."""
    if Path(ref).exists() or ref.startswith(("/", ".", "~")):
        return True
    return ref.endswith((".jsonl", ".jsonl.gz", ".json", ".parquet")) or ref.count("/") > 1


def _type_name(ann: Any) -> str:
    """Readable type: Literal choices spelled out, Optional shown as '| None'."""
    import typing

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " \\| ".join(_type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return "None" if ann is type(None) else getattr(ann, "__name__", str(ann).replace("typing.", ""))


def _sub_model(ann: Any) -> tuple[type[BaseModel] | None, str]:
    """The pydantic model inside ``ann`` (plain, Optional[...] or list[...]) and the path suffix it adds."""
    import typing

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann, ""
    for a in typing.get_args(ann):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a, "[]" if typing.get_origin(ann) is list else ""
    return None, ""


def schema_markdown() -> str:
    """Every recipe field with its type (choices spelled out), default and doc, as Markdown (`validate --schema`)."""
    lines = ["| field | type | default | description |", "|---|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            sub, suffix = _sub_model(f.annotation)
            if sub is not None:
                if suffix or not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)):
                    lines.append(f"| `{prefix}{name}` | {_type_name(f.annotation)} | "
                                 f"`{(f.default_factory() if f.default_factory else f.default)!r}` | {f.description or ''} |")
                walk(sub, f"{prefix}{name}{suffix}.")
                continue
            default = "**required**" if f.is_required() else f"`{(f.default_factory() if f.default_factory else f.default)!r}`"
            lines.append(f"| `{prefix}{name}` | {_type_name(f.annotation)} | {default} | {f.description or ''} |")

    walk(Recipe, "")
    return "\n".join(lines)
