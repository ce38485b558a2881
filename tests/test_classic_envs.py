"""classic.env options beyond the basics: frame stacking, a MuJoCo task (skipped without ``mujoco``) and
EnvPool (skipped without ``envpool``)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from reinforge.classic.agents import build_agent  # noqa: E402
from reinforge.classic.config import EnvConfig, load_classic_config  # noqa: E402
from reinforge.classic.envs import make_vec_env  # noqa: E402
from reinforge.classic.ppo import PPOSettings  # noqa: E402


def test_frame_stack_keeps_the_last_k_observations_flattened():
    stacked = make_vec_env(EnvConfig(num_envs=2, frame_stack=3), 0.99, seed=0)
    plain = make_vec_env(EnvConfig(num_envs=2), 0.99, seed=0)
    obs, _ = stacked.reset(seed=0)
    raw, _ = plain.reset(seed=0)
    assert obs.shape == (2, 12) and stacked.single_observation_space.shape == (12,)
    assert np.array_equal(obs, np.tile(raw, 3))  # padded at reset with the first observation
    previous = raw
    for _ in range(2):
        action = np.ones(2, dtype=np.int64)
        obs, *_ = stacked.step(action)
        raw, *_ = plain.step(action)
        assert np.array_equal(obs[:, 8:], raw) and np.array_equal(obs[:, 4:8], previous)  # oldest first
        previous = raw


def test_ppo_iterates_on_stacked_frames():
    envs = make_vec_env(EnvConfig(num_envs=2, frame_stack=4), 0.99, seed=0)
    agent = build_agent("ppo", envs, 0, PPOSettings(num_steps=16, num_minibatches=2, update_epochs=1))
    assert agent.net.actor[0].in_features == 16
    assert np.isfinite(agent.iterate(0.0).metrics["train/policy_loss"])


def test_a_bad_frame_stack_names_the_field():
    from reinforge.errors import ConfigError

    with pytest.raises(ConfigError, match="classic.env.frame_stack"):
        load_classic_config("cartpole_ppo", ["classic.env.frame_stack=0"])


def test_inverted_pendulum_sac_builds_and_iterates():
    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("MuJoCo tasks need the mujoco package: pip install 'reinforge[classic]'")
    c = load_classic_config("inverted_pendulum_sac", ["classic.agent.learning_starts=4", "classic.agent.batch_size=4",
                                                      "classic.agent.buffer_size=64", "classic.agent.hidden=[16]"]).classic
    envs = make_vec_env(c.env, c.agent.settings.gamma, 0)
    assert envs.single_observation_space.shape == (4,) and envs.bounded_action_space.shape == (1,)
    agent = build_agent(c.agent.name, envs, 0, c.agent.settings)
    seen: dict[str, float] = {}
    for i in range(8):  # past learning_starts: critic and (every 2nd) actor steps run
        seen |= agent.iterate(i / 8).metrics
    assert np.isfinite(seen["train/q_loss"]) and np.isfinite(seen["train/actor_loss"])
