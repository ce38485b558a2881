"""Logged data for offline RL and off-policy evaluation: episodes collected by an agent's epsilon-soft
policy, with the behaviour log-probs, saved as Parquet (one row per step).

Columns: ``episode``, ``t``, ``obs`` and ``next_obs`` (lists of floats; at an episode's end its last
observation), ``action`` (int; a list of floats for Box actions, ``collect_box``), ``reward``, ``terminated``,
``truncated``, ``behavior_logp`` = log mu(a_t | s_t). The epsilon-soft policy of a greedy agent
(``agent.act(obs, deterministic=True)``, e.g. a trained DQN) over n discrete actions is
mu(a | s) = epsilon / n + (1 - epsilon) [a = greedy(s)], and ``soft_logp`` gives any such policy's
log-probs for logged actions (the target policy's, for ``algo/ope.py``). ``collect_box`` logs a
continuous-action agent's own stochastic policy (``agent.act(obs, deterministic=False)``, e.g. SAC's) with
``behavior_logp`` NaN (not recorded): data for offline-to-online learners (classic/rlpd.py), not for OPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from reinforge.classic.envs import next_observations, obs_tensor


@dataclass
class Logged:
    """Steps of logged episodes, flat [S] (``obs`` [S, D]), in episode order."""

    episode: np.ndarray
    t: np.ndarray
    obs: np.ndarray
    next_obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    behavior_logp: np.ndarray

    def padded(self, values: np.ndarray) -> tuple[Tensor, Tensor]:
        """A per-step column as [N, T] (episodes x steps) and its mask."""
        ids, starts = np.unique(self.episode, return_index=True)
        lengths = np.diff(np.append(starts, len(self.episode)))
        out = torch.zeros(len(ids), int(lengths.max()), dtype=torch.float64)
        mask = torch.zeros_like(out)
        for i, (s, n) in enumerate(zip(starts, lengths, strict=True)):
            out[i, :n] = torch.as_tensor(values[s:s + n], dtype=torch.float64)
            mask[i, :n] = 1.0
        return out, mask

    def transitions(self) -> Transitions:
        """The steps as tensors for offline learners (obs, next_obs float32; action int64; reward and
        terminated float32)."""
        return Transitions(torch.from_numpy(self.obs), torch.from_numpy(self.next_obs),
                           torch.as_tensor(self.action, dtype=torch.int64),
                           torch.as_tensor(self.reward, dtype=torch.float32),
                           torch.as_tensor(self.terminated, dtype=torch.float32))


class Transitions(NamedTuple):
    obs: Tensor
    next_obs: Tensor
    action: Tensor
    reward: Tensor
    done: Tensor


def soft_logp(greedy: Tensor, actions: Tensor, epsilon: float, n_actions: int) -> Tensor:
    """log of epsilon / n + (1 - epsilon) [a = greedy] for each step."""
    p = epsilon / n_actions + (1.0 - epsilon) * (actions == greedy).double()
    return torch.log(p)


def collect(agent: Any, envs: Any, episodes: int, epsilon: float, seed: int, max_steps: int | None = None) -> Logged:
    """``episodes`` episodes of ``agent``'s epsilon-soft policy on the single environment of ``envs`` (fewer if
    ``max_steps`` is given and reached: then at the first episode end from that many steps on)."""
    n = int(envs.single_action_space.n)
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in Logged.__dataclass_fields__}
    obs, _ = envs.reset(seed=seed)
    episode, t = 0, 0
    while episode < episodes and (max_steps is None or len(rows["t"]) < max_steps or t > 0):
        greedy = int(agent.act(obs_tensor(obs), True)[0])
        action = int(rng.integers(n)) if rng.random() < epsilon else greedy
        logp = float(soft_logp(torch.tensor(greedy), torch.tensor(action), epsilon, n))
        next_obs, reward, terminated, truncated, info = envs.step(np.array([action]))
        for key, value in (("episode", episode), ("t", t), ("obs", np.asarray(obs[0], dtype=np.float32)),
                           ("next_obs", next_observations(next_obs, info)[0]),
                           ("action", action), ("reward", float(reward[0])), ("terminated", bool(terminated[0])),
                           ("truncated", bool(truncated[0])), ("behavior_logp", logp)):
            rows[key].append(value)
        t += 1
        if terminated[0] or truncated[0]:
            episode, t = episode + 1, 0
        obs = next_obs
    return Logged(**{k: np.asarray(v) for k, v in rows.items()})


def collect_box(agent: Any, envs: Any, steps: int, seed: int) -> Logged:
    """Whole episodes of ``agent``'s sampled actions on the single Box-action environment of ``envs``, until
    the first episode end from ``steps`` steps on."""
    rows: dict[str, list] = {k: [] for k in Logged.__dataclass_fields__}
    obs, _ = envs.reset(seed=seed)
    episode, t = 0, 0
    while len(rows["t"]) < steps or t > 0:
        action = np.asarray(agent.act(obs_tensor(obs), False), dtype=np.float32).reshape(1, -1)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        for key, value in (("episode", episode), ("t", t), ("obs", np.asarray(obs[0], dtype=np.float32)),
                           ("next_obs", next_observations(next_obs, info)[0]), ("action", action[0]),
                           ("reward", float(reward[0])), ("terminated", bool(terminated[0])),
                           ("truncated", bool(truncated[0])), ("behavior_logp", float("nan"))):
            rows[key].append(value)
        t += 1
        if terminated[0] or truncated[0]:
            episode, t = episode + 1, 0
        obs = next_obs
    return Logged(**{k: np.asarray(v) for k, v in rows.items()})


def save_parquet(data: Logged, path: str | Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {k: getattr(data, k) for k in Logged.__dataclass_fields__}
    columns["obs"], columns["next_obs"] = [row.tolist() for row in data.obs], [row.tolist() for row in data.next_obs]
    if data.action.ndim > 1:
        columns["action"] = [row.tolist() for row in data.action]
    pq.write_table(pa.table(columns), str(path))


def load_parquet(path: str | Path) -> Logged:
    import pyarrow.parquet as pq

    table = pq.read_table(str(path)).to_pydict()
    data = {k: np.asarray(v) for k, v in table.items()}
    data["obs"], data["next_obs"] = (np.asarray(table[k], dtype=np.float32) for k in ("obs", "next_obs"))
    if data["action"].ndim > 1:
        data["action"] = np.asarray(table["action"], dtype=np.float32)
    return Logged(**data)
