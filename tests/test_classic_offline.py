"""Logged data (classic/offline.py) and Fitted Q Evaluation (classic/fqe.py) on hand-made data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reinforge.classic.fqe import fit_fqe, fqe_terms
from reinforge.classic.offline import Logged, load_parquet, save_parquet, soft_logp


def _chain(n_episodes: int) -> Logged:
    """Two-step episodes: s0 = [0] -> s1 = [1] (reward 0), then s1 ends the episode (reward 1 for action 0,
    0 for action 1); actions alternate so both are logged."""
    rows = []
    for e in range(n_episodes):
        a = e % 2
        rows.append((e, 0, [0.0], [1.0], a, 0.0, False, math.log(0.5)))
        rows.append((e, 1, [1.0], [1.0], a, 1.0 if a == 0 else 0.0, True, math.log(0.5)))
    cols = list(zip(*rows, strict=True))
    return Logged(episode=np.array(cols[0]), t=np.array(cols[1]), obs=np.array(cols[2], dtype=np.float32),
                  next_obs=np.array(cols[3], dtype=np.float32), action=np.array(cols[4]), reward=np.array(cols[5]),
                  terminated=np.array(cols[6]), truncated=np.zeros(len(rows), dtype=bool),
                  behavior_logp=np.array(cols[7]))


def test_soft_logp_by_hand():
    got = soft_logp(torch.tensor([0, 0]), torch.tensor([0, 1]), 0.2, 2)
    assert torch.allclose(got.exp(), torch.tensor([0.9, 0.1], dtype=torch.float64))


def test_parquet_round_trip_and_padding(tmp_path):
    data = _chain(3)
    save_parquet(data, tmp_path / "d.parquet")
    back = load_parquet(tmp_path / "d.parquet")
    for key in Logged.__dataclass_fields__:
        assert np.array_equal(getattr(back, key), getattr(data, key)), key
    rewards, mask = back.padded(back.reward)
    assert rewards.tolist() == [[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]] and mask.sum() == 6


def test_fqe_recovers_the_chains_action_values():
    """pi takes action 0 with probability 0.9: Q(s1, 0) = 1, Q(s1, 1) = 0, V(s1) = 0.9; Q(s0, .) = gamma V(s1)
    = 0.45 with gamma 0.5, so V(pi) = 0.45."""
    data = _chain(64)

    def policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([0.9, 0.1]).expand(obs.shape[0], 2)

    q = fit_fqe(data, policy, 2, gamma=0.5, iterations=20, steps=100, batch=64, lr=3e-3)
    with torch.no_grad():
        values = q(torch.tensor([[0.0], [1.0]]))
    assert torch.allclose(values[1], torch.tensor([1.0, 0.0]), atol=0.05)
    assert torch.allclose(values[0], torch.tensor([0.45, 0.45]), atol=0.05)
    q_taken, v_pi, estimate = fqe_terms(q, data, policy)
    assert estimate == pytest.approx(0.45, abs=0.05) and q_taken.shape == v_pi.shape == (64, 2)


def test_cql_penalty_by_hand():
    from reinforge.algo.qlearning import cql_penalty

    q_all = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    # log(1 + 3) - Q(a): action 0 -> log 4; action 1 -> log 4 - log 3
    got = cql_penalty(q_all, torch.tensor([0, 1]))
    assert got.item() == pytest.approx((math.log(4) + math.log(4) - math.log(3)) / 2)


def test_cql_pushes_down_actions_the_data_never_took():
    """One-step episodes from s = [0] where only action 0 was logged (reward 1): CQL keeps Q(s, 0) near 1
    and drives Q(s, 1) well below it; without the penalty nothing constrains Q(s, 1)."""
    from reinforge.classic.cql import fit_cql

    n = 64
    data = Logged(episode=np.arange(n), t=np.zeros(n, dtype=np.int64), obs=np.zeros((n, 1), dtype=np.float32),
                  next_obs=np.zeros((n, 1), dtype=np.float32), action=np.zeros(n, dtype=np.int64),
                  reward=np.ones(n), terminated=np.ones(n, dtype=bool), truncated=np.zeros(n, dtype=bool),
                  behavior_logp=np.zeros(n))
    q, stats = fit_cql(data, 2, alpha=1.0, steps=300, batch=32, lr=1e-3, hidden=[16], seed=0)
    with torch.no_grad():
        values = q(torch.zeros(1, 1))[0]
    assert abs(values[0].item() - 1.0) < 0.2 and values[1].item() < values[0].item() - 1.0, values
    assert stats["cql_penalty"] < 0.2


def test_expectile_loss_by_hand():
    from reinforge.algo.qlearning import expectile_loss

    diff = torch.tensor([2.0, -1.0])  # Q - V: one above V, one below
    assert expectile_loss(diff, 0.7).item() == pytest.approx((0.7 * 4 + 0.3 * 1) / 2)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (4 + 1) / 2)  # half the squared error


def test_awr_weights_by_hand():
    from reinforge.algo.qlearning import awr_weights

    got = awr_weights(torch.tensor([0.0, math.log(2.0), -math.log(4.0), 10.0]), beta=1.0, max_weight=100.0)
    assert torch.allclose(got, torch.tensor([1.0, 2.0, 0.25, 100.0]))
    assert awr_weights(torch.tensor([math.log(4.0)]), beta=0.5).item() == pytest.approx(2.0)
    assert torch.equal(awr_weights(torch.tensor([3.0, -3.0]), beta=0.0), torch.ones(2))  # beta 0: cloning


def test_iql_picks_the_rare_better_action_and_its_value_is_the_expectile():
    """One-step episodes from s = [0]: action 1 logged 90% of the time (reward 0), action 0 10% (reward 1).
    Behaviour cloning would pick 1; IQL's policy picks 0. Q(s, 0) = 1, Q(s, 1) = 0, and V is the 0.9-expectile
    of Q over the logged actions: 0.9 * 0.1 * (1 - m) = 0.1 * 0.9 * m, so m = 0.5 (the mean would be 0.1)."""
    from reinforge.classic.iql import fit_iql

    n = 100
    action = (np.arange(n) % 10 != 0).astype(np.int64)
    data = Logged(episode=np.arange(n), t=np.zeros(n, dtype=np.int64), obs=np.zeros((n, 1), dtype=np.float32),
                  next_obs=np.zeros((n, 1), dtype=np.float32), action=action, reward=(action == 0).astype(float),
                  terminated=np.ones(n, dtype=bool), truncated=np.zeros(n, dtype=bool), behavior_logp=np.zeros(n))
    pi, stats, nets = fit_iql(data, 2, expectile=0.9, beta=3.0, steps=300, batch=100, lr=1e-2, target_tau=0.1,
                              hidden=[16], seed=0)
    with torch.no_grad():
        s = torch.zeros(1, 1)
        logits, v, q1 = pi(s)[0], nets["v"](s)[0, 0], nets["q1"](s)[0]
    assert torch.allclose(q1, torch.tensor([1.0, 0.0]), atol=0.1), q1
    assert v.item() == pytest.approx(0.5, abs=0.1)
    assert logits.argmax().item() == 0 and set(stats) == {"v_loss", "q_loss", "pi_loss", "weight_mean"}


def test_collect_stops_at_the_first_episode_end_after_max_steps():
    from reinforge.classic.envs import EnvConfig, make_vec_env
    from reinforge.classic.offline import collect

    class AlwaysLeft:
        def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
            return torch.zeros(obs.shape[0], dtype=torch.int64)

    env = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=1), 0.99, 0)
    data = collect(AlwaysLeft(), env, 1000, 0.0, 0, max_steps=30)
    ends = data.terminated | data.truncated
    assert len(data.reward) >= 30 and ends[-1] and not ends[:-1][data.t[1:] != 0].any()
    assert ends[:-1].sum() == len(np.unique(data.episode)) - 1  # every episode whole, the last one ends the data
    assert np.all(data.action == 0) and len(np.unique(data.episode)) < 1000  # the step budget stopped it
