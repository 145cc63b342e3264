"""Rollout transport: ``RolloutBatch`` messages actor -> learner over torch.distributed point-to-point.

Each message is an int64 length followed by the uint8 payload (``RolloutBatch.to_bytes``). Length 0 means
"end of stream" (the actor stopped). Works on gloo (CPU tensors); on NCCL the rollout group should be a gloo
group too (``job.py`` creates it that way), so rollouts never occupy the GPU links used for weights.
"""

from __future__ import annotations

from posttrain.rl.messages import RolloutBatch

_TAG_LEN, _TAG_DATA = 11, 12


def send_batch(batch: RolloutBatch | None, dst: int, group=None) -> int:
    """Send ``batch`` (or end-of-stream for None) to global rank ``dst``. Returns bytes sent. Blocks until sent."""
    import torch
    import torch.distributed as dist

    payload = b"" if batch is None else batch.to_bytes()
    dist.send(torch.tensor([len(payload)], dtype=torch.int64), dst=dst, group=group, tag=_TAG_LEN)
    if payload:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dist.send(data, dst=dst, group=group, tag=_TAG_DATA)
    return len(payload)


def recv_batch(src: int, group=None) -> RolloutBatch | None:
    """Receive one message from global rank ``src``; None means the actor ended its stream."""
    import torch
    import torch.distributed as dist

    n = torch.zeros(1, dtype=torch.int64)
    dist.recv(n, src=src, group=group, tag=_TAG_LEN)
    if int(n) == 0:
        return None
    data = torch.empty(int(n), dtype=torch.uint8)
    dist.recv(data, src=src, group=group, tag=_TAG_DATA)
    return RolloutBatch.from_bytes(data.numpy().tobytes())
