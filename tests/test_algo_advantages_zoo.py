"""dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline and opo against hand-computed values."""

import math
from types import SimpleNamespace

import pytest
import torch
from part_calls import advantage
from torch import Tensor
from torch.testing import assert_close

from reinforge.algo import ADVANTAGES
from reinforge.algo.advantage_estimators import (
    dr_grpo_advantage,
    opo_advantage,
    reinforce_pp_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
)

NEW = {
    "dr_grpo": dr_grpo_advantage,
    "rloo": rloo_advantage,
    "reinforce_pp": reinforce_pp_advantage,
    "reinforce_pp_baseline": reinforce_pp_baseline_advantage,
    "opo": opo_advantage,
}

# Shared batch. groups: g0 = [0, 0, 3] (size 3) | g1 = [1, 3] (size 2) | g2 = [7] (size 1)
#                       | g3 = [5, 5] (size 2, all equal)
REWARDS = torch.tensor([0.0, 0.0, 3.0, 1.0, 3.0, 7.0, 5.0, 5.0])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
MASK = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],  # l = 1
        [0.0, 0.0, 0.0, 0.0],  # l = 0 (zero-length response)
        [0.0, 1.0, 1.0, 0.0],  # l = 2
        [1.0, 0.0, 0.0, 0.0],  # l = 1
        [1.0, 1.0, 1.0, 0.0],  # l = 3
        [1.0, 1.0, 0.0, 0.0],  # l = 2
        [1.0, 1.0, 1.0, 1.0],  # l = 4
        [0.0, 0.0, 1.0, 1.0],  # l = 2
    ]
)


def _tokens(per_seq: list[float]) -> torch.Tensor:
    return torch.tensor(per_seq)[:, None] * MASK


def _cfg(**kw) -> SimpleNamespace:
    """The options these estimators read, at the defaults they had as flat ``algo`` keys."""
    return SimpleNamespace(**{"scale_by_std": True, "adv_eps": 1e-6, "gamma": 1.0, **kw})


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", sorted(NEW))
def test_registered_with_formula_paper_docstring(name):
    assert name in ADVANTAGES
    assert ADVANTAGES.get(name) is NEW[name]
    entry = {e.name: e for e in ADVANTAGES.entries()}[name]
    assert entry.formula.strip() and entry.paper.strip()
    assert NEW[name].__doc__ and NEW[name].__doc__.strip()


def test_arxiv_ids_in_papers():
    papers = {e.name: e.paper for e in ADVANTAGES.entries()}
    assert "2503.20783" in papers["dr_grpo"]
    assert "2402.14740" in papers["rloo"]
    assert "2501.03262" in papers["reinforce_pp"]
    assert "2501.03262" in papers["reinforce_pp_baseline"]
    assert "2505.23585" in papers["opo"]


@pytest.mark.parametrize("name", sorted(NEW))
def test_masked_positions_zero_finite_and_dtype(name):
    adv = advantage(NEW[name], REWARDS, GROUPS, MASK, None, _cfg())
    assert adv.shape == MASK.shape and adv.dtype == MASK.dtype
    assert torch.isfinite(adv).all()
    assert (adv[MASK == 0] == 0).all()
    assert (adv[1] == 0).all()  # zero-length row


# ----------------------------------------------------------------------------- dr_grpo


