"""Offline RL for Box actions: TD3+BC, CQL / Cal-QL (algo/offline_rl.py, classic/td3bc.py, cql_box.py), WSRL
(classic/wsrl.py): each loss against hand-computed values, the agents' settings and data checks, and tiny
learning checks on a one-step task (reward -(a - 1)^2) whose logged actions are uniform on [-2, 2]."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reinforge.algo.offline_rl import (
    calibrate,
    cql_continuous_penalty,
    discounted_returns_to_go,
    smoothed_target_action,
    td3_bc_actor_loss,
)
from reinforge.classic.cql_box import CQL, CQLSettings
from reinforge.classic.envs import EnvConfig, make_vec_env
from reinforge.classic.offline import Logged, save_parquet
from reinforge.classic.offline_box import LoggedTensors
from reinforge.classic.td3bc import TD3BC, TD3BCSettings
from reinforge.classic.wsrl import WSRL, WSRLSettings
from reinforge.errors import ConfigError

SMALL = {"hidden": [32, 32], "batch_size": 64}


def pendulum(num_envs: int = 1):  # noqa: ANN201
    return make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=num_envs), 0.99, 0)


def bandit(path, n: int = 512, seed: int = 0) -> str:  # noqa: ANN001
    """One-step episodes on Pendulum's spaces: uniform actions on [-2, 2], reward -(a - 1)^2, terminated."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    action = rng.uniform(-2, 2, size=(n, 1)).astype(np.float32)
    data = Logged(episode=np.arange(n), t=np.zeros(n, dtype=np.int64), obs=obs, next_obs=obs.copy(), action=action,
                  reward=-(action[:, 0] - 1.0) ** 2, terminated=np.ones(n, dtype=bool), truncated=np.zeros(n, dtype=bool),
                  behavior_logp=np.full(n, np.nan))
    save_parquet(data, path)
    return str(path)


def test_smoothed_target_action_clips_the_noise_then_the_box():
    a = torch.tensor([[0.5], [1.8], [-1.9]])
    noise = torch.tensor([[0.7], [-0.2], [-0.4]])
    out = smoothed_target_action(a, noise, 0.5, torch.tensor([[-2.0]]), torch.tensor([[2.0]]))
    assert torch.allclose(out, torch.tensor([[1.0], [1.6], [-2.0]]))  # 0.5 + 0.5; 1.8 - 0.2; -2.3 -> -2


def test_td3_bc_actor_loss_by_hand():
    q = torch.tensor([1.0, -3.0], requires_grad=True)
    pi = torch.tensor([[0.5], [0.0]], requires_grad=True)
    loss, lam = td3_bc_actor_loss(q, pi, torch.tensor([[0.0], [1.0]]), alpha=2.5, half_width=2.0)
    # lambda = 2.5 / mean(1, 3) = 1.25; -1.25 * mean(1, -3) = 1.25; bc = mean(0.25^2, 0.5^2) = 0.15625
    assert float(lam) == pytest.approx(1.25)
    assert loss.item() == pytest.approx(1.25 + 0.15625)
    loss.backward()
    assert torch.allclose(q.grad, torch.tensor([-0.625, -0.625]))  # lambda is a constant: -1.25 / 2
    assert torch.allclose(pi.grad, torch.tensor([[0.5 * 2 / 4 / 2], [-1.0 * 2 / 4 / 2]]))  # 2 (pi - a) / h^2 / B


def test_td3_bc_with_alpha_zero_is_behaviour_cloning():
    loss, lam = td3_bc_actor_loss(torch.tensor([5.0, 7.0]), torch.tensor([[1.0], [0.0]]), torch.tensor([[0.0], [0.0]]),
                                  alpha=0.0)
    assert float(lam) == 0.0 and loss.item() == pytest.approx(0.5)


def test_cql_continuous_penalty_by_hand_and_no_gradient_into_log_probs():
    q_r, q_pi, q_next = torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.tensor([[2.0]])
    logp_pi = torch.tensor([[math.log(2.0)]], requires_grad=True)
    q_data = torch.tensor([0.5])
    out = cql_continuous_penalty(q_r, math.log(0.5), q_pi, logp_pi, q_next, torch.tensor([[0.0]]), q_data)
    expected = math.log(math.exp(math.log(2.0)) + math.exp(1 - math.log(2.0)) + math.exp(2.0)) - 0.5
    assert out.item() == pytest.approx(expected)
    t2 = cql_continuous_penalty(q_r, math.log(0.5), q_pi, logp_pi, q_next, torch.tensor([[0.0]]), q_data, 2.0)
    x = [math.log(2.0), 1 - math.log(2.0), 2.0]
    assert t2.item() == pytest.approx(2 * math.log(sum(math.exp(v / 2) for v in x)) - 0.5)
    assert not out.requires_grad  # the log-probs enter detached; Q's here are leaves without grad


