"""GiGPO (arXiv:2505.10978): episode- plus step-level group advantages, against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from part_calls import advantage

from reinforge.algo.gigpo import GiGPOSettings, StepGroupStats, gigpo_advantage
from reinforge.config import AlgoConfig
from reinforge.envs.guessing import GuessingEnv
from reinforge.orchestrate.batch_fields import stable_hash, turn_state_tensors
from reinforge.orchestrate.episodes import build_batch
from reinforge.types import Task, Trajectory


def _episodes():
    """Three episodes of one task, two turns each: prompt(1) turn0 [1,3) env [3] turn1 [4,6).
    Turn 0 all from state "s0"; turn 1 of episodes 0 and 1 from "a", of episode 2 from "b"."""
    spans = [(1, 3), (4, 6)]
    mask = [0, 1, 1, 0, 1, 1]
    rewards = [[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]
    states = [["s0", "a"], ["s0", "a"], ["s0", "b"]]
    return [Trajectory([5] * 6, mask, [0.0] * 6, 0, 0, "t", reward=sum(r), turn_rewards=r, turn_spans=spans,
                       turn_states=s) for r, s in zip(rewards, states, strict=True)]


def test_gigpo_hand_computed_without_std():
    trajs = _episodes()
    algo = AlgoConfig(advantage={"name": "gigpo", "gamma": 0.5, "scale_by_std": False, "omega": 1.0},
                      skip_equal_reward_groups=False)
    batch, _ = build_batch(trajs, algo, 0)
    assert batch.turn_index[0].tolist() == [-1, 0, 0, -1, 1, 1]
    assert batch.turn_states[0, 4].item() == stable_hash("a") and batch.turn_states[2, 4].item() == stable_hash("b")
    # R = [1, 0, 1], mean 2/3: A^E = [1/3, -2/3, 1/3]
    # G (gamma 0.5): turn 0 = [0.5, 0, 0.5] (one step group, mean 1/3), turn 1 = [1, 0, 1]
    # step groups: turn 0 {all}: [1/6, -1/3, 1/6]; turn 1 "a" {ep0, ep1}: mean 0.5 -> [0.5, -0.5]; "b" {ep2}: 0
    adv = advantage(gigpo_advantage, batch.rewards, batch.group_index, batch.loss_mask, cfg=algo.advantage.settings,
                    turn_returns=batch.turn_returns, turn_states=batch.turn_states, turn_index=batch.turn_index)
    expected = [[1 / 3 + 1 / 6, 1 / 3 + 0.5], [-2 / 3 - 1 / 3, -2 / 3 - 0.5], [1 / 3 + 1 / 6, 1 / 3 + 0.0]]
    for i, (t0, t1) in enumerate(expected):
        assert adv[i].tolist() == pytest.approx([0, t0, t0, 0, t1, t1])


def test_gigpo_std_omega_and_stats():
    trajs = _episodes()
    settings = GiGPOSettings(gamma=0.5, omega=0.5)
    ctl = StepGroupStats(settings)
    algo = AlgoConfig(advantage={"name": "gigpo", "gamma": 0.5}, skip_equal_reward_groups=False)
    batch, _ = build_batch(trajs, algo, 0)
    adv = advantage(gigpo_advantage, batch.rewards, batch.group_index, batch.loss_mask, cfg=ctl,
                    turn_returns=batch.turn_returns, turn_states=batch.turn_states, turn_index=batch.turn_index)
    std_e = torch.tensor([1.0, 0.0, 1.0]).std().item()  # unbiased std of R
    std_a = torch.tensor([1.0, 0.0]).std().item()  # of the "a" step group's returns
    want = (1 / 3) / (std_e + 1e-6) + 0.5 * 0.5 / (std_a + 1e-6)
    assert adv[0, 4].item() == pytest.approx(want, rel=1e-5)
    assert adv[2, 4].item() == pytest.approx((1 / 3) / (std_e + 1e-6), rel=1e-5)  # singleton step group
    assert ctl.update({}) == {"gigpo/steps": 6.0, "gigpo/step_groups": 3.0, "gigpo/steps_grouped": pytest.approx(5 / 6)}


def test_single_turn_is_one_plus_omega_grpo():
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1]], dtype=torch.float32)
    trajs = [Trajectory([1, 2, 3], m.int().tolist(), [0.0] * 3, 0, 0, "t", reward=r)
             for m, r in zip(mask, [1.0, 0.0, 0.5], strict=True)]
    states, index = turn_state_tensors(trajs, 3)
    rewards, groups = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 0])
    adv = advantage(gigpo_advantage, rewards, groups, mask, cfg={"scale_by_std": False, "omega": 2.0},
                    turn_returns=rewards[:, None].expand(3, 3), turn_states=states, turn_index=index)
    assert adv[:, 1].tolist() == pytest.approx([3 * 0.5, 3 * -0.5, 0.0])


def test_guessing_env_state_key_tracks_the_interval():
    env = GuessingEnv(max_guesses=4)
    env.reset(Task("t", "guess 1-32", "10"), 0)
    assert env.state_key() == "low=None high=None left=4"
    env.step({"role": "assistant", "content": "16"})
    env.step({"role": "assistant", "content": "3"})
    assert env.state_key() == "low=4 high=15 left=2"
