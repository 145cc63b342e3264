"""Stage ``evaluate``: the same held-out numbers for the final model and the base model.

For each of ``final`` (``inputs["model"]``) and ``base`` (``inputs["base_model"]``):
- ``gsm8k_accuracy``, ``format_rate``, ``answer_rate``: greedy completions (``evaluate.max_new_tokens``, left-padded
  batches of ``evaluate.batch_size``, stop ids from ``models.stop_token_ids``) of ``data.eval_prompts`` (at most
  ``evaluate.gsm8k_samples``), scored with ``rewards.gsm8k_correct`` / ``format_reward`` / ``extract_answer``;
- ``reward_model_score``: mean ``RewardModelScorer`` score of those completions (when ``inputs["reward_model"]``).

Once, when the input exists: ``final/rm_pairwise_accuracy`` (the reward model on the held-out preference pairs of
the reward stage, ties 0.5) and ``final/dpo_reward_accuracy`` / ``final/dpo_margin`` (the final policy's implicit
DPO rewards against ``inputs["reference"]``, beta = ``dpo.beta``). Plus ``delta/gsm8k_accuracy`` = final - base.

Both models are prompted with the final model's tokenizer template (the base stage saved the repaired tokenizer
every later stage inherits, so the templates are the same). Writes ``<out_dir>/metrics.json`` and
``<out_dir>/samples.jsonl`` (the first ``N_SAMPLES`` prompts with both models' completions).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from posttrain.recipe import Recipe
from posttrain.stages import StageResult

STAGE = "evaluate"
N_SAMPLES = 8


def run(recipe: Recipe, inputs: dict[str, str], out_dir: str) -> StageResult:
    """Evaluate ``inputs["model"]`` and ``inputs["base_model"]`` on held-out data.

    Raises StageError (missing input / eval data), ModelLoadError (an input without weights), DataError.
    """
    from posttrain import models
    from posttrain.artifacts import write_json_atomic
    from posttrain.stages import _common as c
    from posttrain.tracking import log_metrics, log_text, stage_run

    t0 = time.time()
    paths = {"final": c.require_model_input(inputs, "model", STAGE), "base": c.require_model_input(inputs, "base_model", STAGE)}
    for opt in ("reward_model", "reference"):
        if inputs.get(opt):
            c.require_model_input(inputs, opt, STAGE)
    m = recipe.model
    with stage_run(recipe.tracking.uri, recipe.tracking.experiment, STAGE, params={**recipe.evaluate.model_dump(), **paths}) as run_id:
        tokenizer, notes = models.load_tokenizer(paths["final"], m.chat_template, None, m.trust_remote_code)
        rows, report = c.eval_prompt_rows(recipe, tokenizer)
        metrics = c.log_reports([report])
        scorer = _scorer(inputs.get("reward_model"))
        records = {}
        for which in ("final", "base"):
            gm, records[which] = _policy_metrics(recipe, paths[which], rows, scorer, which)
            metrics.update({f"{which}/{k}": v for k, v in gm.items()})
        metrics["delta/gsm8k_accuracy"] = metrics["final/gsm8k_accuracy"] - metrics["base/gsm8k_accuracy"]
        if scorer is not None:
            metrics["final/rm_pairwise_accuracy"] = _rm_pairwise(recipe, inputs["reward_model"], scorer)
        if inputs.get("reference"):
            metrics.update(_dpo_metrics(recipe, paths["final"], inputs["reference"]))
        samples = _samples(records)
        log_text("\n".join(json.dumps(s) for s in samples), "samples.jsonl")
        wall = time.time() - t0
        log_metrics({**metrics, "wall_s": wall})
    write_json_atomic(Path(out_dir) / "metrics.json", metrics)
    _write_jsonl(Path(out_dir) / "samples.jsonl", samples)
    artifacts = {"metrics": str(Path(out_dir) / "metrics.json"), "samples": str(Path(out_dir) / "samples.jsonl")}
    c.write_manifest(out_dir, STAGE, recipe, inputs, metrics, artifacts, wall, run_id, list(notes))
    print(f"[posttrain] evaluate: gsm8k_accuracy final {metrics['final/gsm8k_accuracy']:.3f} vs base "
          f"{metrics['base/gsm8k_accuracy']:.3f}; format_rate final {metrics['final/format_rate']:.3f} vs base "
          f"{metrics['base/format_rate']:.3f} ({wall:.1f}s)", flush=True)
    return StageResult(STAGE, metrics, artifacts, wall, run_id, list(notes))


def _scorer(path: str | None):  # noqa: ANN202
    from posttrain.rewards import RewardModelScorer
    from posttrain.stages._common import device

    return RewardModelScorer(path, device=device()) if path else None


def _policy_metrics(recipe: Recipe, path: str, rows: list[dict], scorer, which: str) -> tuple[dict, list[dict]]:  # noqa: ANN001
    """GSM8K metrics (+ mean reward-model score) of the causal LM at ``path`` on ``rows``; and per-row records."""
    from posttrain import evaluation, models
    from posttrain.stages._common import device

    m, e = recipe.model, recipe.evaluate
    tokenizer, _ = models.load_tokenizer(path, m.chat_template, None, m.trust_remote_code)
    model = models.load_causal_lm(path, m.dtype, None, m.trust_remote_code).to(device())
    gm, records = evaluation.evaluate_gsm8k(model, tokenizer, rows, e.max_new_tokens, e.batch_size,
                                            models.stop_token_ids(tokenizer, model), desc=f"{which} gsm8k")
    out = {("gsm8k_accuracy" if k == "accuracy" else k): v for k, v in gm.items()}
    if scorer is not None:
        scores = scorer.score([r["prompt"] for r in rows], [r["completion"] for r in records])
        out["reward_model_score"] = sum(scores) / len(scores)
    del model
    return out, records


def _rm_pairwise(recipe: Recipe, rm_path: str, scorer) -> float:  # noqa: ANN001
    """Pairwise accuracy of the reward model on the reward stage's held-out pairs (rebuilt with its tokenizer)."""
    from posttrain import models
    from posttrain.evaluation import pairwise_accuracy
    from posttrain.stages._common import heldout_preference

    tok, _ = models.load_tokenizer(rm_path, recipe.model.chat_template, None, recipe.model.trust_remote_code)
    held = heldout_preference(recipe, tok)
    prompts = [r["prompt"] for r in held]
    return pairwise_accuracy(scorer.score(prompts, [r["chosen"] for r in held]),
                             scorer.score(prompts, [r["rejected"] for r in held]))