@pytest.mark.parametrize("scale", [True, False])
def test_dr_grpo_hand_values_never_std_scaled(scale):
    # group means: g0 1, g1 2, g2 7, g3 5 -> r - mean
    adv = advantage(dr_grpo_advantage, REWARDS, GROUPS, MASK, None, _cfg(scale_by_std=scale))
    expected = torch.tensor(
        [
            [-1.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 2.0, 2.0, 0.0],
            [-1.0, 0.0, 0.0, 0.0],
            [1.0, 1.0, 1.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],  # singleton
            [0.0, 0.0, 0.0, 0.0],  # all-equal group
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    assert_close(adv, expected, atol=1e-7, rtol=0)


def test_dr_grpo_non_binary_interleaved():
    # g0 = rewards 0.5, 2.0, 0.5 at positions 0, 2, 3 -> mean 1.0; g1 = [4.0] singleton
    adv = advantage(
        dr_grpo_advantage, torch.tensor([0.5, 4.0, 2.0, 0.5]), torch.tensor([0, 1, 0, 0]), torch.ones(4, 2), None, _cfg()
    )
    assert_close(adv[:, 0], torch.tensor([-0.5, 0.0, 1.0, -0.5]), atol=1e-7, rtol=0)
    assert_close(adv[:, 1], adv[:, 0])


# ----------------------------------------------------------------------------- rloo


@pytest.mark.parametrize("scale", [True, False])
def test_rloo_hand_values(scale):
    # g0 [0, 0, 3]: 0 - (0+3)/2 = -1.5, 0 - 1.5 = -1.5, 3 - (0+0)/2 = 3
    # g1 [1, 3]: 1 - 3 = -2, 3 - 1 = 2;  g2 singleton -> 0;  g3 equal -> 0
    adv = advantage(rloo_advantage, REWARDS, GROUPS, MASK, None, _cfg(scale_by_std=scale))
    assert_close(adv, _tokens([-1.5, -1.5, 3.0, -2.0, 2.0, 0.0, 0.0, 0.0]), atol=1e-7, rtol=0)
    assert adv[2, 1].item() == pytest.approx(3.0)
    assert adv[4, 2].item() == pytest.approx(2.0)


def test_rloo_interleaved_groups_and_singleton():
    # g0 = [2, 4, 6] at positions 0, 2, 3: 2 - 5 = -3, 4 - 4 = 0, 6 - 3 = 3; g1 = [10] alone -> 0
    adv = advantage(
        rloo_advantage, torch.tensor([2.0, 10.0, 4.0, 6.0]), torch.tensor([0, 1, 0, 0]), torch.ones(4, 3), None, _cfg()
    )
    assert_close(adv, torch.tensor([[-3.0] * 3, [0.0] * 3, [0.0] * 3, [3.0] * 3]), atol=1e-7, rtol=0)


def test_rloo_all_singletons_all_zero():
    adv = advantage(
        rloo_advantage, torch.tensor([1.0, 5.0, -2.0]), torch.tensor([0, 1, 2]), torch.ones(3, 2), None, _cfg()
    )
    assert torch.count_nonzero(adv).item() == 0


# ----------------------------------------------------------------------------- reinforce_pp

# groups g0 = [3, 1, 1] | g1 = [3, 3] (equal) | g2 = [1] (singleton); batch mean 2, every
# deviation is +-1 -> population std 1 (unbiased would be sqrt(6/5) = 1.0954)
PP_REWARDS = torch.tensor([3.0, 1.0, 1.0, 3.0, 3.0, 1.0])
PP_GROUPS = torch.tensor([0, 0, 0, 1, 1, 2])
PP_MASK = torch.tensor(
    [
        [1.0, 1.0, 1.0],
        [1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0],
        [0.0, 1.0, 1.0],
        [1.0, 1.0, 1.0],
    ]
)


def _pp_expected(hi: float, lo: float) -> Tensor:
    """PP_MASK's layout with ``hi`` on the reward-3 rows' tokens and ``lo`` on the reward-1 rows'."""
    r = PP_REWARDS[:, None].expand_as(PP_MASK)
    return torch.where(PP_MASK != 0, torch.where(r == 3.0, hi, lo), 0.0)


@pytest.mark.parametrize("scale", [True, False])
def test_reinforce_pp_token_whitening_population_std_and_eps(scale):
    # whiten: token (the paper): 11 masked tokens, 7 of return 3 and 4 of return 1 (row 2 has no
    # token and does not count; groups are ignored). mean 25/11; deviations +8/11, -14/11;
    # population var (7 * 64 + 4 * 196) / 121 / 11 = 1232 / 1331
    adv = advantage(reinforce_pp_advantage, PP_REWARDS, PP_GROUPS, PP_MASK, None, _cfg(adv_eps=0.25, scale_by_std=scale))
    s = (1232 / 1331) ** 0.5 + 0.25
    assert_close(adv, _pp_expected(8 / 11 / s, -14 / 11 / s), atol=1e-6, rtol=0)


def test_reinforce_pp_sequence_whitening():
    # whiten: sequence: every non-empty response weighs 1 (its tokens 1/|y_i|): returns 3, 1, 3, 3, 1;
    # mean 2.2, deviations +0.8, -1.2, population var (3 * 0.64 + 2 * 1.44) / 5 = 0.96
    adv = advantage(reinforce_pp_advantage, PP_REWARDS, PP_GROUPS, PP_MASK, None,
                    _cfg(adv_eps=0.25, whiten="sequence"))
    s = 0.96 ** 0.5 + 0.25
    assert_close(adv, _pp_expected(0.8 / s, -1.2 / s), atol=1e-6, rtol=0)


@pytest.mark.parametrize("whiten", ["token", "sequence"])
def test_reinforce_pp_same_weighting_with_and_without_token_rewards(whiten):
    # Turning the KL off (no token rewards) must not change how tokens are weighted: zero token
    # rewards and no token rewards give the same advantages, on ragged lengths.
    cfg = _cfg(adv_eps=1e-6, whiten=whiten)
    none = advantage(reinforce_pp_advantage, PP_REWARDS, PP_GROUPS, PP_MASK, None, cfg)
    zeros = advantage(reinforce_pp_advantage, PP_REWARDS, PP_GROUPS, PP_MASK, None, cfg,
                      token_rewards=torch.zeros_like(PP_MASK))
    assert_close(none, zeros, atol=0, rtol=0)


def test_reinforce_pp_default_eps_non_symmetric():
    # rewards 0, 0, 0, 4: mean 1, deviations -1 -1 -1 3, pop var (1+1+1+9)/4 = 3
    adv = advantage(
        reinforce_pp_advantage, torch.tensor([0.0, 0.0, 0.0, 4.0]), torch.tensor([0, 0, 1, 2]), torch.ones(4, 1), None, _cfg()
    )
    s = 1.7320508075688772 + 1e-6  # sqrt(3) + eps
    assert_close(adv[:, 0], torch.tensor([-1 / s, -1 / s, -1 / s, 3 / s]), atol=1e-6, rtol=0)


def test_reinforce_pp_equal_batch_and_batch_of_one_zero():
    adv = advantage(
        reinforce_pp_advantage, torch.tensor([2.0, 2.0, 2.0]), torch.tensor([0, 0, 1]), torch.ones(3, 2), None, _cfg()
    )
    assert torch.count_nonzero(adv).item() == 0
    one = advantage(reinforce_pp_advantage, torch.tensor([5.0]), torch.tensor([0]), torch.ones(1, 3), None, _cfg())
    assert torch.isfinite(one).all() and torch.count_nonzero(one).item() == 0


# ----------------------------------------------------------------------------- reinforce_pp_baseline


def test_reinforce_pp_baseline_shared_batch():
    # d = r - mean_g = [-1, -1, 2, -1, 1, 0, 0, 0]; mean 0; pop var (1+1+4+1+1)/8 = 1
    # (unbiased would be 8/7) -> A = d / (1 + 0.25)
    adv = advantage(reinforce_pp_baseline_advantage, REWARDS, GROUPS, MASK, None, _cfg(adv_eps=0.25))
    assert_close(adv, _tokens([-0.8, -0.8, 1.6, -0.8, 0.8, 0.0, 0.0, 0.0]), atol=1e-7, rtol=0)


def test_reinforce_pp_baseline_one_scale_for_the_whole_batch():
    # groups [0, 6] -> d = -3, 3 | [0, 2] -> d = -1, 1 | [9] -> d = 0
    # pop var (9+9+1+1+0)/5 = 4 -> sigma 2; eps 1 -> divide by 3
    # (GRPO would give both pairs the same +-0.707; here the wide group keeps the larger advantage)
    rewards = torch.tensor([0.0, 6.0, 0.0, 2.0, 9.0])
    groups = torch.tensor([0, 0, 1, 1, 2])
    adv = advantage(reinforce_pp_baseline_advantage, rewards, groups, torch.ones(5, 2), None, _cfg(adv_eps=1.0))
    expected = torch.tensor([-1.0, 1.0, -1.0 / 3, 1.0 / 3, 0.0])
    assert_close(adv, expected[:, None].expand(5, 2), atol=1e-7, rtol=0)


def test_reinforce_pp_baseline_all_equal_groups_zero():
    adv = advantage(
        reinforce_pp_baseline_advantage, torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 4.0]),
        torch.tensor([0, 0, 1, 1, 1, 2]),
        torch.ones(6, 2),
        None,
        _cfg(),
    )
    assert torch.isfinite(adv).all() and torch.count_nonzero(adv).item() == 0


