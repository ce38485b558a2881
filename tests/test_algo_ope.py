"""Off-policy evaluation estimators (algo/ope.py) against hand-computed values and a bandit's truth."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.ope import cumulative_ratios, ope_estimate, ope_value, per_episode_terms

# two episodes, gamma 0.5: A = rewards [1, 2], mu [0.5, 0.5], pi [1, 0.25] (ratios 2, 0.5: rho 2, 1);
# B = rewards [3] (one step, padded), mu 0.25, pi 0.5 (ratio 2: rho 2)
REWARDS = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
MU = torch.log(torch.tensor([[0.5, 0.5], [0.25, 1.0]]))
PI = torch.log(torch.tensor([[1.0, 0.25], [0.5, 1.0]]))
GAMMA = 0.5


def _value(estimator: str, **model) -> float:
    return ope_value(*per_episode_terms(estimator, REWARDS, MU, PI, MASK, GAMMA, **model))


def test_cumulative_ratios_stop_at_the_episode_end():
    assert torch.allclose(cumulative_ratios(MU, PI, MASK), torch.tensor([[2.0, 1.0], [2.0, 2.0]], dtype=torch.float64))


def test_estimators_by_hand():
    # returns G_A = 1 + 0.5 * 2 = 2, G_B = 3
    assert _value("is") == pytest.approx((1 * 2 + 2 * 3) / 2)           # 4
    assert _value("wis") == pytest.approx((1 * 2 + 2 * 3) / (1 + 2))    # 8/3
    assert _value("pdis") == pytest.approx(((2 * 1 + 0.5 * 1 * 2) + 2 * 3) / 2)  # (3 + 6) / 2
    # DR with Q(s_t, a_t) = [[1, 1], [2, 0]], V(s_t) = [[0.5, 2], [4, 0]]:
    # A: t0 2 (1 - 1) + 1 * 0.5 = 0.5; t1 1 (2 - 1) + 2 * 2 = 5 -> 0.5 + 0.5 * 5 = 3; B: 2 (3 - 2) + 4 = 6
    q = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    v = torch.tensor([[0.5, 2.0], [4.0, 0.0]])
    assert _value("dr", q_taken=q, v_pi=v) == pytest.approx((3 + 6) / 2)


def test_dr_with_an_exact_model_on_policy_has_no_variance():
    """pi = mu and Q = V = the true values: every episode's DR term is the true value V(s_0)."""
    rewards = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    logp = torch.zeros(2, 2)
    mask = torch.ones(2, 2)
    # Q(s_t, a_t) exact on each path: Q_t = r_t + gamma Q_{t+1}; V(s_t) the state's expected value (2 for both s_0)
    q = torch.tensor([[1.5, 1.0], [1.0, 2.0]])
    v = torch.tensor([[1.25, 1.0], [1.25, 2.0]])
    num, _ = per_episode_terms("dr", rewards, logp, logp, mask, 0.5, q_taken=q, v_pi=v)
    # episode 1: (1 - 1.5 + 1.25) + 0.5 (1 - 1 + 1) = 1.25; episode 2: (0 - 1 + 1.25) + 0.5 (2 - 2 + 2) = 1.25
    assert torch.allclose(num, torch.tensor([1.25, 1.25], dtype=torch.float64))


def test_importance_sampling_recovers_a_bandits_value():
    """mu uniform over two arms, pi picks arm 0 with 0.9; arm 0 pays 1, arm 1 pays 0: V(pi) = 0.9."""
    g = torch.Generator().manual_seed(0)
    arms = torch.randint(2, (20_000, 1), generator=g)
    rewards = (arms == 0).double()
    mu = torch.full((20_000, 1), math.log(0.5))
    pi = torch.where(arms == 0, math.log(0.9), math.log(0.1))
    mask = torch.ones(20_000, 1)
    for estimator in ("is", "wis", "pdis"):
        est = ope_estimate(*per_episode_terms(estimator, rewards, mu, pi.double(), mask, 1.0), samples=500)
        assert est["ci_low"] <= 0.9 <= est["ci_high"] and abs(est["value"] - 0.9) < 0.02, (estimator, est)


def test_dr_needs_a_model_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="dr needs"):
        _value("dr")
    with pytest.raises(ValueError, match="unknown estimator"):
        _value("magic")


def test_sharpe_ratio_at_k_by_hand():
    from reinforge.algo.ope import sharpe_ratio_at_k

    estimated, true = torch.tensor([3.0, 1.0, 2.0]), torch.tensor([10.0, 20.0, 4.0])
    # k = 2: the estimator's top two are policies 0 and 2 (true 10 and 4): best 10, std 3
    assert sharpe_ratio_at_k(estimated, true, 5.0, 2) == pytest.approx({"best": 10.0, "std": 3.0, "sharpe": 5 / 3})
    # k = 3: all three, mean 34/3, std sqrt((16 + 676 + 484) / 27)
    got = sharpe_ratio_at_k(estimated, true, 5.0, 3)
    assert got["best"] == 20.0 and got["sharpe"] == pytest.approx(15.0 / math.sqrt(1176 / 27))
    with pytest.raises(ValueError, match="k must be"):
        sharpe_ratio_at_k(estimated, true, 5.0, 1)


def test_sharpe_ratio_at_k_prefers_underestimating_the_best_to_overestimating_a_poor_policy():
    """The paper's first example: X underestimates the best policy, Y overestimates a poor one; both put the
    best first (the same best@2 = 10), but Y's portfolio includes the worst policy: std 4.5 against 4."""
    from reinforge.algo.ope import sharpe_ratio_at_k

    true = torch.tensor([1.0, 2.0, 10.0])  # policy 0 is the behaviour policy, J(pi_b) = 1
    x = sharpe_ratio_at_k(torch.tensor([1.0, 2.0, 5.0]), true, 1.0, 2)
    y = sharpe_ratio_at_k(torch.tensor([9.0, 2.0, 10.0]), true, 1.0, 2)
    assert x["best"] == y["best"] == 10.0
    assert x["sharpe"] == pytest.approx(9 / 4) and y["sharpe"] == pytest.approx(2.0)
