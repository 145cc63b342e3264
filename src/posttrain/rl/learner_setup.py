"""Build the learner (policy, reference, value head, optimizer) from the recipe: the only place the learner
side reads recipe fields; everything below gets flat values."""

from __future__ import annotations


def learner_config(recipe):
    from posttrain.rl.learner import LearnerConfig

    rl = recipe.rl
    return LearnerConfig(
        algorithm=recipe.algorithm, temperature=rl.temperature, eps_low=rl.clip_eps_low, eps_high=rl.clip_eps_high,
        correction=rl.off_policy_correction, tis_cap=rl.tis_cap, scale_rewards=rl.scale_rewards,
        loss_agg=rl.loss_agg, kl_coef=rl.kl_coef, gamma=rl.gamma, gae_lambda=rl.gae_lambda, vf_coef=rl.vf_coef,
        grad_accum=rl.grad_accum, max_grad_norm=rl.max_grad_norm,
    )


def build_learner(ctx):
    """Returns ``(Learner, tokenizer)``. Raises ``ModelLoadError`` if the policy cannot be loaded."""
    import torch

    from posttrain.models import load_causal_lm, load_tokenizer
    from posttrain.rl.learner import Learner
    from posttrain.rl.model_setup import value_head, wrap_lora

    r = ctx.recipe
    torch.manual_seed(r.seed)
    tok, _ = load_tokenizer(ctx.model_path, r.model.chat_template)
    model = wrap_lora(load_causal_lm(ctx.model_path, r.model.dtype), r.model.lora).to(ctx.device)
    ref = None
    if r.rl.kl_coef > 0:
        if r.model.lora.enabled:
            ref = "adapter-disabled"  # the frozen base under the adapters is the reference
        else:
            ref = load_causal_lm(ctx.model_path, r.model.dtype).to(ctx.device).eval()
            ref.requires_grad_(False)
    head = value_head(model).to(ctx.device) if r.algorithm == "ppo" else None
    learner = Learner(model, learner_config(r), r.rl.learning_rate, ref_model=ref, value_head=head,
                      group=ctx.learner_group)
    return learner, tok
