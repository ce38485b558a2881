"""Lite PPO's advantage (group mean, batch std) and RPG's KL-regularised surrogates against hand-computed values."""

import math

import pytest
import torch
from part_calls import advantage
from torch.testing import assert_close

from reinforge.algo import ADVANTAGES
from reinforge.algo.advantage_estimators import reinforce_pp_baseline_advantage
from reinforge.algo.lite_ppo import lite_ppo_advantage

# g0 = [1, 0, 0, 0] (one right of four), g1 = [1, 1, 1, 1] (all right)
LITE_R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
LITE_G = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
ONES = torch.ones(8, 2)


def test_lite_ppo_registered():
    entry = ADVANTAGES.entry("lite_ppo")
    assert "2508.08221" in entry.paper and "std_batch" in entry.formula


def test_lite_ppo_std_of_raw_rewards():
    # group means 0.25, 1 -> centred d = [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]
    # raw rewards: mean 5/8; squared deviations 0.140625 (x5: the four 1s of g1 and row 0) + 0.390625 (x3)
    # = 0.703125 + 1.171875 = 1.875; unbiased var 1.875 / 7 = 0.267857; sigma = 0.517549
    sigma = math.sqrt(1.875 / 7)
    adv = advantage(lite_ppo_advantage, LITE_R, LITE_G, ONES, cfg={"adv_eps": 1e-12})
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0]) / sigma
    assert_close(adv, expected[:, None].expand(8, 2), atol=1e-6, rtol=0)
    assert adv[0, 0].item() == pytest.approx(1.44914, abs=1e-5)


def test_lite_ppo_std_of_centred_rewards_is_rolls():
    # centred d: sum of squares 0.5625 + 3 * 0.0625 = 0.75; unbiased var 0.75 / 7; sigma = 0.327327
    sigma = math.sqrt(0.75 / 7)
    adv = advantage(lite_ppo_advantage, LITE_R, LITE_G, ONES, cfg={"adv_eps": 1e-12, "std_of": "centred"})
    assert adv[0, 0].item() == pytest.approx(0.75 / sigma, abs=1e-6)  # 2.29129
    assert adv[1, 0].item() == pytest.approx(-0.25 / sigma, abs=1e-6)


def test_lite_ppo_differs_from_reinforce_pp_baseline():
    # reinforce_pp_baseline: d's population std sqrt(0.75 / 8) = 0.306186 -> A_0 = 2.44949; Lite PPO's
    # raw-reward batch std 0.517549 -> A_0 = 1.44914: the spread between the group means (0.25 vs 1)
    # enters Lite PPO's scale and not REINFORCE++-baseline's.
    lite = advantage(lite_ppo_advantage, LITE_R, LITE_G, ONES, cfg={"adv_eps": 1e-12})
    rpp = advantage(reinforce_pp_baseline_advantage, LITE_R, LITE_G, ONES, cfg={"adv_eps": 1e-12})
    assert rpp[0, 0].item() == pytest.approx(0.75 / math.sqrt(0.75 / 8), abs=1e-6)
    assert lite[0, 0].item() == pytest.approx(1.44914, abs=1e-5)
    assert torch.equal(torch.sign(lite), torch.sign(rpp))


