"""RLPD (classic/rlpd.py, classic/ensemble.py): the symmetric batch's counts, the subset-min target by hand,
the batched LayerNorm ensemble against per-member MLPs, the settings' checks, Box-action logged data, and a
few online steps that train from both sources. The learning comparison is
tests/test_classic_learning.py::test_pendulum_rlpd_beats_learning_from_scratch (make test-learning)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from reinforge.classic.ensemble import EnsembleCritic, EnsembleLayerNorm, subset_min
from reinforge.classic.replay import Replay
from reinforge.classic.rlpd import RLPDSettings, symmetric_batch


def _replay(reward: float, n: int, seed: int) -> Replay:
    r = Replay(n, 3, seed, action_dim=1)
    for i in range(n):
        r.add(np.full(3, i, np.float32), np.array([0.5], np.float32), reward, np.zeros(3, np.float32), False, 0.99)
    return r


@pytest.mark.parametrize(("batch", "ratio", "n_offline"), [(8, 0.5, 4), (256, 0.5, 128), (8, 0.25, 2),
                                                             (7, 0.5, 4), (8, 0.0, 0), (8, 1.0, 8)])
def test_symmetric_batch_takes_exact_counts_from_each_source(batch, ratio, n_offline):
    """Offline transitions carry reward 1, online ones reward 0: the batch's reward sum counts the offline
    ones. n_off = round(ratio N): 8 x 0.5 = 4, 256 x 0.5 = 128, 8 x 0.25 = 2, 7 x 0.5 = 3.5 -> 4 (Python's
    round-half-even), 0 and all."""
    out = symmetric_batch(_replay(1.0, 10, 0), _replay(0.0, 10, 1), batch, ratio)
    assert out["rewards"].shape == (batch,) and out["obs"].shape == (batch, 3)
    assert out["rewards"].sum() == n_offline and np.all(out["rewards"][:n_offline] == 1.0)


def test_symmetric_batch_is_seeded():
    a = symmetric_batch(_replay(1.0, 50, 0), _replay(0.0, 50, 1), 16, 0.5)
    b = symmetric_batch(_replay(1.0, 50, 0), _replay(0.0, 50, 1), 16, 0.5)
    c = symmetric_batch(_replay(1.0, 50, 2), _replay(0.0, 50, 1), 16, 0.5)
    assert np.array_equal(a["obs"], b["obs"]) and not np.array_equal(a["obs"][:8], c["obs"][:8])


def test_subset_min_by_hand():
    # members x batch: Q = [[1, 5], [3, 2], [0, 4]]; subset {0, 1}: min(1, 3) = 1, min(5, 2) = 2;
    # subset {1, 2}: min(3, 0) = 0, min(2, 4) = 2; subset {2}: the member itself, [0, 4]
    q = torch.tensor([[1.0, 5.0], [3.0, 2.0], [0.0, 4.0]])
    assert_close(subset_min(q, torch.tensor([0, 1])), torch.tensor([1.0, 2.0]))
    assert_close(subset_min(q, torch.tensor([1, 2])), torch.tensor([0.0, 2.0]))
    assert_close(subset_min(q, torch.tensor([2])), torch.tensor([0.0, 4.0]))


def test_ensemble_is_one_batched_module_equal_to_per_member_mlps_with_layer_norm():
    """Member e of the batched critic = Linear -> LayerNorm -> ReLU -> Linear -> LayerNorm -> ReLU -> Linear with
    member e's slices of the stacked weights; members differ (independent init)."""
    torch.manual_seed(0)
    critic = EnsembleCritic(3, 2, [8, 8], members=4, layer_norm=True)
    assert sum(isinstance(m, EnsembleLayerNorm) for m in critic.modules()) == 2
    assert critic.body[0].weight.shape == (4, 5, 8)
    with torch.no_grad():
        for layer in critic.modules():  # non-trivial LayerNorm scales and shifts
            if isinstance(layer, EnsembleLayerNorm):
                layer.weight.uniform_(0.5, 1.5), layer.bias.uniform_(-0.5, 0.5)
    obs, act = torch.randn(6, 3), torch.randn(6, 2)
    q = critic(obs, act)
    assert q.shape == (4, 6)
    x = torch.cat([obs, act], -1)
    for e in range(4):
        h = x
        for lin, ln in ((critic.body[0], critic.body[1]), (critic.body[3], critic.body[4])):
            h = h @ lin.weight[e] + lin.bias[e, 0]
            h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
            h = torch.relu(h * ln.weight[e, 0] + ln.bias[e, 0])
        assert_close(q[e], (h @ critic.body[6].weight[e] + critic.body[6].bias[e, 0]).squeeze(-1))
    assert not torch.allclose(q[0], q[1])
    plain = EnsembleCritic(3, 2, [8, 8], members=4, layer_norm=False)
    assert not any(isinstance(m, EnsembleLayerNorm) for m in plain.modules())


def test_settings_defaults_are_the_authors_and_the_subset_is_checked():
    s = RLPDSettings()
    assert (s.offline_ratio, s.ensemble_size, s.subset_size, s.layer_norm, s.utd) == (0.5, 10, 2, True, 20)
    assert (s.q_lr, s.policy_lr, s.alpha, s.learning_starts) == (3e-4, 3e-4, 1.0, 5000)
    with pytest.raises(ValueError, match="subset_size \\(3\\) must be at most ensemble_size \\(2\\)"):
        RLPDSettings(ensemble_size=2, subset_size=3)
    with pytest.raises(ValueError):
        RLPDSettings(offline_ratio=1.5)


