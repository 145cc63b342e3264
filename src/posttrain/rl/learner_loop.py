"""The learner role's main loop.

For each step: take rollout batches from the receive queue (one per actor), drop the ones more than
``max_staleness`` versions old, collate, one optimizer step, bump ``policy_version``, broadcast the weights
to the actors, log one line of metrics. After the last step: STOP the actors, drain their streams, save the
policy and ``metrics.json``.

The receive queue (one thread per actor feeding it) needs no size limit of its own: the actors' backpressure
rule (``buffer.Backpressure``) bounds it at ``(max_staleness + 1) x actors`` batches per learner.
"""

from __future__ import annotations

import queue
import threading
import time

from posttrain.rl.buffer import StalenessFilter


def _receive_forever(ctx, src: int, q: queue.Queue) -> None:
    from posttrain.rl.failures import record_failure
    from posttrain.rl.transport import recv_batch

    try:
        while True:
            b = recv_batch(src, ctx.rollout_group)
            q.put((src, b, time.perf_counter()))
            if b is None:
                return
    except BaseException as exc:  # noqa: BLE001 - recorded now, raised by the main thread
        record_failure(ctx.out_dir, ctx.rank, "learner", exc, where=f"recv-from-{src}")
        q.put((src, exc, time.perf_counter()))


def start_receivers(ctx) -> queue.Queue:
    q: queue.Queue = queue.Queue()
    for a in ctx.my_actors():
        threading.Thread(target=_receive_forever, args=(ctx, a, q), daemon=True,
                         name=f"recv-{a}").start()
    return q


def _get(q: queue.Queue, timeout: float):
    from posttrain.errors import JobError

    try:
        src, item, _ = q.get(timeout=timeout)
    except queue.Empty:
        raise JobError(f"learner waited {timeout:.0f} s (rl.collective_timeout_s) for a rollout batch; "
                       "an actor is stuck or dead") from None
    if isinstance(item, BaseException):
        raise JobError(f"receiving rollouts from rank {src} failed: {item}") from item
    if item is None:
        raise JobError(f"actor rank {src} ended its stream before the learner finished")
    return item


def collect(ctx, q: queue.Queue, filt: StalenessFilter, version: int) -> list:
    """Batches for one step: at least this learner's share of ``rl.prompts_per_step`` groups, none too stale."""
    rl = ctx.recipe.rl
    got, groups = [], 0
    while groups < ctx.groups_per_learner_step():
        b = _get(q, rl.collective_timeout_s)
        if filt.accept(b.policy_version, version, b.num_samples):
            got.append(b)
            groups += b.num_samples // rl.num_generations
    return got


def drain(ctx, q: queue.Queue) -> None:
    """After STOP: consume until every actor has sent end-of-stream."""
    open_actors = set(ctx.my_actors())
    while open_actors:
        src, item, _ = q.get(timeout=ctx.recipe.rl.collective_timeout_s)
        if item is None or isinstance(item, BaseException):
            open_actors.discard(src)


def run_learner(ctx) -> None:
    """Learner main loop. Writes ``<out>/model`` and ``<out>/metrics.json`` (rank 0)."""
    from posttrain.rl.collate import collate
    from posttrain.rl.learner_setup import build_learner
    from posttrain.rl.logprobs import probe_logprob
    from posttrain.rl.metrics import StepMeter
    from posttrain.rl.weights import WeightBroadcaster, synced_parameters

    rl = ctx.recipe.rl
    lead = ctx.rank == ctx.lead_learner
    learner, tok = build_learner(ctx)
    q = start_receivers(ctx)
    bcast = WeightBroadcaster(synced_parameters(learner.model), src=ctx.rank, group=ctx.weights_group,
                              bucket_mib=rl.weight_bucket_mib) if lead else None
    filt = StalenessFilter(ctx.effective_staleness())
    meter = StepMeter(ctx, enabled=lead)
    version = 0
    with meter.tracking():
        for step in range(rl.max_steps):
            depth = q.qsize()
            t0 = time.perf_counter()
            batches = collect(ctx, q, filt, version)
            wait_s = time.perf_counter() - t0
            m = learner.train_step(collate(batches, tok.pad_token_id))
            version += 1
            m["learner_param_spread"] = learner.param_spread()  # collective: every learner calls it
            if lead:
                m["learner_probe"] = probe_logprob(learner.model, tok)
                sync = bcast.broadcast(version)
                meter.step(step, version, batches, m, wait_s, sync, depth, filt)
        if lead:
            bcast.stop()
        drain(ctx, q)
        if lead:
            meter.finish(learner, tok)
