"""Weight sync: bucket planning, and a real 2-process gloo broadcast of packed buckets that reproduces every
parameter exactly on the receiver (several buckets, two dtypes, LoRA-sized and big tensors)."""

import os
import socket

import torch
import torch.multiprocessing as mp

from posttrain.rl.weights import STOP, WeightBroadcaster, WeightReceiver, plan_buckets


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(300, 200, generator=g), torch.randn(7, generator=g), torch.randn(50, 40, generator=g),
            torch.randn(3, 3, generator=g).to(torch.bfloat16), torch.randn(400, 300, generator=g)]


def test_plan_buckets_groups_by_dtype_and_size():
    ps = _params(0)
    # 0.25 MiB buckets: 300x200 fp32 = 0.23 MiB; 400x300 fp32 = 0.46 MiB gets its own bucket
    buckets = plan_buckets(ps, bucket_mib=0.25)
    assert sorted(i for b in buckets for i in b) == list(range(len(ps)))
    assert all(len({ps[i].dtype for i in b}) == 1 for b in buckets)
    assert [3] in buckets and [4] in buckets
    assert len(plan_buckets(ps, bucket_mib=64)) == 2  # one per dtype


def _worker(rank, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        if rank == 0:
            b = WeightBroadcaster(_params(1), src=0, bucket_mib=0.25)
            stats = b.broadcast(3)
            b.stop()
            q.put(("learner", stats.n_buckets, stats.ms > 0))
        else:
            mine = [p.clone() for p in _params(2)]  # different values, same shapes
            r = WeightReceiver(mine, src=0, bucket_mib=0.25)
            version, flats = r.receive()
            r.apply(mine, flats)
            ok = all(torch.equal(a, b) for a, b in zip(mine, _params(1)))
            q.put(("actor", version, ok, r.receive()[0]))
    finally:
        torch.distributed.destroy_process_group()


def test_broadcast_reproduces_parameters_exactly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    got = {m[0]: m[1:] for m in (q.get(timeout=5) for _ in range(2))}
    assert all(p.exitcode == 0 for p in procs)
    assert got["actor"] == (3, True, STOP)
    assert got["learner"][0] == len(plan_buckets(_params(1), 0.25)) and got["learner"][1]
