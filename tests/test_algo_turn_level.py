"""Turn-level advantages for multi-turn episodes (grpo_turn) against hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from part_calls import advantage

from reinforge.algo import ADVANTAGES
from reinforge.algo.advantage_estimators import grpo_advantage, grpo_turn_advantage
from reinforge.algo.returns import turn_returns
from reinforge.config import AlgoConfig
from reinforge.orchestrate.batch_fields import turn_return_tensor
from reinforge.orchestrate.episodes import build_batch
from reinforge.types import Trajectory


def _cfg(scale=True, gamma=0.5):
    return SimpleNamespace(scale_by_std=scale, adv_eps=1e-6, gamma=gamma)


def test_turn_returns_discount_later_rewards():
    assert turn_returns([0.0, 1.0], 0.5) == [0.5, 1.0]
    assert turn_returns([1.0, 0.0, 2.0], 1.0) == [3.0, 2.0, 2.0]
    assert turn_returns([], 0.9) == []


def _two_episodes():
    # episode 0: prompt(2) turn0 tokens 2..3, context 4, turn1 tokens 5..6; episode 1 the same layout
    spans = [(2, 4), (5, 7)]
    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 1]] * 2, dtype=torch.float32)
    trajs = [Trajectory([9] * 7, mask[0].int().tolist(), [0.0] * 7, 0, 0, "t", reward=sum(r), turn_rewards=r,
                        turn_spans=spans) for r in ([0.0, 1.0], [0.0, 0.0])]
    return trajs, mask


def test_grpo_turn_hand_computed():
    trajs, mask = _two_episodes()
    tr = turn_return_tensor(trajs, 7, gamma=0.5)
    assert tr[0].tolist() == [0, 0, 0.5, 0.5, 0, 1.0, 1.0] and tr[1].tolist() == [0.0] * 7
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    # G_0 = [0.5, 0]: mean 0.25; no std scaling: turn 0 -> 0.25, turn 1 -> 0.75; episode 1 -> -0.25
    adv = advantage(grpo_turn_advantage, rewards, groups, mask, None, _cfg(scale=False), turn_returns=tr)
    assert adv[0].tolist() == [0, 0, 0.25, 0.25, 0, 0.75, 0.75]
    assert adv[1].tolist() == [0, 0, -0.25, -0.25, 0, -0.25, -0.25]
    # unbiased std of [0.5, 0] = 0.353553...
    adv = advantage(grpo_turn_advantage, rewards, groups, mask, None, _cfg(scale=True), turn_returns=tr)
    assert adv[0, 2].item() == pytest.approx(0.25 / (0.5 ** 0.5 / 2 + 1e-6))
    assert adv[0, 5].item() == pytest.approx(0.75 / (0.5 ** 0.5 / 2 + 1e-6))


def test_grpo_turn_reduces_to_grpo_for_one_turn():
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1]], dtype=torch.float32)
    rewards, groups = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 0])
    cfg = _cfg(scale=True)
    torch.testing.assert_close(advantage(grpo_turn_advantage, rewards, groups, mask, None, cfg),
                               advantage(grpo_advantage, rewards, groups, mask, None, cfg))


def test_registered_and_built_by_the_batch():
    assert ADVANTAGES.get("grpo_turn") is grpo_turn_advantage
    trajs, _ = _two_episodes()
    turn = AlgoConfig(advantage={"name": "grpo_turn", "gamma": 0.5}, skip_equal_reward_groups=False)
    batch, _ = build_batch(trajs, turn, 0)
    assert batch.turn_returns is not None and batch.turn_returns[0, 5].item() == 1.0
    batch, _ = build_batch(trajs, AlgoConfig(advantage="grpo", skip_equal_reward_groups=False), 0)
    assert batch.turn_returns is None