def _dpo_metrics(recipe: Recipe, final_path: str, ref_path: str) -> dict[str, float]:
    """``final/dpo_reward_accuracy`` and ``final/dpo_margin`` of the final policy against the reference."""
    from posttrain import models
    from posttrain.stages._common import device, heldout_preference
    from posttrain.stages.dpo import heldout_dpo_metrics

    m = recipe.model
    tok, _ = models.load_tokenizer(final_path, m.chat_template, None, m.trust_remote_code)
    held = heldout_preference(recipe, tok)
    policy = models.load_causal_lm(final_path, m.dtype, None, m.trust_remote_code).to(device())
    reference = models.load_causal_lm(ref_path, m.dtype, None, m.trust_remote_code).to(device())
    d = heldout_dpo_metrics(policy, reference, tok, held, recipe.dpo.beta, recipe.evaluate.batch_size, m.max_seq_len)
    return {"final/dpo_reward_accuracy": d["reward_accuracy"], "final/dpo_margin": d["margin"]} if d else {}


def _samples(records: dict[str, list[dict]]) -> list[dict]:
    """The first N_SAMPLES prompts with gold answer and both models' completions and correctness."""
    out = []
    for f, b in list(zip(records["final"], records["base"]))[:N_SAMPLES]:
        out.append({"question": f["question"], "gold": f["gold"], "final": f["completion"], "final_correct": f["correct"],
                    "base": b["completion"], "base_correct": b["correct"]})
    return out


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write JSON lines atomically (temp file + rename)."""
    from posttrain.artifacts import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
