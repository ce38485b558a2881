"""DQN (classic/dqn.py): Q-learning targets, n-step transitions, the replay ring, the exploration
schedule, truncation bootstrapping, and the registered agent's config."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.qlearning import n_step_return, q_learning_targets
from reinforge.classic.replay import NStep, Replay

# ----------------------------------------------------------------------------- targets (pure math)


def test_dqn_and_double_q_targets_by_hand():
    rewards, discounts = torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.81])
    terminated = torch.tensor([0.0, 1.0])
    next_target = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    next_online = torch.tensor([[5.0, 0.0], [0.0, 1.0]])
    # DQN: a* = argmax Q_target = action 1 -> y0 = 1 + 0.9 * 3 = 3.7; row 1 terminated: y1 = r = 0.5
    assert_close(q_learning_targets(rewards, discounts, terminated, next_target), torch.tensor([3.7, 0.5]))
    # double Q: a* = argmax Q_online = action 0, valued by the target: y0 = 1 + 0.9 * 1 = 1.9
    assert_close(q_learning_targets(rewards, discounts, terminated, next_target, next_online), torch.tensor([1.9, 0.5]))


def test_n_step_return_by_hand():
    assert n_step_return([1.0, 2.0, 4.0], 0.5) == (1.0 + 0.5 * 2.0 + 0.25 * 4.0, 0.125)
    assert n_step_return([], 0.9) == (0.0, 1.0)


# ----------------------------------------------------------------------------- replay and n-step


def _obs(x: float) -> np.ndarray:
    return np.array([x], dtype=np.float32)


def test_n_step_transitions_at_a_termination():
    replay = Replay(10, 1, seed=0)
    acc = NStep(2, 0.5, replay)
    acc.step(_obs(0), 0, 1.0, _obs(1), False, False)
    assert replay.size == 0  # one reward of two
    acc.step(_obs(1), 1, 2.0, _obs(2), False, False)
    acc.step(_obs(2), 0, 4.0, _obs(3), True, False)  # terminated: every pending transition leaves
    got = [(replay.obs[i, 0], replay.rewards[i], replay.next_obs[i, 0], replay.terminated[i], replay.discounts[i])
           for i in range(replay.size)]
    assert got == [
        (0.0, 1.0 + 0.5 * 2.0, 2.0, 0.0, 0.25),  # s0: r0 + g r1, bootstraps from s2 with g^2
        (1.0, 2.0 + 0.5 * 4.0, 3.0, 1.0, 0.25),  # s1: r1 + g r2, the episode ended: no bootstrap
        (2.0, 4.0, 3.0, 1.0, 0.5),               # s2: r2 alone
    ]


def test_a_truncated_episode_bootstraps_from_its_last_observation():
    replay = Replay(10, 1, seed=0)
    acc = NStep(3, 0.9, replay)
    acc.step(_obs(0), 0, 1.0, _obs(1), False, False)
    acc.step(_obs(1), 0, 1.0, _obs(7), False, True)  # a time limit: last observation 7
    assert replay.size == 2 and list(replay.terminated[:2]) == [0.0, 0.0] and list(replay.next_obs[:2, 0]) == [7.0, 7.0]
    assert_close(torch.from_numpy(replay.discounts[:2]), torch.tensor([0.81, 0.9]))


def test_replay_is_a_ring_and_samples_what_it_holds():
    replay = Replay(2, 1, seed=0)
    for x in (1.0, 2.0, 3.0):
        replay.add(_obs(x), 0, x, _obs(x), False, 1.0)
    assert replay.size == 2 and replay.pos == 1 and sorted(replay.rewards.tolist()) == [2.0, 3.0]
    assert set(replay.sample(50)["rewards"].tolist()) == {2.0, 3.0}


# ----------------------------------------------------------------------------- the agent
gym = pytest.importorskip("gymnasium")

from reinforge.classic.config import load_classic_config  # noqa: E402
from reinforge.classic.dqn import DQN, DQNSettings  # noqa: E402
from reinforge.classic.envs import EnvConfig, make_vec_env  # noqa: E402
from reinforge.errors import ConfigError  # noqa: E402


def test_epsilon_decays_linearly_then_stays():
    envs = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=1), 0.99, 0)
    agent = DQN(envs, 0, DQNSettings(start_e=1.0, end_e=0.05, exploration_fraction=0.5))
    assert [round(agent.epsilon(p), 6) for p in (0.0, 0.25, 0.5, 0.9)] == [1.0, 0.525, 0.05, 0.05]
    obs = torch.zeros(64, 4)
    assert torch.equal(agent.act(obs, deterministic=True), agent.net(obs).argmax(-1))
    assert len(set(agent.act(obs, False, epsilon=1.0).tolist())) == 2  # uniform over both actions


def test_dqn_refuses_continuous_actions():
    envs = make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, 0)
    with pytest.raises(ConfigError, match="classic.agent: dqn needs a Discrete action space"):
        DQN(envs, 0, DQNSettings())


def test_time_limit_transitions_bootstrap_from_the_final_observation():
    envs = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=1, kwargs={"max_episode_steps": 3}), 0.99, 0)
    agent = DQN(envs, 0, DQNSettings(train_frequency=3, learning_starts=10**6))
    agent.iterate(0.0)
    assert agent.replay.size == 3 and agent.env_steps == 3
    assert agent.replay.terminated[2] == 0.0  # truncated after 3 steps (CartPole cannot fall that fast)
    assert not np.allclose(agent.replay.next_obs[2], agent.obs[0].numpy())  # not the next episode's first obs
    assert np.allclose(agent.replay.next_obs[1], agent.replay.obs[2])


def test_gradient_steps_fit_the_targets_and_the_target_network_follows():
    envs = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=2), 0.99, 0)
    agent = DQN(envs, 0, DQNSettings(train_frequency=50, learning_starts=0, batch_size=32, gradient_steps=1,
                                     target_update_interval=10**6, tau=0.5, lr=1e-3))
    agent.iterate(0.0)
    batch = agent.replay.sample(64)
    first = agent.gradient_step(batch)["train/td_loss"]
    for _ in range(100):
        last = agent.gradient_step(batch)["train/td_loss"]
    assert last < 0.5 * first
    before = [p.clone() for p in agent.target.parameters()]
    agent._update_target()  # tau 0.5: halfway to the online network
    for p_t, p_old, p in zip(agent.target.parameters(), before, agent.net.parameters(), strict=True):
        assert_close(p_t, 0.5 * p_old + 0.5 * p)


def test_the_recipe_names_dqn_with_its_options_and_errors_name_the_field():
    cfg = load_classic_config("cartpole_dqn", ["classic.agent.double_q=true", "classic.agent.n_step=3"])
    assert cfg.classic.agent == "dqn" and cfg.classic.agent.settings.double_q and cfg.classic.agent.settings.n_step == 3
    with pytest.raises(ConfigError, match="  classic.agent.n_step: "):
        load_classic_config("cartpole_dqn", ["classic.agent.n_step=0"])
