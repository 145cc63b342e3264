"""Small helpers the stage modules share: inputs, trainer arguments, loss history, data reports, manifests.

Only ``posttrain.stages.*`` read the recipe; these helpers take the pieces they need. Heavy imports stay inside
functions.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterable

from posttrain.artifacts import sha256_tree, write_json_atomic
from posttrain.errors import ModelLoadError, StageError

SFT_HOLDOUT_MAX = 128
"""At most this many SFT rows are held out for the held-out loss (the rest of ``data.eval_fraction`` trains)."""


def device() -> str:
    """"cuda" when a GPU is visible, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def require_model_input(inputs: dict[str, str], name: str, stage: str) -> str:
    """The path of model input ``name``, checked to be a saved HF model directory (config + weights).

    Raises StageError when the input is missing, ModelLoadError when the directory lacks config or weights;
    both before anything is loaded or trained.
    """
    path = inputs.get(name)
    if not path:
        raise StageError(f"stage {stage}: input {name!r} is missing (got {sorted(inputs)}); "
                         f"pass the model directory of the previous stage as inputs[{name!r}]")
    check_model_dir(path, f"{stage} input {name!r}")
    return path


def check_model_dir(path: str, what: str) -> None:
    """Raise ModelLoadError unless ``path`` is a directory with config.json and *.safetensors/*.bin weights."""
    p = Path(path)
    if not p.is_dir():
        raise ModelLoadError(f"{what}: {path!r} is not a directory; give the model directory a previous stage wrote "
                             "(<out_dir>/model) or a local save_pretrained output")
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"{what}: no config.json in {path!r}; point at a saved HF model (save_pretrained output)")
    if not (any(p.glob("*.safetensors")) or any(p.glob("*.bin")) or any(p.glob("*.safetensors.index.json"))):
        raise ModelLoadError(f"{what}: no weights (*.safetensors or *.bin) in {path!r}; the directory holds only "
                             f"{sorted(x.name for x in p.iterdir())}; rerun the stage that writes it or copy the weights")


def train_args_kwargs(spec: Any, seed: int, output_dir: str) -> dict:
    """Keyword arguments shared by SFTConfig/RewardConfig/DPOConfig from a recipe ``TrainSpec``.

    No checkpoints (``save_strategy="no"``), no integrations (``report_to="none"``: the stage logs to MLflow
    itself), the first step always logged (so ``train_loss_first`` is step 1's loss), CPU when no GPU is visible. bf16 autocast and gradient checkpointing only on a GPU (TRL turns both on
    by default; on a CPU bf16 autocast is slow and imprecise, and checkpointing only costs time).
    """
    import torch

    gpu = torch.cuda.is_available()
    return dict(bf16=gpu and torch.cuda.is_bf16_supported(), gradient_checkpointing=gpu,
        output_dir=output_dir, max_steps=spec.max_steps, learning_rate=spec.learning_rate,
        per_device_train_batch_size=spec.batch_size, per_device_eval_batch_size=spec.batch_size,
        gradient_accumulation_steps=spec.grad_accum, warmup_steps=spec.warmup_ratio,
        weight_decay=spec.weight_decay, max_grad_norm=spec.max_grad_norm, logging_steps=spec.logging_steps,
        logging_first_step=True,
        seed=seed, data_seed=seed, report_to="none", save_strategy="no", use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0, dataset_num_proc=None, disable_tqdm=False,
    )


def train_and_save(trainer: Any, scratch: str, tokenizer: Any, out_dir: str) -> Path:
    """Run ``trainer.train()``, drop its scratch dir, save the (LoRA-merged) model atomically to ``<out_dir>/model``."""
    import shutil

    from posttrain.artifacts import atomic_dir
    from posttrain.models import save_model

    try:
        trainer.train()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    model_dir = Path(out_dir) / "model"
    with atomic_dir(model_dir) as tmp:
        save_model(trainer.model, tokenizer, str(tmp))
    return model_dir


def loss_history_callback(prefix: str) -> Any:
    """A TrainerCallback that logs every trainer log entry (loss, lr, grad_norm, ...) to the active MLflow run
    as ``<prefix>/<key>`` at the trainer's global step, and keeps ``.history`` (list of dicts with "step").

    Each entry also feeds a ``posttrain.monitor.HealthMonitor`` (section ``prefix``: non-finite loss/grad_norm,
    divergence, plateau); new warnings print as ``[health]`` lines and collect in ``.health.warnings``; at the end
    of training the active run gets ``health.txt`` and the ``posttrain.health`` tag."""
    from transformers import TrainerCallback

    from posttrain.monitor import HealthMonitor, emit, record_mlflow
    from posttrain.tracking import log_metrics

    class _LossHistory(TrainerCallback):
        def __init__(self) -> None:
            self.history: list[dict] = []
            self.health = HealthMonitor(prefix)

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001 (transformers signature)
            logs = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
            if not logs:
                return
            self.history.append({"step": state.global_step, **logs})
            log_metrics({f"{prefix}/{k}": v for k, v in logs.items()}, step=state.global_step)
            emit(self.health.observe(state.global_step, logs))

        def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001 (transformers signature)
            record_mlflow(self.health.warnings)

    return _LossHistory()


