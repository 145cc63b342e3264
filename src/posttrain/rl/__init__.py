"""The asynchronous actor/learner RL engine.

Roles by rank in one torch.distributed job (gloo on CPU, NCCL on GPU): learner rank(s) train, actor ranks
generate. One home per idea:

- ``launch.py``   the job description (``LaunchSpec``), torchrun launcher, failure reporting (``JobError``)
- ``job.py``      the per-rank entry point: process groups, role dispatch
- ``actor.py``    the actor loop: generate, score, send ``RolloutBatch``es; receive weights in the background
- ``learner.py``  the learner loop: receive, filter stale samples, compute advantages and the loss, step, sync
- ``buffer.py``   staleness filter and backpressure rule (pure, unit-tested)
- ``messages.py`` the typed ``RolloutBatch`` message and its wire format
- ``transport.py`` rollout point-to-point transport over torch.distributed
- ``weights.py``  packed-bucket weight broadcast learner -> actors
- ``advantages.py``, ``losses.py``  the maths (flat tensor arguments, documented shapes)
- ``engines/``    generation backends (transformers; vLLM stub)
- ``trl_engine.py`` TRL's GRPOTrainer, for comparison

Nothing here imports torch at module import time except the modules that are only used inside the job.
"""
