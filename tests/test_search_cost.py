"""MASH's pay-per-search reward shaper (algo/search_cost.py) against hand-computed values, and the tool-call
counts it reads from the trajectories."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.search_cost import otc_penalty
from reinforge.algo.shaping import REWARD_SHAPERS, ShapeInputs
from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.episodes import shape_rewards
from reinforge.types import Trajectory

NAME = "search_cost"
# group 0: m = 0 (row 0 is right without a call); group 1: m = 1; group 2: nothing rewarded
REWARDS = [1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0]
CALLS = [0, 2, 0, 1, 1, 3, 2]
GROUPS = [0, 0, 0, 0, 1, 1, 2]


def _shape(**options) -> list[float]:
    n = len(REWARDS)
    inputs = ShapeInputs(rewards=torch.tensor(REWARDS, dtype=torch.float64), lengths=torch.ones(n, dtype=torch.long),
                         truncated=torch.zeros(n, dtype=torch.bool), group_index=torch.tensor(GROUPS),
                         max_new_tokens=8, tool_calls=torch.tensor(CALLS))
    settings = REWARD_SHAPERS.entry(NAME).make_settings(options, "test")
    return REWARD_SHAPERS.call(NAME, inputs, settings).reward.tolist()


def test_exp_penalty_values() -> None:
    # lambda = 0.5: group 0 (m = 0): 0.5^2 = 0.25 -> 1 * (0.25 - 1), 0.5^1 -> -0.5; group 1 (m = 1): 0.5^2 on 0.5
    assert _shape(penalty="exp", decay=0.5) == pytest.approx([0.0, -0.75, 0.0, -0.5, 0.0, 0.5 * (0.25 - 1), 0.0])


def test_otc_penalty_values() -> None:
    # group 0, m = 0: f = n; n = 2: cos(2 pi / (4 + 3)), n = 1: cos(pi / 5)
    # group 1, m = 1: n = 1: f = 1, sin(pi / 2) = 1; n = 3: f = 6 / 4, sin(1.5 pi / 2) = sqrt(2) / 2
    expected = [0.0, math.cos(2 * math.pi / 7) - 1, 0.0, math.cos(math.pi / 5) - 1,
                0.0, 0.5 * (math.sqrt(2) / 2 - 1), 0.0]
    assert _shape(penalty="otc", max_calls=3) == pytest.approx(expected)


def test_otc_strict_zeroes_calls_where_none_were_needed() -> None:
    expected = [0.0, -1.0, 0.0, -1.0, 0.0, 0.5 * (math.sqrt(2) / 2 - 1), 0.0]
    assert _shape(penalty="otc_strict", max_calls=3) == pytest.approx(expected)


def test_otc_penalty_fewer_calls_than_the_minimum_is_not_a_bonus() -> None:
    # n = 0 < m = 2 cannot happen for a rewarded row (m is the minimum); n = m gives 1, more calls less
    p = otc_penalty(torch.tensor([2.0, 3.0, 4.0]), torch.tensor([2.0, 2.0, 2.0]), 3)
    assert p[0].item() == pytest.approx(1.0) and 1.0 > p[1].item() > p[2].item() > 0


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="penalty"):
        load_config(None, ["algo.reward_shapers=[{name: search_cost, penalty: linear}]"])
    with pytest.raises(ConfigError, match="decay"):
        load_config(None, ["algo.reward_shapers=[{name: search_cost, decay: 0}]"])


def test_shape_rewards_reads_tool_calls_from_the_trajectories() -> None:
    def traj(group: int, reward: float, meta: dict) -> Trajectory:
        return Trajectory(token_ids=[1, 1, 2], loss_mask=[0, 0, 1], logprobs=[0.0] * 3, version=0, group_id=group,
                          task_id="t", reward=reward, metadata=meta)

    trajs = [traj(0, 1.0, {"correct": True, "tool_calls": 1}), traj(0, 1.0, {"correct": True, "tool_calls": 3}),
             traj(1, 1.0, {"correct": True})]  # no count: 0 calls
    shapers = load_config(None, ["algo.reward_shapers=[{name: search_cost, decay: 0.5}]"]).algo.reward_shapers
    shape_rewards(trajs, shapers, 8)
    assert [t.reward for t in trajs] == pytest.approx([1.0, 0.25, 1.0])  # 0.5^(3 - 1) on the second
    assert trajs[1].metadata[NAME] == pytest.approx(-0.75)
