"""Advantages and losses against hand computations (values worked out in the comments)."""

import math

import pytest
import torch

from posttrain.rl.advantages import gae, grpo_advantages, rloo_advantages, zero_std_fraction
from posttrain.rl.losses import aggregate, kl_k3, policy_loss


def test_grpo_advantages_with_and_without_std_scaling():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.5], [2.0, 2.0, 2.0, 2.0]])
    # group 0: mean 0.5, centred [.5, -.5, 0, 0], sample std sqrt(0.5/3) = 0.408248
    s = math.sqrt(0.5 / 3)
    a = grpo_advantages(r, scale=True, eps=0.0 + 1e-12)
    assert torch.allclose(a[0], torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]), atol=1e-5)
    assert torch.allclose(a[0], torch.tensor([1.224745, -1.224745, 0.0, 0.0]), atol=1e-5)
    assert torch.equal(a[1], torch.zeros(4))  # zero-std group: no signal, no NaN
    assert torch.allclose(grpo_advantages(r, scale=False)[0], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert zero_std_fraction(r) == 0.5


def test_rloo_leave_one_out_baseline():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.5]])
    # baselines: (0+.5+.5)/3=1/3, (1+.5+.5)/3=2/3, (1+0+.5)/3=.5, .5
    assert torch.allclose(rloo_advantages(r), torch.tensor([[2 / 3, -2 / 3, 0.0, 0.0]]), atol=1e-6)


def test_group_size_one_is_rejected():
    with pytest.raises(ValueError, match="n>=2"):
        grpo_advantages(torch.ones(3, 1))


def test_gae_three_step_toy():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.9]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0: d2 = 1 - .7 = .3; d1 = .9*.7 - .6 = .03, A1 = .03 + .72*.3 = .246; d0 = .9*.6 - .5 = .04,
    #        A0 = .04 + .72*.246 = .21712
    assert torch.allclose(adv[0], torch.tensor([0.21712, 0.246, 0.3]), atol=1e-6)
    assert torch.allclose(ret[0], torch.tensor([0.71712, 0.846, 1.0]), atol=1e-6)
    # row 1 (last token padded, its value ignored): d1 = 1 - .6 = .4; A0 = .04 + .72*.4 = .328
    assert torch.allclose(adv[1], torch.tensor([0.328, 0.4, 0.0]), atol=1e-6)


# ------------------------------------------------------------------ two-token toy policy
# policy: logits theta in R^2 (vocab of 2), one token per sequence; theta = 0 -> p = [.5, .5].
# sequence 0 sampled token 0 with advantage +1, sequence 1 token 1 with advantage -1.
# behaviour probabilities: 0.4 (token 0) and 0.6 (token 1).  d logp_k / d theta = e_k - p.

