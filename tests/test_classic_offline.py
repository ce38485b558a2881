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
