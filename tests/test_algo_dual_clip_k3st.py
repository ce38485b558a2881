"""PPO dual-clip (Ye et al. 2020) and the straight-through k3 KL estimator, hand-computed."""

import math
from types import SimpleNamespace

import pytest
import torch
from part_calls import policy_loss
from torch.testing import assert_close

from reinforge.algo import KL_ESTIMATORS, POLICY_LOSSES
from reinforge.algo.kl import kl_k2, kl_k3, kl_k3_st
from reinforge.algo.policy_losses import PPOClipSettings, ppo_clip_loss

DUAL = SimpleNamespace(clip_low=0.2, clip_high=0.28, dual_clip=3.0)  # clip range [0.8, 1.28], cap c = 3
OFF = SimpleNamespace(clip_low=0.2, clip_high=0.28)

# (ratio, A, loss with dual clip c = 3, dual_clip_frac, clip_frac, d loss / d logp with dual clip)
CASES = [
    (4.0, -1.0, 3.0, 1.0, 0.0, 0.0),  # A<0: max(4, 1.28) = 4 > 3 = -A c -> capped, no gradient
    (2.5, -1.0, 2.5, 0.0, 0.0, 2.5),  # A<0: 2.5 < 3, unclipped term, gradient -A rho = 2.5
    (5.0, -0.5, 1.5, 1.0, 0.0, 0.0),  # A<0: max(2.5, 0.64) = 2.5 > 0.5 * 3 = 1.5 -> capped
    (10.0, 1.0, -1.28, 0.0, 1.0, 0.0),  # A>0: dual clip never applies; PPO clip at 1.28
    (0.5, -1.0, 0.8, 0.0, 1.0, 0.0),  # A<0, ratio < 0.8: clipped term 0.8 < 3
    (1.1, -2.0, 2.2, 0.0, 0.0, 2.2),  # A<0 inside the trust region
    (1.0, 0.0, 0.0, 0.0, 0.0, 0.0),  # A = 0
]


def _run(cfg, requires_grad=False):
    ratios, advs, *_ = zip(*CASES, strict=True)
    logp = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=requires_grad)
    adv = torch.tensor(advs, dtype=torch.float64)
    loss, metrics = policy_loss(ppo_clip_loss, logp, torch.zeros_like(logp), adv, torch.ones_like(adv), cfg)
    return logp, loss, metrics


def test_dual_clip_hand_values_and_metrics():
    _, loss, metrics = _run(DUAL)
    _, _, exp_loss, exp_dual, exp_clip, _ = zip(*CASES, strict=True)
    assert_close(loss, torch.tensor(exp_loss, dtype=torch.float64), atol=1e-12, rtol=0)
    assert_close(metrics["dual_clip_frac"], torch.tensor(exp_dual, dtype=torch.float64))
    assert_close(metrics["clip_frac"], torch.tensor(exp_clip, dtype=torch.float64))


def test_dual_clip_gradient_zero_on_capped_tokens():
    logp, loss, _ = _run(DUAL, requires_grad=True)
    loss.sum().backward()
    expected = torch.tensor([c[5] for c in CASES], dtype=torch.float64)
    assert_close(logp.grad, expected, atol=1e-12, rtol=0)
    # without the dual clip the same tokens have gradient -A rho: 4 and 0.5 * 5 = 2.5
    logp_off, loss_off, _ = _run(OFF, requires_grad=True)
    loss_off.sum().backward()
    assert_close(logp_off.grad[[0, 2]], torch.tensor([4.0, 2.5], dtype=torch.float64))


def test_dual_clip_off_is_unchanged_and_metric_present():
    _, loss_off, m_off = _run(OFF)
    _, loss_zero, m_zero = _run(SimpleNamespace(clip_low=0.2, clip_high=0.28, dual_clip=0.0))
    # plain PPO: 4, 2.5, 2.5, -1.28, 0.8, 2.2, 0
    assert_close(loss_off, torch.tensor([4.0, 2.5, 2.5, -1.28, 0.8, 2.2, 0.0], dtype=torch.float64))
    assert torch.equal(loss_off, loss_zero)
    assert m_off["dual_clip_frac"].sum().item() == 0.0 and m_zero["dual_clip_frac"].sum().item() == 0.0


def test_dual_clip_with_algo_config_and_invalid_constant():
    _, loss, metrics = _run(PPOClipSettings(clip_low=0.2, clip_high=0.28, dual_clip=3.0))
    assert metrics["dual_clip_frac"].sum().item() == 2.0
    assert loss[0].item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="dual_clip"):
        _run(SimpleNamespace(clip_low=0.2, clip_high=0.2, dual_clip=1.0))


def test_dual_clip_formula_mentions_paper():
    entry = next(e for e in POLICY_LOSSES.entries() if e.name == "ppo_clip")
    assert "1912.09729" in entry.paper and "dual" in entry.formula


# ----------------------------------------------------------------------------- k3_st

LOG2 = math.log(2.0)


def test_k3_st_registered():
    assert KL_ESTIMATORS.get("k3_st") is kl_k3_st
    entry = next(e for e in KL_ESTIMATORS.entries() if e.name == "k3_st")
    assert entry.formula and entry.paper and kl_k3_st.__doc__


@pytest.mark.parametrize(
    ("pi", "ref", "value", "grad"),
    [
        (0.5, 0.25, 0.5 - 1.0 + LOG2, LOG2),  # r = 1/2: k3 = r - 1 - log r; grad log pi - log ref = log 2
        (0.25, 0.5, 2.0 - 1.0 - LOG2, -LOG2),  # r = 2: k3 = 1 - log 2; grad -log 2
        (0.3, 0.3, 0.0, 0.0),
    ],
)
def test_k3_st_value_is_k3_gradient_is_k2(pi, ref, value, grad):
    logp = torch.tensor([math.log(pi)], dtype=torch.float64, requires_grad=True)
    ref_logp = torch.tensor([math.log(ref)], dtype=torch.float64)
    out = kl_k3_st(logp, ref_logp)
    assert_close(out.detach(), torch.tensor([value], dtype=torch.float64), atol=1e-12, rtol=0)
    out.sum().backward()
    assert_close(logp.grad, torch.tensor([grad], dtype=torch.float64), atol=1e-12, rtol=0)


def test_k3_st_matches_k3_value_and_k2_gradient_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    logp = (-3 * torch.rand(3, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = -3 * torch.rand(3, 7, generator=g, dtype=torch.float64)
    out = kl_k3_st(logp, ref)
    assert_close(out.detach(), kl_k3(logp, ref).detach())
    (grad_st,) = torch.autograd.grad(out.sum(), logp)
    (grad_k2,) = torch.autograd.grad(kl_k2(logp, ref).sum(), logp)
    assert_close(grad_st, grad_k2)
    assert_close(grad_st, (logp - ref).detach())
