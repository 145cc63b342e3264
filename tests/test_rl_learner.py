"""Learner-side invariants on the real stories260K model: behaviour log-probs from the real HF engine equal the
learner's recomputation (importance weights exactly 1, up to float32 noise), and gradient accumulation
(4 micro-batches of 2) equals one batch of 8 in loss and gradients."""

import pytest
import torch

from posttrain.rl.collate import TrainBatch, collate
from posttrain.rl.learner import Learner, LearnerConfig
from posttrain.rl.messages import RolloutBatch

QUESTIONS = ["Tom has 3 apples and eats one.", "What color is the sky?", "Lily went to the park and saw a dog.",
             "How many legs does a cat have?"]


@pytest.fixture(scope="module")
def policy(stories260k):
    from posttrain.models import load_causal_lm, load_tokenizer

    torch.set_num_threads(1)
    tok, _ = load_tokenizer(stories260k)
    return load_causal_lm(stories260k), tok


def _rollouts(model, tok, temperature: float, n: int = 2, max_new: int = 20, seed: int = 0) -> TrainBatch:
    """Real generations from the HF engine, packed as the actor packs them."""
    from posttrain.models import format_prompt, stop_token_ids
    from posttrain.rl.engines.hf import HFEngine, left_pad

    eng = HFEngine(model, tok, stop_token_ids(tok, model))
    prompts = [tok(format_prompt(tok, q))["input_ids"] for q in QUESTIONS for _ in range(n)]
    torch.manual_seed(seed)
    g = eng.generate(prompts, max_new, temperature, 1.0)
    pid, pm = left_pad(prompts, tok.pad_token_id)
    T = max(len(c) for c in g.completion_ids)
    B = len(prompts)
    cid, cm, bl = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T)
    for i, (c, lp) in enumerate(zip(g.completion_ids, g.behaviour_logp)):
        cid[i, :len(c)], cm[i, :len(c)], bl[i, :len(lp)] = torch.tensor(c), 1, torch.tensor(lp)
    rewards = torch.arange(B, dtype=torch.float32) % 3  # varied rewards within every group
    b = RolloutBatch(0, 1, 0, pid, pm, cid, cm, bl, rewards, torch.arange(len(QUESTIONS)).repeat_interleave(n))
    return collate([RolloutBatch.from_bytes(b.to_bytes())], tok.pad_token_id)  # through the wire format


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_importance_weights_are_one_on_policy(policy, temperature):
    from posttrain.rl.logprobs import forward_logprobs
    from posttrain.rl.losses import policy_loss

    model, tok = policy
    batch = _rollouts(model, tok, temperature)
    assert int(batch.completion_mask.sum()) > 40
    with torch.no_grad():
        logp, _, _ = forward_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                      batch.completion_mask, temperature)
    m = batch.completion_mask.bool()
    iw = torch.exp(logp - batch.behaviour_logp)[m]
    assert torch.allclose(iw, torch.ones_like(iw), atol=1e-4), float((iw - 1).abs().max())
    _, st = policy_loss(logp, batch.behaviour_logp, torch.ones(batch.num_rows), batch.completion_mask,
                        correction="tis")
    assert st.iw_mean == pytest.approx(1.0, abs=1e-5) and st.iw_max == pytest.approx(1.0, abs=1e-4)
    # recomputing at the wrong temperature must NOT give 1 (the check can fail)
    with torch.no_grad():
        wrong, _, _ = forward_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                       batch.completion_mask, temperature + 0.3)
    assert float((torch.exp(wrong - batch.behaviour_logp)[m] - 1).abs().max()) > 1e-2


def _grads(learner):
    return torch.cat([p.grad.reshape(-1) for p in learner.params if p.grad is not None])


