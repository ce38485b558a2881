"""GRPO advantages and group statistics against hand-computed values."""

from types import SimpleNamespace

import pytest
import torch
from part_calls import advantage
from torch.testing import assert_close

from reinforge.algo import ADVANTAGES
from reinforge.algo.advantage_estimators import group_mean_std, grpo_advantage

# groups: [1, 0, 0, 1] | [1, 1, 1, 1] | [0, 1]
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])

# group 0: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.5773503
# group 1: mean 1, std 0
# group 2: mean 0.5, unbiased var = 2 * 0.25 / 1 = 0.5, std = 0.7071068
# scaled advantage: 0.5 / (std + 1e-6)
A0 = 0.8660239037870368  # 0.5 / (sqrt(1/3) + 1e-6)
A2 = 0.7071057811879616  # 0.5 / (sqrt(1/2) + 1e-6)


def _cfg(scale_by_std: bool, eps: float = 1e-6) -> SimpleNamespace:
    return SimpleNamespace(scale_by_std=scale_by_std, adv_eps=eps)


def test_group_mean_std_hand_values():
    mean, std, count = group_mean_std(REWARDS, GROUPS)
    assert mean.dtype == torch.float64
    assert_close(mean, torch.tensor([0.5] * 4 + [1.0] * 4 + [0.5] * 2, dtype=torch.float64))
    s0 = 0.5773502691896258  # sqrt(1/3), unbiased
    s2 = 0.7071067811865476  # sqrt(1/2), unbiased
    assert_close(std, torch.tensor([s0] * 4 + [0.0] * 4 + [s2] * 2, dtype=torch.float64))
    assert_close(count, torch.tensor([4.0] * 4 + [4.0] * 4 + [2.0] * 2, dtype=torch.float64))


def test_group_mean_std_is_unbiased_not_population():
    # values 0, 2, 4: mean 2, population var 8/3, unbiased var 8/2 = 4 -> std 2
    _, std, _ = group_mean_std(torch.tensor([0.0, 2.0, 4.0]), torch.tensor([0, 0, 0]))
    assert_close(std, torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64))


def test_group_mean_std_singleton_and_interleaved_groups():
    # groups need not be contiguous; a group of one has std 0
    values = torch.tensor([3.0, 10.0, 5.0, 7.0])
    groups = torch.tensor([0, 1, 0, 0])
    mean, std, count = group_mean_std(values, groups)
    assert_close(mean, torch.tensor([5.0, 10.0, 5.0, 5.0], dtype=torch.float64))
    # group 0: 3, 5, 7 -> unbiased var (4 + 0 + 4) / 2 = 4 -> std 2
    assert_close(std, torch.tensor([2.0, 0.0, 2.0, 2.0], dtype=torch.float64))
    assert_close(count, torch.tensor([3.0, 1.0, 3.0, 3.0], dtype=torch.float64))


def test_grpo_with_std_scaling():
    mask = torch.ones(10, 3)
    adv = advantage(grpo_advantage, REWARDS, GROUPS, mask, None, None)
    per_seq = torch.tensor([A0, -A0, -A0, A0, 0.0, 0.0, 0.0, 0.0, -A2, A2])
    assert_close(adv, per_seq[:, None].expand(10, 3), atol=1e-6, rtol=0)
    assert adv.dtype == mask.dtype


def test_grpo_without_std_scaling():
    mask = torch.ones(10, 2)
    adv = advantage(grpo_advantage, REWARDS, GROUPS, mask, None, _cfg(False))
    per_seq = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0, -0.5, 0.5])
    assert_close(adv, per_seq[:, None].expand(10, 2), atol=1e-7, rtol=0)


def test_grpo_eps_enters_denominator():
    # group [0, 1]: std sqrt(1/2); with eps = 0.2: 0.5 / (0.70710678 + 0.2) = 0.5512...
    adv = advantage(
        grpo_advantage, torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), torch.ones(2, 1), None, _cfg(True, 0.2)
    )
    expected = 0.5 / (0.7071067811865476 + 0.2)
    assert_close(adv[:, 0], torch.tensor([-expected, expected]), atol=1e-6, rtol=0)


def test_grpo_non_binary_rewards():
    # group [1, 2, 6]: mean 3, deviations -2, -1, 3; unbiased var (4 + 1 + 9) / 2 = 7
    rewards = torch.tensor([1.0, 2.0, 6.0])
    adv = advantage(grpo_advantage, rewards, torch.tensor([0, 0, 0]), torch.ones(3, 1), None, _cfg(True, 1e-12))
    s = 7.0**0.5
    assert_close(adv[:, 0], torch.tensor([-2.0 / s, -1.0 / s, 3.0 / s]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("scale", [True, False])
def test_grpo_singleton_group_gets_zero(scale):
    rewards = torch.tensor([5.0, 1.0, 0.0])
    groups = torch.tensor([0, 1, 1])
    adv = advantage(grpo_advantage, rewards, groups, torch.ones(3, 2), None, _cfg(scale))
    assert adv[0].abs().max().item() == 0.0
    assert adv[1, 0].item() > 0 and adv[2, 0].item() < 0


@pytest.mark.parametrize("scale", [True, False])
def test_grpo_all_equal_group_gets_zero(scale):
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    adv = advantage(grpo_advantage, rewards, groups, torch.ones(5, 4), None, _cfg(scale))
    assert torch.count_nonzero(adv).item() == 0


def test_grpo_masking_including_zero_length_response():
    mask = torch.tensor(
        [
            [0.0, 1.0, 1.0, 0.0],  # prompt token then two generated tokens, then padding
            [0.0, 0.0, 0.0, 0.0],  # zero-length response
            [1.0, 1.0, 1.0, 1.0],
            [0.0, 0.0, 1.0, 0.0],
        ]
    )
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0])
    adv = advantage(grpo_advantage, rewards, groups, mask, None, _cfg(True))
    a = A0  # same group statistics as group 0 above
    expected = torch.tensor(
        [
            [0.0, a, a, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [-a, -a, -a, -a],
            [0.0, 0.0, a, 0.0],
        ]
    )
    assert_close(adv, expected, atol=1e-6, rtol=0)
    assert (adv[mask == 0] == 0).all()


def test_grpo_is_registered():
    assert ADVANTAGES.get("grpo") is grpo_advantage