# ----------------------------------------------------------------------------- opo


@pytest.mark.parametrize("scale", [True, False])
def test_opo_shared_batch_length_weighted(scale):
    # g0: l = [1, 0, 2], r = [0, 0, 3] -> b = (0 + 0 + 6) / 3 = 2 -> [-2, -2, 1]
    #     (the zero-length row's reward does not enter the baseline; the plain mean would be 1)
    # g1: l = [1, 3], r = [1, 3] -> b = (1 + 9) / 4 = 2.5 -> [-1.5, 0.5]
    # g2: singleton -> b = 7 -> 0;  g3: equal rewards -> 0
    adv = advantage(opo_advantage, REWARDS, GROUPS, MASK, None, _cfg(scale_by_std=scale))
    expected = torch.tensor(
        [
            [-2.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 1.0, 0.0],
            [-1.5, 0.0, 0.0, 0.0],
            [0.5, 0.5, 0.5, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    assert_close(adv, expected, atol=1e-7, rtol=0)


def test_opo_two_sample_group():
    # r = [1, 0], l = [3, 1] -> b = 3/4 -> [0.25, -0.75]
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    adv = advantage(opo_advantage, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, None, _cfg())
    assert_close(adv, torch.tensor([[0.25, 0.25, 0.25], [0.0, -0.75, 0.0]]), atol=1e-7, rtol=0)


def test_opo_equal_lengths_is_group_mean():
    # all l = 2 -> b = mean = 0.5
    adv = advantage(
        opo_advantage, torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), torch.ones(4, 2), None, _cfg()
    )
    assert_close(adv[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5]), atol=1e-7, rtol=0)


def test_opo_all_zero_length_group_gets_zero_not_nan():
    # g0 has lengths [0, 0] and different rewards: 0/0 baseline must become 0, not NaN
    # g1: r = [2, 0], l = [1, 1] -> b = 1 -> [1, -1]
    mask = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    adv = advantage(opo_advantage, torch.tensor([1.0, 0.0, 2.0, 0.0]), torch.tensor([0, 0, 1, 1]), mask, None, _cfg())
    assert not math.isnan(adv.sum().item())
    assert_close(adv, torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, -1.0]]), atol=1e-7, rtol=0)
