"""Weight sync learner -> actors: torch.distributed broadcast of packed parameter buckets.

The learner flattens the synced parameters (all of them for full fine-tuning; only the trainable LoRA
adapters with LoRA) into a few large contiguous buffers per dtype (``bucket_mib`` each), so one sync is a
handful of broadcasts instead of one per tensor. A small int64 header goes first: ``[version, n_buckets]``;
``version = -1`` tells the actors to stop. Every sync is timed (milliseconds, learner side: pack + broadcast).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

STOP = -1


def synced_parameters(model) -> list:
    """The parameters that travel: trainable ones (LoRA adapters under PEFT, everything otherwise), in a fixed
    order (``named_parameters`` order, shared/tied tensors once)."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters to sync")
    return params


def plan_buckets(params, bucket_mib: float = 64.0) -> list[list[int]]:
    """Group parameter indices into buckets of one dtype and at most ``bucket_mib`` MiB (a larger tensor gets
    its own bucket). Returns a list of index lists, deterministic for the same parameter list."""
    limit = int(bucket_mib * (1 << 20))
    buckets: list[list[int]] = []
    current: dict = {}
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        b = current.get(p.dtype)
        if b is None or (b[1] + nbytes > limit and b[0]):
            b = current[p.dtype] = [[], 0]
            buckets.append(b[0])
        b[0].append(i)
        b[1] += nbytes
    return buckets


@dataclass
class SyncStats:
    version: int
    ms: float
    mib: float
    n_buckets: int


class WeightBroadcaster:
    """Learner side. ``broadcast(version)`` packs and sends the current parameters; returns ``SyncStats``."""

    def __init__(self, params, src: int, group=None, bucket_mib: float = 64.0):
        self.params, self.src, self.group = list(params), src, group
        self.buckets = plan_buckets(self.params, bucket_mib)

    def broadcast(self, version: int) -> SyncStats:
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()
        header = torch.tensor([version, len(self.buckets)], dtype=torch.int64)
        dist.broadcast(header, src=self.src, group=self.group)
        mib = 0.0
        if version != STOP:
            with torch.no_grad():
                for idx in self.buckets:
                    flat = torch.cat([self.params[i].detach().reshape(-1) for i in idx])
                    dist.broadcast(flat, src=self.src, group=self.group)
                    mib += flat.numel() * flat.element_size() / (1 << 20)
        return SyncStats(version, (time.perf_counter() - t0) * 1000.0, mib, len(self.buckets))

    def stop(self) -> None:
        self.broadcast(STOP)


class WeightReceiver:
    """Actor side. ``receive()`` blocks for the next broadcast and returns ``(version, flat_buffers)``;
    ``apply(model_params, flat_buffers)`` copies them into the actor's parameters."""

    def __init__(self, params, src: int, group=None, bucket_mib: float = 64.0):
        params = list(params)
        self.shapes = [(p.shape, p.dtype, p.numel()) for p in params]
        self.device = params[0].device
        self.src, self.group = src, group
        self.buckets = plan_buckets(list(params), bucket_mib)

    def receive(self):
        import torch
        import torch.distributed as dist

        header = torch.zeros(2, dtype=torch.int64)
        dist.broadcast(header, src=self.src, group=self.group)
        version = int(header[0])
        if version == STOP:
            return STOP, []
        if int(header[1]) != len(self.buckets):
            raise RuntimeError(f"weight sync: learner sent {int(header[1])} buckets, actor expects "
                               f"{len(self.buckets)}; learner and actor models differ (check LoRA settings)")
        flats = []
        for idx in self.buckets:
            n = sum(self.shapes[i][2] for i in idx)
            flat = torch.empty(n, dtype=self.shapes[idx[0]][1], device=self.device)
            dist.broadcast(flat, src=self.src, group=self.group)
            flats.append(flat)
        return version, flats

    def apply(self, params, flats) -> None:
        import torch

        params = list(params)
        with torch.no_grad():
            for idx, flat in zip(self.buckets, flats):
                off = 0
                for i in idx:
                    shape, _, n = self.shapes[i]
                    params[i].copy_(flat[off:off + n].view(shape))
                    off += n
