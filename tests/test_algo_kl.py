"""KL estimators k1, k2, k3 (Schulman 2020) against hand-computed values."""

import math

import torch
from torch.testing import assert_close

from reinforge.algo import KL_ESTIMATORS
from reinforge.algo.kl import kl_k1, kl_k2, kl_k3

LOG2 = 0.6931471805599453


def test_registered_names():
    assert KL_ESTIMATORS.get("k1") is kl_k1
    assert KL_ESTIMATORS.get("k2") is kl_k2
    assert KL_ESTIMATORS.get("k3") is kl_k3


def test_hand_values_pi_half_ref_quarter():
    logp = torch.tensor([math.log(0.5)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25)], dtype=torch.float64)
    # log pi - log ref = log 2; r = ref/pi = 1/2
    assert_close(kl_k1(logp, ref), torch.tensor([LOG2], dtype=torch.float64))
    assert_close(kl_k2(logp, ref), torch.tensor([0.2402265069591007], dtype=torch.float64))  # (log 2)^2 / 2
    assert_close(kl_k3(logp, ref), torch.tensor([0.1931471805599453], dtype=torch.float64))  # 1/2 - 1 + log 2


def test_hand_values_pi_quarter_ref_half():
    logp = torch.tensor([math.log(0.25)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.5)], dtype=torch.float64)
    # r = 2: k1 = -log 2 (negative), k2 = (log 2)^2 / 2, k3 = 2 - 1 - log 2
    assert_close(kl_k1(logp, ref), torch.tensor([-LOG2], dtype=torch.float64))
    assert_close(kl_k2(logp, ref), torch.tensor([0.2402265069591007], dtype=torch.float64))
    assert_close(kl_k3(logp, ref), torch.tensor([1.0 - LOG2], dtype=torch.float64))


def test_k3_nonnegative_and_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    logp = -3 * torch.rand(4, 16, generator=g)
    ref = -3 * torch.rand(4, 16, generator=g)
    assert (kl_k3(logp, ref) >= 0).all()
    assert (kl_k2(logp, ref) >= 0).all()
    assert (kl_k1(logp, ref) < 0).any()  # k1 can be negative
    for fn in (kl_k1, kl_k2, kl_k3):
        assert fn(logp, logp).abs().max().item() == 0.0


def test_k3_gradient_wrt_logp():
    # d k3 / d logp = 1 - r with r = pi_ref / pi; at pi = 1/2, ref = 1/4: 1 - 1/2 = 0.5
    logp = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([math.log(0.25)], dtype=torch.float64)
    kl_k3(logp, ref).sum().backward()
    assert_close(logp.grad, torch.tensor([0.5], dtype=torch.float64))


def test_k3_finite_for_extreme_log_ratio():
    logp = torch.tensor([0.0, -200.0])
    ref = torch.tensor([-200.0, 0.0])
    out = kl_k3(logp, ref)
    assert torch.isfinite(out).all()
    assert_close(out[0], torch.tensor(math.exp(-20.0) - 1.0 + 20.0))


def test_monte_carlo_means_approximate_exact_kl():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact = 0.27488721956224654  # KL(p || q) = 0.5 log 2.5 + 0.2 log 0.4 = 0.3 log 2.5
    assert abs(float((p * (p / q).log()).sum()) - exact) < 1e-12
    g = torch.Generator().manual_seed(1234)
    x = torch.multinomial(p, 20000, replacement=True, generator=g)
    logp, ref = p.log()[x], q.log()[x]
    assert abs(kl_k1(logp, ref).mean().item() - exact) < 0.03
    assert abs(kl_k3(logp, ref).mean().item() - exact) < 0.03
    # k2 is biased: its expectation is E[(log p/q)^2] / 2 = 0.35 (log 2.5)^2
    assert abs(kl_k2(logp, ref).mean().item() - 0.29385604686146616) < 0.03
    # k3 has lower variance than k1 here
    assert kl_k3(logp, ref).var().item() < kl_k1(logp, ref).var().item()