def test_cql_penalty_gradient_pushes_sampled_values_down_and_data_value_up():
    q = torch.tensor([[0.0, 0.0]], requires_grad=True)
    q_data = torch.tensor([0.0], requires_grad=True)
    zeros = torch.zeros(1, 2)
    cql_continuous_penalty(q, 0.0, zeros, zeros, zeros, zeros, q_data).backward()
    assert torch.allclose(q.grad, torch.full((1, 2), 1 / 6))  # softmax over 6 equal entries
    assert q_data.grad.item() == pytest.approx(-1.0)


def test_calibrate_bounds_policy_values_below_by_the_reference():
    out = calibrate(torch.tensor([[1.0, -5.0], [-2.0, -3.0]]), torch.tensor([0.0, -2.5]))
    assert torch.equal(out, torch.tensor([[1.0, 0.0], [-2.0, -2.5]]))


def test_discounted_returns_to_go_restart_at_each_episode_end():
    out = discounted_returns_to_go(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([False, True, False, True]), 0.5)
    assert torch.allclose(out, torch.tensor([2.0, 2.0, 5.0, 4.0]))
    boot = discounted_returns_to_go(torch.tensor([1.0]), torch.tensor([True]), 0.5, bootstrap=torch.tensor([10.0]))
    assert boot.item() == pytest.approx(6.0)


def test_logged_tensors_split_episodes_by_their_ids(tmp_path):
    n = 4
    data = Logged(episode=np.array([0, 0, 1, 1]), t=np.array([0, 1, 0, 1]), obs=np.zeros((n, 3), np.float32),
                  next_obs=np.zeros((n, 3), np.float32), action=np.zeros((n, 1), np.float32),
                  reward=np.array([1.0, 1.0, 2.0, 2.0]), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  behavior_logp=np.full(n, np.nan))
    t = LoggedTensors(data, 0.5, 0)
    assert torch.allclose(t.returns_to_go, torch.tensor([1.5, 1.0, 3.0, 2.0]))
    assert t.actions.shape == (4, 1) and set(t.sample(5)) >= {"obs", "actions", "returns_to_go"}


def test_settings_are_validated_with_the_field_named(tmp_path):
    with pytest.raises(ValueError, match="alpha"):
        TD3BCSettings(alpha=-1.0)
    with pytest.raises(ValueError, match="n_action_samples"):
        CQLSettings(n_action_samples=0)
    with pytest.raises(ConfigError, match="offline_data"):
        TD3BC(pendulum(), 0, TD3BCSettings(offline_data=str(tmp_path / "missing.parquet")))
    with pytest.raises(ConfigError, match="Box"):
        CQL(make_vec_env(EnvConfig(id="CartPole-v1", num_envs=1), 0.99, 0), 0,
            CQLSettings(offline_data=bandit(tmp_path / "d.parquet")))


def test_the_agents_are_registered():
    from reinforge.parts import all_kinds

    assert {"td3_bc", "cql", "wsrl"} <= set(all_kinds()["classic_agent"].names())


def greedy_mean(agent) -> float:  # noqa: ANN001
    return float(agent.act(torch.randn(64, 3, generator=torch.Generator().manual_seed(1)), True).mean())


def test_td3_bc_moves_towards_the_better_action_and_bc_does_not(tmp_path):
    path = bandit(tmp_path / "d.parquet")
    td3 = TD3BC(pendulum(), 0, TD3BCSettings(offline_data=path, iteration_steps=600, **SMALL))
    bc = TD3BC(pendulum(), 0, TD3BCSettings(offline_data=path, iteration_steps=600, alpha=0.0, **SMALL))
    td3.iterate(0.0)
    bc.iterate(0.0)
    assert greedy_mean(td3) > 0.6  # Q's optimum is 1; lambda Q outweighs the pull to the data's mean
    assert abs(greedy_mean(bc)) < 0.3  # behaviour cloning: the mean of uniform actions on [-2, 2]


