"""SAC (classic/sac.py): the soft target by hand, the squashed Gaussian's log-prob, the bounds, the
delayed actor update and the registered agent's config."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.qlearning import soft_q_targets


def test_soft_target_by_hand():
    # y = r + (1 - d) g (min Q' - alpha logp): row 0: 1 + 0.9 (2 - 0.5 * -1) = 3.25; row 1 terminated: 0.5
    y = soft_q_targets(torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.9]), torch.tensor([0.0, 1.0]),
                       torch.tensor([2.0, 7.0]), torch.tensor([-1.0, 3.0]), 0.5)
    assert_close(y, torch.tensor([3.25, 0.5]))


gym = pytest.importorskip("gymnasium")

from reinforge.classic.config import load_classic_config  # noqa: E402
from reinforge.classic.envs import EnvConfig, make_vec_env  # noqa: E402
from reinforge.classic.sac import SAC, SACSettings, SquashedGaussian  # noqa: E402
from reinforge.errors import ConfigError  # noqa: E402


def test_squashed_gaussian_log_prob_is_the_change_of_variables():
    """log pi(a) = log N(u; mu, sigma) - sum log(scale (1 - tanh(u)^2)): checked against torch.distributions
    with a TanhTransform and an affine scale, on a 1-D policy with bounds [-2, 2]."""
    torch.manual_seed(0)
    pi = SquashedGaussian(3, [8], np.array([-2.0]), np.array([2.0]))
    obs = torch.randn(5, 3)
    action, logp = pi(obs, torch.Generator().manual_seed(1))
    h = torch.relu(pi.body(obs))
    mu, raw = pi.mean(h), torch.tanh(pi.log_std(h))
    std = (-5.0 + 0.5 * 7.0 * (raw + 1)).exp()
    base = torch.distributions.Normal(mu, std)
    dist = torch.distributions.TransformedDistribution(
        base, [torch.distributions.TanhTransform(), torch.distributions.AffineTransform(0.0, 2.0)])
    expected = dist.log_prob(action.clamp(-2 + 1e-5, 2 - 1e-5)).sum(-1)
    assert_close(logp, expected, atol=2e-3, rtol=1e-3)  # the 1e-6 guard inside the log differs slightly
    assert action.abs().max() <= 2.0
    det, _ = pi(obs, deterministic=True)
    assert_close(det, 2.0 * torch.tanh(mu))


def test_sac_keeps_the_real_action_bounds_and_refuses_discrete_actions():
    envs = make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, 0)
    assert math.isinf(envs.single_action_space.high[0])  # ClipAction widened it
    agent = SAC(envs, 0, SACSettings(learning_starts=10**6))
    assert_close(agent.actor.scale, torch.tensor([[2.0]])) and assert_close(agent.actor.bias, torch.tensor([[0.0]]))
    with pytest.raises(ConfigError, match="classic.agent: sac needs a Box action space"):
        SAC(make_vec_env(EnvConfig(id="CartPole-v1", num_envs=1), 0.99, 0), 0, SACSettings())


def test_the_actor_updates_every_policy_frequency_critic_steps_and_targets_follow():
    envs = make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, 0)
    agent = SAC(envs, 0, SACSettings(learning_starts=0, batch_size=16, policy_frequency=2, tau=0.5))
    for _ in range(20):
        agent._env_step()
    actor_before = [p.clone() for p in agent.actor.parameters()]
    target_before = [p.clone() for p in agent.targets.parameters()]
    m1 = agent.gradient_step(agent.replay.sample(16))
    assert "train/actor_loss" not in m1 and all(torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters(), strict=True))
    for p_t, p_old, p in zip(agent.targets.parameters(), target_before, agent.critics.parameters(), strict=True):
        assert_close(p_t, 0.5 * p_old + 0.5 * p)
    m2 = agent.gradient_step(agent.replay.sample(16))
    assert "train/actor_loss" in m2 and "train/alpha_loss" in m2
    assert not all(torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters(), strict=True))


def test_the_recipe_names_sac_and_errors_name_the_field():
    cfg = load_classic_config("pendulum_sac")
    assert cfg.classic.agent == "sac" and cfg.classic.agent.settings.autotune
    with pytest.raises(ConfigError, match="  classic.agent.tau: "):
        load_classic_config("pendulum_sac", ["classic.agent.tau=0"])