gym = pytest.importorskip("gymnasium")

from reinforge.algo.qlearning import soft_q_targets  # noqa: E402
from reinforge.classic.config import classic_config_from_dict, load_classic_config  # noqa: E402
from reinforge.classic.envs import EnvConfig, make_vec_env  # noqa: E402
from reinforge.classic.offline import collect_box, load_parquet, save_parquet  # noqa: E402
from reinforge.classic.rlpd import RLPD  # noqa: E402
from reinforge.errors import ConfigError  # noqa: E402


class _Constant:
    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        return torch.full((obs.shape[0], 1), 0.25)


def _pendulum(seed: int = 0):  # noqa: ANN202
    return make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, seed)


@pytest.fixture
def pendulum_data(tmp_path):
    data = collect_box(_Constant(), _pendulum(3), 250, 3)  # two whole 200-step episodes
    path = tmp_path / "pendulum.parquet"
    save_parquet(data, path)
    return path, data


def test_box_actions_round_trip_through_parquet(pendulum_data):
    path, data = pendulum_data
    back = load_parquet(path)
    assert len(back.reward) == 400 and back.action.shape == (400, 1) and back.action.dtype == np.float32
    assert np.all(back.action == 0.25) and back.truncated.sum() == 2 and np.isnan(back.behavior_logp).all()
    assert np.array_equal(back.obs, data.obs) and np.array_equal(back.reward, data.reward.astype(back.reward.dtype))


def test_the_target_is_the_min_over_a_random_subset_of_the_target_critics(pendulum_data):
    path, _ = pendulum_data
    agent = RLPD(_pendulum(), 0, RLPDSettings(offline_data=str(path), ensemble_size=5, subset_size=2,
                                              hidden=[16], batch_size=8, learning_starts=0))
    agent._env_step()
    t = agent.sample()
    state = agent.generator.get_state()
    y = agent.target(t)
    agent.generator.set_state(state)  # the same draws by hand: a', log pi(a'), then the subset
    with torch.no_grad():
        next_action, next_logp = agent.actor(t["next_obs"], agent.generator)
        subset = torch.randperm(5, generator=agent.generator)[:2]
        q = agent.targets(t["next_obs"], next_action)
        expected = soft_q_targets(t["rewards"], t["discounts"], t["terminated"],
                                  torch.minimum(q[subset[0]], q[subset[1]]), next_logp, agent.alpha)
    assert_close(y, expected)
    agent.cfg.backup_entropy = False
    agent.generator.set_state(state)
    no_entropy = agent.target(t)
    assert_close(no_entropy, expected + t["discounts"] * agent.alpha * next_logp)  # nothing terminates here


def test_a_few_online_steps_train_from_both_sources(pendulum_data):
    """utd 3: three critic steps per environment step, each drawing from the offline data and the replay."""
    path, _ = pendulum_data
    agent = RLPD(_pendulum(), 0, RLPDSettings(offline_data=str(path), hidden=[16, 16], batch_size=8, utd=3,
                                              ensemble_size=4, learning_starts=2))
    before = [p.clone() for p in agent.critics.parameters()]
    offline_rng, online_rng = (r.rng.bit_generator.state["state"]["state"] for r in (agent.offline, agent.replay))
    metrics = {}
    for _ in range(4):
        metrics = agent.iterate(0.0).metrics or metrics
    assert agent.critic_steps == 3 * 2 and agent.env_steps == 4 and agent.replay.size == 4
    assert agent.offline.rng.bit_generator.state["state"]["state"] != offline_rng
    assert agent.replay.rng.bit_generator.state["state"]["state"] != online_rng
    assert {"train/q_loss", "train/actor_loss", "train/alpha_loss"} <= set(metrics)
    assert not all(torch.equal(a, b) for a, b in zip(before, agent.critics.parameters(), strict=True))


def test_missing_or_mismatched_data_and_discrete_actions_are_config_errors(pendulum_data, tmp_path):
    path, _ = pendulum_data
    with pytest.raises(ConfigError, match="classic.agent.offline_data: no logged dataset"):
        RLPD(_pendulum(), 0, RLPDSettings())
    with pytest.raises(ConfigError, match="classic.agent: rlpd needs a Box action space"):
        RLPD(make_vec_env(EnvConfig(id="CartPole-v1", num_envs=1), 0.99, 0), 0, RLPDSettings(offline_data=str(path)))
    other = make_vec_env(EnvConfig(id="MountainCarContinuous-v0", num_envs=1), 0.99, 0)
    with pytest.raises(ConfigError, match="observations x actions 3 x 1, the environment's 2 x 1"):
        RLPD(other, 0, RLPDSettings(offline_data=str(path)))


def test_the_recipe_runs_end_to_end(pendulum_data, tmp_path):
    from reinforge.classic.run import train_classic

    path, _ = pendulum_data
    cfg = load_classic_config("pendulum_rlpd", [f"output_dir={tmp_path}", "name=r", f"classic.agent.offline_data={path}",
                                                "classic.agent.learning_starts=5", "classic.agent.hidden=[16]",
                                                "classic.train.total_env_steps=10", "classic.eval.episodes=1"])
    assert cfg.classic.agent == "rlpd"
    result = train_classic(cfg)
    assert result.env_steps == 10 and (result.run_dir / "eval.json").is_file()
    with pytest.raises(ConfigError, match="classic.agent: subset_size \\(2\\) must be at most"):
        classic_config_from_dict({"classic": {"agent": {"name": "rlpd", "ensemble_size": 1}}})