def _toy():
    theta = torch.zeros(2, requires_grad=True)
    logp_all = torch.log_softmax(theta, dim=0)
    logp = torch.stack([logp_all[0], logp_all[1]])[:, None]           # [2 seq, 1 token]
    behaviour = torch.log(torch.tensor([[0.4], [0.6]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 1)
    return theta, logp, behaviour, adv, mask


def test_ppo_loss_none_correction_value_and_gradient():
    theta, logp, b, adv, mask = _toy()
    loss, st = policy_loss(logp, b, adv, mask, correction="none", eps_low=0.2, eps_high=0.2)
    # r = [.5/.4, .5/.6] = [1.25, .8333]; token 0: min(1.25, 1.2) -> clipped (-1.2, no grad);
    # token 1: A=-1, min(-.8333, -.8333) = -.8333 -> loss +.8333. mean = (-1.2 + .8333)/2 = -.183333
    assert float(loss) == pytest.approx(-0.1833333, abs=1e-6)
    loss.backward()
    # grad = 1/2 * r1 * (e1 - p) = .5 * .8333 * [-.5, .5]
    assert torch.allclose(theta.grad, torch.tensor([-0.2083333, 0.2083333]), atol=1e-6)
    assert st.clip_fraction == pytest.approx(0.5)


def test_tis_loss_value_gradient_and_cap():
    theta, logp, b, adv, mask = _toy()
    loss, st = policy_loss(logp, b, adv, mask, correction="tis", tis_cap=2.0)
    # proximal = current -> r = 1; w = p/b = [1.25, .8333]; loss = (-1.25 + .8333)/2 = -.208333
    assert float(loss) == pytest.approx(-0.2083333, abs=1e-6)
    loss.backward()
    # grad = -(1.25*[.5,-.5] + (-.8333)*[-.5,.5]) / 2 = [-.5208333, .5208333]
    assert torch.allclose(theta.grad, torch.tensor([-0.5208333, 0.5208333]), atol=1e-6)
    assert st.iw_max == pytest.approx(1.25, abs=1e-6)
    _, logp2, _, _, _ = _toy()
    capped, st2 = policy_loss(logp2, b, adv, mask, correction="tis", tis_cap=1.1)
    assert float(capped) == pytest.approx((-1.1 + 0.8333333) / 2, abs=1e-6)
    assert st2.iw_max == pytest.approx(1.1)


def test_decoupled_loss_with_clipped_proximal_ratio():
    theta, logp, b, adv, mask = _toy()
    prox = torch.log(torch.tensor([[0.35], [0.55]]))
    loss, _ = policy_loss(logp, b, adv, mask, proximal_logp=prox, correction="decoupled", eps_low=0.2, eps_high=0.2)
    # r = [.5/.35 = 1.4286 -> clipped 1.2, .5/.55 = .90909]; w = [.35/.4 = .875, .55/.6 = .91667]
    # token 0: -.875*1.2 = -1.05 (no grad); token 1: +.91667*.90909 = .83333; mean = -.1083333
    assert float(loss) == pytest.approx(-0.1083333, abs=1e-6)
    loss.backward()
    assert torch.allclose(theta.grad, torch.tensor([-0.2083333, 0.2083333]), atol=1e-6)


def test_decoupled_masks_tokens_whose_weight_exceeds_the_cap():
    theta, logp, b, adv, mask = _toy()
    prox = torch.log(torch.tensor([[0.45], [0.55]]))  # w = [1.125, .91667]
    loss, st = policy_loss(logp, b, adv, mask, proximal_logp=prox, correction="decoupled", tis_cap=1.1)
    # token 0 (w 1.125 > 1.1) is masked; token 1: +.91667 * (.5/.55) = .83333; mean over 2 tokens
    assert float(loss) == pytest.approx(0.8333333 / 2, abs=1e-6)
    assert st.iw_max == pytest.approx(0.9166667, abs=1e-6)


def test_decoupled_equals_ppo_when_proximal_is_behaviour():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, requires_grad=True)
    tokens = torch.randint(0, 7, (3, 5))
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    behaviour = logp.detach() + 0.3 * torch.randn(3, 5)
    adv = torch.randn(3)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    l_dec, _ = policy_loss(logp, behaviour, adv, mask, proximal_logp=behaviour, correction="decoupled",
                           eps_low=0.2, eps_high=0.28)
    g_dec = torch.autograd.grad(l_dec, logits, retain_graph=True)[0]
    l_ppo, _ = policy_loss(logp, behaviour, adv, mask, correction="none", eps_low=0.2, eps_high=0.28)
    g_ppo = torch.autograd.grad(l_ppo, logits)[0]
    assert torch.allclose(l_dec, l_ppo) and torch.allclose(g_dec, g_ppo)
    assert float(l_ppo) != 0.0


def test_sequence_vs_token_aggregation():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(aggregate(x, mask, "token")) == pytest.approx(10 / 4)      # (1+2+3+4)/4
    assert float(aggregate(x, mask, "sequence")) == pytest.approx((2 + 4) / 2)
    with pytest.raises(ValueError, match="agg"):
        aggregate(x, mask, "tokens")


def test_kl_k3_hand_value():
    # d = log .25 - log .5 = -log 2: exp(d) - d - 1 = .5 + .693147 - 1 = .193147; zero when equal
    k = kl_k3(torch.log(torch.tensor([[0.5, 0.3]])), torch.log(torch.tensor([[0.25, 0.3]])))
    assert torch.allclose(k, torch.tensor([[0.1931472, 0.0]]), atol=1e-6)