@pytest.mark.parametrize("algorithm,agg", [("grpo", "token"), ("grpo", "sequence"), ("ppo", "token")])
def test_grad_accumulation_4x2_equals_1x8(policy, algorithm, agg):
    import copy

    from posttrain.rl.model_setup import value_head

    model, tok = policy
    batch = _rollouts(model, tok, 1.0)
    assert batch.num_rows == 8
    lengths = batch.completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 1 or batch.prompt_mask.sum(1).unique().numel() > 1  # padding exercised
    results = []
    for accum in (1, 4):
        m = copy.deepcopy(model)
        head = value_head(m) if algorithm == "ppo" else None
        if head is not None:
            torch.nn.init.normal_(head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
        cfg = LearnerConfig(algorithm=algorithm, loss_agg=agg, grad_accum=accum, correction="tis", kl_coef=0.0)
        learner = Learner(m, cfg, lr=1e-3, value_head=head)
        stats = learner.accumulate(batch)
        results.append((stats["loss"], _grads(learner)))
    (l1, g1), (l4, g4) = results
    assert l1 == pytest.approx(l4, rel=1e-5, abs=1e-7)
    assert torch.allclose(g1, g4, rtol=1e-4, atol=1e-6), float((g1 - g4).abs().max())
    assert float(g1.abs().sum()) > 0


def test_one_step_moves_logprobs_toward_high_reward(policy):
    """A GRPO step must raise the log-prob of the completions with positive advantage (sign check)."""
    import copy

    from posttrain.rl.logprobs import forward_logprobs

    model, tok = policy
    batch = _rollouts(model, tok, 1.0)
    m = copy.deepcopy(model)
    learner = Learner(m, LearnerConfig(algorithm="grpo"), lr=1e-2)
    adv, _ = learner.advantages(batch)

    def seq_logp(mm):
        with torch.no_grad():
            lp, _, _ = forward_logprobs(mm, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                        batch.completion_mask)
        return (lp * batch.completion_mask).sum(1)

    before = seq_logp(m)
    out = learner.train_step(batch)
    delta = seq_logp(m) - before
    assert out["reward_mean"] == pytest.approx(float(batch.rewards.mean()))
    assert float((delta * adv).sum()) > 0


def test_lora_syncs_adapters_only_and_kl_uses_the_frozen_base(policy):
    import copy

    from posttrain.recipe import LoraSpec
    from posttrain.rl.model_setup import wrap_lora
    from posttrain.rl.weights import plan_buckets, synced_parameters

    model, tok = policy
    batch = _rollouts(model, tok, 1.0)
    m = wrap_lora(copy.deepcopy(model), LoraSpec(enabled=True, r=4, alpha=8))
    synced = synced_parameters(m)
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names) and len(synced) == len(names)
    assert sum(p.numel() for p in synced) < sum(p.numel() for p in m.parameters()) // 5
    assert len(plan_buckets(synced, bucket_mib=64)) == 1
    learner = Learner(m, LearnerConfig(kl_coef=0.1), lr=5e-2, ref_model="adapter-disabled")
    first = learner.train_step(batch)
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # lora_B starts at 0: policy == reference
    second = learner.train_step(batch)
    assert second["kl"] > 1e-6  # the adapters moved the policy away from the frozen base


def test_batch_without_signal_does_not_move_the_policy(policy):
    """After a real step (Adam has momentum), a batch whose groups all have equal rewards must leave every weight
    unchanged: zero advantages give a zero gradient, and an optimizer step would still drift along the momentum."""
    import copy

    model, tok = policy
    batch = _rollouts(model, tok, 1.0)
    m = copy.deepcopy(model)
    learner = Learner(m, LearnerConfig(algorithm="grpo"), lr=1e-2)
    assert learner.train_step(batch)["skipped_step"] == 0.0
    flat = batch.rewards.clone()
    flat[:] = 0.5
    batch.rewards = flat
    before = [p.detach().clone() for p in m.parameters()]
    out = learner.train_step(batch)
    assert out["skipped_step"] == 1.0 and out["zero_std_groups"] == 1.0
    assert all(torch.equal(a, p.detach()) for a, p in zip(before, m.parameters()))