def test_lite_ppo_equal_rewards_and_mask():
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    adv = advantage(lite_ppo_advantage, torch.ones(4), torch.tensor([0, 0, 1, 1]), mask)
    assert torch.equal(adv, torch.zeros(4, 2))
    # one group [2, 0], one [1]: d = [1, -1, 0]; raw r [2, 0, 1] -> unbiased std 1 -> A = [1, -1, 0]
    adv = advantage(lite_ppo_advantage, torch.tensor([2.0, 0.0, 1.0]), torch.tensor([0, 0, 1]),
                    torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]), cfg={"adv_eps": 1e-12})
    assert_close(adv, torch.tensor([[1.0, 0.0], [-1.0, -1.0], [0.0, 0.0]]), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- RPG
from part_calls import policy_loss  # noqa: E402

from reinforge.algo import POLICY_LOSSES  # noqa: E402
from reinforge.algo.rpg import rpg_loss  # noqa: E402

# five tokens: A = [1, 1, -1, -1, -1], w = pi/pi_old = [1.0, 1.5, 0.5, 1.1, 5.0]
RPG_A = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
RPG_W = torch.tensor([[1.0, 1.5, 0.5, 1.1, 5.0]])
RPG_OLD = torch.full((1, 5), -1.0)
RPG_MASK = torch.ones(1, 5)


def _rpg_grad(cfg: dict) -> tuple[torch.Tensor, dict]:
    logp = (RPG_OLD + torch.log(RPG_W)).requires_grad_(True)
    loss, metrics = policy_loss(rpg_loss, logp, RPG_OLD, RPG_A, RPG_MASK, cfg=cfg)
    loss.sum().backward()
    return logp.grad, metrics


def test_rpg_registered():
    entry = POLICY_LOSSES.entry("rpg")
    assert "2505.17508" in entry.paper and "sg(w_t A_t + k_t)" in entry.formula


def test_rpg_style_clip_ufkl():
    # u = clip(w, 0.8, 1.28) = [1, 1.28, 0.8, 1.1, 1.28]; ufkl k = 0.1 (1 - u) = [0, -0.028, 0.02, -0.01, -0.028]
    # mask: t0 A>0, w 1 < 1.28 keep | t1 w 1.5 >= 1.28 drop | t2 A<0, w 0.5 < 0.8 drop
    #       t3 A<0, 0.8 <= 1.1 < 3 keep | t4 w 5 >= c = 3 drop
    # dL/dlog pi = -M (w A + k): t0 -(1 + 0) = -1; t3 -(-1.1 - 0.01) = 1.11
    grad, metrics = _rpg_grad({"kl": "ufkl", "beta": 0.1})
    assert_close(grad, torch.tensor([[-1.0, 0.0, 0.0, 1.11, 0.0]]), atol=1e-6, rtol=0)
    assert_close(metrics["clip_frac"], torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]]))
    assert_close(metrics["rpg/kl_weight"], torch.tensor([[0.0, -0.028, 0.02, -0.01, -0.028]]), atol=1e-6, rtol=0)


def test_rpg_kl_weights_per_divergence():
    # token t3 (w = u = 1.1, A = -1, kept), beta 0.1: k = fkl 0.1 | rkl -0.11 (ln 1.1 + 1) = -0.120484
    #   | ufkl -0.01 | urkl -0.11 ln 1.1 = -0.0104841; dL/dlog pi = -(-1.1 + k)
    ln = math.log(1.1)
    for kind, k in (("fkl", 0.1), ("rkl", -0.11 * (ln + 1)), ("ufkl", -0.01), ("urkl", -0.11 * ln)):
        grad, _ = _rpg_grad({"kl": kind, "beta": 0.1})
        assert grad[0, 3].item() == pytest.approx(1.1 - k, abs=1e-6), kind
        assert grad[0, 1].item() == 0.0 and grad[0, 4].item() == 0.0


def test_rpg_hard_clip_keeps_every_token():
    # hard: weight u A + k = [1, 1.28 - 0.028, -0.8 + 0.02, -1.1 - 0.01, -1.28 - 0.028]; dL/dlog pi = -weight
    grad, metrics = _rpg_grad({"kl": "ufkl", "beta": 0.1, "clip": "hard"})
    assert_close(grad, torch.tensor([[-1.0, -1.252, 0.78, 1.11, 1.308]]), atol=1e-6, rtol=0)
    assert_close(metrics["clip_frac"], torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]]))


def test_rpg_beta_zero_on_policy_is_reinforce():
    # w = 1 everywhere, beta 0: every token kept, gradient -A (REINFORCE's)
    logp = torch.full((1, 5), -1.0, requires_grad=True)
    loss, _ = policy_loss(rpg_loss, logp, RPG_OLD, RPG_A, RPG_MASK, cfg={"beta": 0.0})
    loss.sum().backward()
    assert_close(logp.grad, -RPG_A)