def test_cql_and_calql_learn_the_better_action_on_covered_data(tmp_path):
    path = bandit(tmp_path / "d.parquet")
    for calibrated in (False, True):
        agent = CQL(pendulum(), 0, CQLSettings(offline_data=path, iteration_steps=400, calibrated=calibrated,
                                               actor_lr=1e-3, **SMALL))
        metrics = agent.iterate(0.0).metrics
        assert {"train/cql_penalty", "train/q_loss", "train/actor_loss"} <= set(metrics)
        assert greedy_mean(agent) > 0.4, calibrated


def test_wsrl_drops_the_data_warms_up_without_updates_then_learns_online(tmp_path):
    path = bandit(tmp_path / "d.parquet", n=128)
    cfg = WSRLSettings(offline_data=path, pretrain_steps=5, warmup_steps=3, utd=2, **SMALL)
    agent = WSRL(pendulum(), 0, cfg)
    assert "train/cql_penalty" in agent.pretrain_metrics
    assert not hasattr(agent, "data")  # no offline data kept
    before = [p.clone() for p in agent.learner.critics.parameters()]
    for _ in range(3):
        assert agent.iterate(0.0).metrics == {}
    assert all(torch.equal(a, b) for a, b in zip(before, agent.learner.critics.parameters(), strict=True))
    metrics = agent.iterate(0.0).metrics
    assert "train/cql_penalty" not in metrics and "train/q_loss" in metrics  # online: SAC, no penalty
    assert agent.replay.size == 4


def test_the_recipes_run_end_to_end_and_write_a_comparable_run(tmp_path):
    import json

    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    path = bandit(tmp_path / "d.parquet", n=64)
    common = [f"output_dir={tmp_path}", f"classic.agent.offline_data={path}", "classic.agent.hidden=[8]",
              "classic.agent.batch_size=8", "classic.eval.episodes=1"]
    td3 = train_classic(load_classic_config("pendulum_td3_bc", [*common, "name=t", "classic.agent.iteration_steps=5",
                                                                  "classic.train.total_env_steps=10"]))
    assert td3.updates == 2 and (td3.run_dir / "eval.json").is_file()  # 10 gradient steps, 5 an iteration
    records = [json.loads(line) for line in (td3.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "train/lambda" in records[-1]
    wsrl = train_classic(load_classic_config("pendulum_wsrl", [*common, "name=w", "classic.agent.pretrain_steps=2",
                                                                 "classic.agent.warmup_steps=2",
                                                                 "classic.train.total_env_steps=4"]))
    assert wsrl.env_steps == 4 and (wsrl.run_dir / "eval.json").is_file()


@pytest.mark.learning  # minutes on 2 loaded cores: make test-learning
def test_td3_bc_recovers_the_logged_policy_on_pendulum(tmp_path):
    """On 2,000 steps logged by a short SAC run (4,000 steps, its sampled actions), TD3+BC after 3,000 gradient
    steps plays within 150 of the data's own mean return (uniform actions score about -1200; the logged
    policy about -300 here) (docs/classic.md, "Dataset tiers on
    Pendulum-v1": scripts/offline_tiers_pendulum.py runs the same at a larger scale)."""
    from reinforge.classic.envs import finished_episodes, obs_tensor
    from reinforge.classic.offline import collect_box
    from reinforge.classic.sac import SAC, SACSettings

    logger = SAC(pendulum(), 100, SACSettings(learning_starts=1000))
    while logger.env_steps < 4000:
        logger.iterate(0.0)
    data = collect_box(logger, make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, 600), 2000, 600)
    save_parquet(data, tmp_path / "d.parquet")
    logged = float(np.sum(data.reward)) / (int(data.episode.max()) + 1)

    def score(agent) -> float:  # noqa: ANN001
        envs = make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, 7)
        obs, _ = envs.reset(seed=7)
        returns: list[float] = []
        while len(returns) < 5:
            obs, _, _, _, info = envs.step(np.asarray(agent.act(obs_tensor(obs), True), dtype=np.float32))
            returns += [r for r, _ in finished_episodes(info)]
        return float(np.mean(returns))

    path = str(tmp_path / "d.parquet")
    td3 = TD3BC(pendulum(), 0, TD3BCSettings(offline_data=path, iteration_steps=3000))
    td3.iterate(0.0)
    assert score(td3) > logged - 150, (score(td3), logged)