def loss_summary(history: list[dict], key: str = "loss") -> dict[str, float]:
    """``train_loss_first``/``train_loss_last`` from a callback history (entries with ``key``); {} if none."""
    vals = [h[key] for h in history if key in h and math.isfinite(float(h[key]))]
    return {"train_loss_first": float(vals[0]), "train_loss_last": float(vals[-1])} if vals else {}


def log_reports(reports: Iterable[Any], prefix: str = "data") -> dict[str, float]:
    """Print each DataReport, log it as ``data/<name>.txt`` and its metrics as ``<prefix>/<name>/...``.

    Returns the metrics logged.
    """
    from posttrain.tracking import log_metrics, log_text

    out: dict[str, float] = {}
    for rep in reports:
        text = rep.render()
        print(text, flush=True)
        log_text(text, f"data/{rep.name}.txt")
        m = rep.to_metrics(f"{prefix}/{rep.name}/")
        log_metrics(m)
        out.update(m)
    return out


def input_hashes(inputs: dict[str, str]) -> dict[str, str]:
    """sha256 of each input path (file or tree)."""
    return {k: sha256_tree(v) for k, v in sorted(inputs.items()) if v and Path(v).exists()}


def write_manifest(out_dir: str, stage: str, recipe: Any, inputs: dict[str, str], metrics: dict[str, float],
                   artifacts: dict[str, str], wall_s: float, run_id: str | None, notes: list[str]) -> None:
    """Write ``<out_dir>/manifest.json`` atomically: stage, recipe hash, input paths and hashes, metrics, artifacts."""
    write_json_atomic(Path(out_dir) / "manifest.json", {
        "stage": stage, "recipe_hash": recipe.hash(), "inputs": dict(inputs), "input_hashes": input_hashes(inputs),
        "metrics": metrics, "artifacts": artifacts, "wall_s": wall_s, "mlflow_run_id": run_id, "notes": notes,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })


def cap_rows(rows: list, n: int) -> list:
    """The first ``n`` rows (rows are already shuffled with the recipe seed by the loaders)."""
    return rows[:n]


def preference_split(recipe: Any, tokenizer: Any) -> tuple[list[dict], list[dict], list[Any]]:
    """Training and held-out preference pairs per the recipe, plus the DataReports.

    Held-out pairs come from ``data.eval_preference`` when set, else ``split_holdout(data.eval_fraction)`` of
    ``data.preference``; at most ``evaluate.preference_pairs`` of them are kept. Raises DataError from the loaders,
    StageError when ``data.preference`` is not set.
    """
    from posttrain.data import load_preference, split_holdout

    d = recipe.data
    if d.preference is None:
        raise StageError("data.preference is not set; the reward and DPO stages need preference pairs, e.g. "
                         "{source: ../shared/data/hh_rlhf/helpful-base/test.jsonl.gz, format: hh_rlhf}")
    args = dict(tokenizer=tokenizer, max_seq_len=recipe.model.max_seq_len, overlength=d.overlength, seed=recipe.seed)
    rows, rep = load_preference(d.preference, **args)
    reports = [rep]
    if d.eval_preference is not None:
        held, held_rep = load_preference(d.eval_preference, field="data.eval_preference", **args)
        reports.append(held_rep)
        train = rows
    else:
        train, held = split_holdout(rows, d.eval_fraction, recipe.seed)
    return train, cap_rows(held, recipe.evaluate.preference_pairs), reports


def heldout_preference(recipe: Any, tokenizer: Any) -> list[dict]:
    """Only the held-out pairs of ``preference_split`` (the evaluate stage reuses the reward/DPO split); reads only
    ``data.eval_preference`` when it is set."""
    from posttrain.data import load_preference

    d = recipe.data
    if d.eval_preference is None:
        return preference_split(recipe, tokenizer)[1]
    held, _ = load_preference(d.eval_preference, tokenizer, recipe.model.max_seq_len, d.overlength, recipe.seed,
                              field="data.eval_preference")
    return cap_rows(held, recipe.evaluate.preference_pairs)


def eval_prompt_rows(recipe: Any, tokenizer: Any) -> tuple[list[dict], Any]:
    """Held-out GSM8K prompts from ``data.eval_prompts`` (at most ``evaluate.gsm8k_samples``; prompts without room
    for ``evaluate.max_new_tokens`` in ``model.max_seq_len`` are dropped and counted) and their DataReport.

    Raises StageError when ``data.eval_prompts`` is not set.
    """
    from posttrain.data import load_prompts

    spec = recipe.data.eval_prompts
    if spec is None:
        raise StageError("data.eval_prompts is not set; evaluation needs held-out prompts with gold answers, e.g. "
                         "{source: ../shared/data/gsm8k/test.jsonl, format: gsm8k, max_rows: 64}")
    rows, rep = load_prompts(spec, tokenizer, recipe.model.max_seq_len, recipe.seed, field="data.eval_prompts",
                             reserve_tokens=recipe.evaluate.max_new_tokens)
    return cap_rows(rows, recipe.evaluate.gsm8k_samples), rep


def load_saved_lm(path: str, dtype: str):  # noqa: ANN201
    """A causal LM from a directory a stage wrote (or an input), on ``device()``, in eval mode."""
    from posttrain.models import load_causal_lm

    return load_causal_lm(path, dtype).to(device()).eval()


def free_memory() -> None:
    """Return cached GPU memory after a trainer is dropped (no-op on CPU)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
