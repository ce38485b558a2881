"""IMPALA's unit of experience: ``unroll_length`` vector steps with the behaviour policy's log-probs, made in
the learner's process or in an actor process (classic/impala.py, classic/impala_actors.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from reinforge.classic.envs import final_observations, finished_episodes, obs_tensor
from reinforge.classic.networks import ActorCritic


@torch.no_grad()
def collect_unroll(net: ActorCritic, envs: Any, obs: Tensor, steps: int,
                   generator: torch.Generator) -> tuple[dict[str, np.ndarray], Tensor, list[tuple[float, int]]]:
    """``steps`` vector steps with ``net`` (the behaviour policy): arrays [T, E(, ...)] of obs, actions,
    behaviour log-probs, rewards, terminated, truncated and the truncated episodes' last observations,
    plus ``last_obs`` [E]; the next observations and the finished episodes."""
    keys = ("obs", "actions", "behavior_logp", "rewards", "terminated", "truncated", "final_obs")
    out: dict[str, list] = {k: [] for k in keys}
    episodes: list[tuple[float, int]] = []
    for _ in range(steps):
        action, logp, _ = net.act(obs, generator)
        act = action.numpy().astype(np.int64) if net.action.discrete else action.numpy()
        next_obs, reward, terminated, truncated, info = envs.step(act)
        final = np.zeros_like(obs.numpy())
        index, last = final_observations(info)
        if len(index):
            final[index] = np.asarray(last, dtype=np.float32).reshape(len(index), -1)
        for key, value in zip(keys, (obs.numpy(), action.numpy(), logp.numpy(), np.asarray(reward, np.float32),
                                     np.asarray(terminated), np.asarray(truncated), final), strict=True):
            out[key].append(value)
        episodes += finished_episodes(info)
        obs = obs_tensor(next_obs)
    data = {k: np.stack(v) for k, v in out.items()}
    data["last_obs"] = obs.numpy()
    return data, obs, episodes
