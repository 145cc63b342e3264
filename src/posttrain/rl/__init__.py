"""The asynchronous actor/learner RL engine.

Roles by rank in one torch.distributed job (gloo on CPU, NCCL on GPU): learner rank(s) train, actor ranks
generate. One home per idea:

- ``launch.py``   the job description (``LaunchSpec``), torchrun launcher, failure reporting (``JobError``)
- ``job.py``      the per-rank entry point: process groups, role dispatch; ``context.py`` what a rank knows
- ``actor.py``    the actor loop: generate, score (``scoring.py``), send ``RolloutBatch``es; weights arrive in
  a background thread
- ``learner_loop.py`` the learner loop: receive, drop stale samples, one step, broadcast weights, log
- ``learner.py``  one optimizer step (advantages, loss, grad accumulation, several learners);
  ``learner_setup.py`` / ``model_setup.py`` build it; ``logprobs.py`` recomputes token log-probs
- ``buffer.py``   staleness filter and backpressure rule (pure, unit-tested)
- ``messages.py`` the typed ``RolloutBatch`` message; ``transport.py`` its point-to-point transport;
  ``collate.py`` padding for the learner
- ``weights.py``  packed-bucket weight broadcast learner -> actors
- ``advantages.py``, ``losses.py``  the maths (flat tensor arguments, documented shapes)
- ``metrics.py``  per-step metrics, console line, MLflow, ``metrics.json``
- ``engines/``    generation backends (transformers; vLLM stub); ``prompts.py`` prompt rows
- ``trl_engine.py`` TRL's GRPOTrainer, for comparison

Nothing here imports torch at module import time except the modules that are only used inside the job.
"""
