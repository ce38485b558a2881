"""PVPO (arXiv:2508.21104): the reward minus the reference policy's mean reward, by hand."""

from __future__ import annotations

import pytest
import torch
from part_calls import advantage

from reinforge.algo.advantage_estimators import pvpo_advantage


def test_pvpo_hand_computed():
    rewards, groups = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])
    base = torch.tensor([0.25, 0.25, 0.5, 0.5])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 1]], dtype=torch.float32)
    adv = advantage(pvpo_advantage, rewards, groups, mask, baseline=base)
    # group 0 is all correct: GRPO would give 0, PVPO r - V_ref = 0.75
    assert adv.tolist() == [[0.75, 0.75], [0.75, 0.0], [-0.5, -0.5], [0.0, 0.5]]
    adv = advantage(pvpo_advantage, rewards, groups, mask, cfg={"scale_by_std": True}, baseline=base)
    std1 = torch.tensor([0.0, 1.0]).std().item()
    assert adv[0, 0].item() == pytest.approx(0.75 / 1e-6) and adv[2, 0].item() == pytest.approx(-0.5 / (std1 + 1e-6))


def test_pvpo_needs_the_baseline():
    with pytest.raises(ValueError, match="reference_value"):
        advantage(pvpo_advantage, torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 1))
