"""The actor role: generate, score, send; receive weights in the background.

Main loop (one screen): apply any weights that arrived -> wait while the backpressure rule forbids the next
batch -> generate ``groups x n`` completions with the current weights -> score them -> send a ``RolloutBatch``
to the learner. A background thread sits in the weight broadcast, so a sync costs the generation loop only
the copy into the model between two batches. The learner's STOP broadcast ends the loop; the actor then
sends end-of-stream.
"""

from __future__ import annotations

import threading
import time

from posttrain.rl.buffer import Backpressure
from posttrain.rl.weights import STOP


class WeightInbox:
    """The latest weights received by the background thread (thread-safe)."""

    def __init__(self, on_error=None):
        self.on_error = on_error  # called with the exception, in the thread, the moment it happens
        self.cond = threading.Condition()
        self.pending = None      # (version, flats) not yet applied
        self.stopped = False
        self.error: BaseException | None = None

    def run(self, receiver) -> None:
        try:
            while True:
                version, flats = receiver.receive()
                with self.cond:
                    if version == STOP:
                        self.stopped = True
                    else:
                        self.pending = (version, flats)
                    self.cond.notify_all()
                if version == STOP:
                    return
        except BaseException as exc:  # noqa: BLE001 - surfaced in the main thread
            if self.on_error is not None:
                self.on_error(exc)
            with self.cond:
                self.error, self.stopped = exc, True
                self.cond.notify_all()

    def take(self, block: bool):
        """Pending weights (or None); with ``block``, wait until some arrive or the stream stops."""
        with self.cond:
            while block and self.pending is None and not self.stopped:
                self.cond.wait(timeout=1.0)
            if self.error is not None:
                raise RuntimeError(f"weight receiver failed: {self.error}") from self.error
            out, self.pending = self.pending, None
            return out


def run_actor(ctx) -> None:
    """Actor main loop. Raises on any failure (the job reports it with this rank's number)."""
    import torch

    from posttrain.rl.transport import send_batch
    from posttrain.rl.weights import WeightReceiver

    setup = _build_actor(ctx)
    engine, rl = setup["engine"], ctx.recipe.rl
    targets = engine.sync_targets()
    receiver = WeightReceiver(targets, src=ctx.lead_learner, group=ctx.weights_group,
                              bucket_mib=rl.weight_bucket_mib)
    from posttrain.rl.failures import record_failure

    inbox = WeightInbox(lambda exc: record_failure(ctx.out_dir, ctx.rank, "actor", exc, where="weights"))
    thread = threading.Thread(target=inbox.run, args=(receiver,), daemon=True, name="weights")
    thread.start()
    torch.manual_seed(ctx.recipe.seed * 1000 + ctx.rank)
    bp, version, waited = Backpressure(ctx.effective_staleness()), 0, 0.0
    while True:
        t_wait = time.perf_counter()
        got = inbox.take(block=False)
        while True:
            if got is not None:
                version = got[0]
                receiver.apply(targets, got[1])
                engine.weights_loaded()
                setup["probe"] = None
            if inbox.stopped or bp.may_generate(version):
                break
            got = inbox.take(block=True)
        if inbox.stopped:
            break
        waited += time.perf_counter() - t_wait
        batch = _rollout(ctx, setup, version, bp.produced)
        batch.wait_seconds = waited
        t_send = time.perf_counter()
        send_batch(batch, dst=ctx.learner_of(ctx.rank), group=ctx.rollout_group)
        waited = time.perf_counter() - t_send
        bp.record_batch()
    send_batch(None, dst=ctx.learner_of(ctx.rank), group=ctx.rollout_group)
    thread.join(timeout=10)


def _build_actor(ctx) -> dict:
    from posttrain.models import load_causal_lm, load_tokenizer, stop_token_ids
    from posttrain.rl.engines import make_engine
    from posttrain.rl.model_setup import wrap_lora
    from posttrain.rl.prompts import PromptCycler, load_prompt_rows
    from posttrain.rl.scoring import make_scorer

    r = ctx.recipe
    tok, _ = load_tokenizer(ctx.model_path, r.model.chat_template)
    scorer = make_scorer(r.rl.rewards, ctx.reward_model_path, device=ctx.device)
    model = wrap_lora(load_causal_lm(ctx.model_path, r.model.dtype), r.model.lora).to(ctx.device)
    engine = make_engine(r.rl.backend, model, tok, stop_token_ids(tok, model), ctx.device, ctx.model_path)
    rows, _ = load_prompt_rows(r, tok)
    return {"engine": engine, "tokenizer": tok, "scorer": scorer, "model": model, "probe": None,
            "prompts": PromptCycler(rows, r.seed * 7919 + ctx.actor_index)}


def _rollout(ctx, setup, version: int, index: int):
    """Generate and score one batch of ``groups x n`` completions. Returns a ``RolloutBatch``."""
    import torch

    from posttrain.rl.engines.hf import left_pad
    from posttrain.rl.messages import RolloutBatch

    from posttrain.rl.logprobs import probe_logprob

    rl, tok = ctx.recipe.rl, setup["tokenizer"]
    if setup["probe"] is None and hasattr(setup["model"], "parameters"):
        setup["probe"] = probe_logprob(setup["model"], tok)  # once per weights version
    t0 = time.perf_counter()
    rows = setup["prompts"].take(ctx.groups_per_actor_batch())
    prompt_ids = [r["ids"] for r in rows for _ in range(rl.num_generations)]
    gen = setup["engine"].generate(prompt_ids, rl.max_new_tokens, rl.temperature, rl.top_p)
    texts = [tok.decode(c, skip_special_tokens=True) for c in gen.completion_ids]
    prompts_text = [r["prompt"] for r in rows for _ in range(rl.num_generations)]
    golds = [r["answer"] for r in rows for _ in range(rl.num_generations)]
    totals, parts = setup["scorer"].score(prompts_text, texts, golds)
    pid, pmask = left_pad(prompt_ids, tok.pad_token_id)
    T = max(1, max(len(c) for c in gen.completion_ids))
    B = len(prompt_ids)
    cid = torch.full((B, T), tok.pad_token_id, dtype=torch.long)
    cmask = torch.zeros((B, T), dtype=torch.long)
    blp = torch.zeros((B, T), dtype=torch.float32)
    for i, (c, lp) in enumerate(zip(gen.completion_ids, gen.behaviour_logp)):
        cid[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        cmask[i, :len(c)] = 1
        blp[i, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return RolloutBatch(
        policy_version=version, actor_rank=ctx.rank, batch_index=index, prompt_ids=pid, prompt_mask=pmask,
        completion_ids=cid, completion_mask=cmask, behaviour_logp=blp,
        rewards=torch.tensor(totals, dtype=torch.float32),
        group_ids=torch.arange(len(rows)).repeat_interleave(rl.num_generations),
        reward_parts={k: torch.tensor(v) for k, v in parts.items()},
        gen_seconds=time.perf_counter() - t0, completions_text=texts[:2], probe_logp=setup["probe"] or 0.0,
    )
