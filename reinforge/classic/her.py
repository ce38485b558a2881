"""Hindsight Experience Replay (Andrychowicz et al. 2017, arXiv:1707.01495) for the off-policy agents
(DQN, SAC: ``classic.agent.her: {strategy: future, k: 4}``) on goal environments (Gymnasium's GoalEnv
convention: a dict observation with ``observation``, ``achieved_goal``, ``desired_goal`` and
``compute_reward(achieved, desired, info)``; ``classic/goal_envs.py``).

The networks see concat(observation, desired goal) (``envs.goal_input``). Each environment's steps are
kept until its episode ends; then every step t (s_t, a_t, ag_{t+1}, s_{t+1}, g) is stored once with the
episode's goal g and its reward r_t, and again with goals g' taken from the same episode's achieved
goals, its reward recomputed by the environment, r' = compute_reward(ag_{t+1}, g', info) (the paper's
Algorithm 1: the relabelled transitions are written at the episode's end):

- ``future``: k goals ag_{j+1}, j uniform in {t, ..., T-1} (achieved at or after this step);
- ``episode``: k goals ag_{j+1}, j uniform in {0, ..., T-1} (anywhere in the episode);
- ``final``: the episode's last achieved goal ag_T, once (k copies of one goal would only reweight it).

A relabelled transition terminates where the environment's ``compute_terminated(ag_{t+1}, g', info)``
says so (the bit-flipping task ends on success); an environment without one keeps the step's own flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from reinforge.classic.envs import goal_input
from reinforge.classic.replay import Replay
from reinforge.errors import ConfigError
from reinforge.registry import Settings


class HERSettings(Settings):
    """``classic.agent.her``: the relabelling strategy and how many goals per transition."""

    strategy: Literal["future", "final", "episode"] = Field(
        "future", description="where relabelled goals come from: achieved later in the episode (future), "
        "at its end (final), anywhere in it (episode)")
    k: int = Field(4, ge=1, description="relabelled goals per transition (future, episode; final takes one)")


@dataclass
class Episode:
    """One environment's episode of T steps: observations o_t and o_{t+1} [T, D], actions, rewards [T],
    achieved goals after each step ag_{t+1} [T, G], the desired goal g [G], the steps' terminated flags."""

    obs: list[np.ndarray] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    next_obs: list[np.ndarray] = field(default_factory=list)
    next_achieved: list[np.ndarray] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    desired: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rewards)


def sample_goal_steps(strategy: str, k: int, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """For an episode of ``length`` steps: the step t of each relabelled transition and the step j whose
    achieved goal ag_{j+1} becomes its goal (``future``: j >= t; ``episode``: any j; ``final``: j = T-1)."""
    t = np.arange(length)
    if strategy == "final":
        return t, np.full(length, length - 1)
    rows = np.repeat(t, k)
    if strategy == "future":
        return rows, rows + np.floor(rng.random(rows.size) * (length - rows)).astype(np.int64)
    return rows, rng.integers(0, length, rows.size)


def hindsight_transitions(ep: Episode, rows: np.ndarray, goal_steps: np.ndarray, env: Any) -> dict[str, np.ndarray]:
    """The episode's own transitions followed by one per (row, goal step), as network inputs
    concat(o, g) with the rewards and terminations recomputed by ``env`` for the relabelled ones."""
    obs, next_obs = np.stack(ep.obs), np.stack(ep.next_obs)
    achieved, actions = np.stack(ep.next_achieved), np.asarray(ep.actions)
    goals = np.concatenate([np.broadcast_to(ep.desired, (len(ep), ep.desired.size)), achieved[goal_steps]])
    steps = np.concatenate([np.arange(len(ep)), rows])
    rewards = np.asarray(env.compute_reward(achieved[rows], achieved[goal_steps], {}), dtype=np.float32)
    own_end = np.asarray(ep.terminated, dtype=bool)
    ends = (np.asarray(env.compute_terminated(achieved[rows], achieved[goal_steps], {}), dtype=bool)
            if hasattr(env, "compute_terminated") else own_end[rows])
    return {"obs": goal_input({"observation": obs[steps], "desired_goal": goals}),
            "actions": actions[steps],
            "rewards": np.concatenate([np.asarray(ep.rewards, dtype=np.float32), rewards]),
            "next_obs": goal_input({"observation": next_obs[steps], "desired_goal": goals}),
            "terminated": np.concatenate([own_end, ends])}


class HindsightReplay:
    """Per-environment episodes written to ``replay`` with their relabelled copies when they end."""

    def __init__(self, cfg: HERSettings, replay: Replay, envs: Any, gamma: float, seed: int) -> None:
        self.env = getattr(envs, "goal_env", None)
        if self.env is None:
            raise ConfigError("classic.agent.her: needs a goal environment (a dict observation with achieved_goal "
                              "and desired_goal, and compute_reward), e.g. reinforge/BitFlipping-v0")
        self.cfg, self.replay, self.gamma = cfg, replay, gamma
        self.rng = np.random.default_rng(seed)
        self.episodes = [Episode() for _ in range(envs.num_envs)]

    def store_vector_step(self, obs: dict[str, np.ndarray], actions: np.ndarray, rewards: np.ndarray,
                          next_obs: dict[str, np.ndarray], info: dict[str, Any], terminated: np.ndarray,
                          truncated: np.ndarray) -> None:
        """One vector step (the dict observations before and after it; an ended episode's last
        observation is ``info["final_obs"]``); an environment whose episode ended is relabelled and stored."""
        ended = info.get("_final_obs", np.zeros(len(rewards), dtype=bool))
        for i, ep in enumerate(self.episodes):
            after = info["final_obs"][i] if ended[i] else {k: v[i] for k, v in next_obs.items()}
            ep.obs.append(np.asarray(obs["observation"][i], dtype=np.float32).reshape(-1))
            ep.actions.append(actions[i])
            ep.rewards.append(float(rewards[i]))
            ep.next_obs.append(np.asarray(after["observation"], dtype=np.float32).reshape(-1))
            ep.next_achieved.append(np.asarray(after["achieved_goal"], dtype=np.float32).reshape(-1))
            ep.terminated.append(bool(terminated[i]))
            ep.desired = np.asarray(obs["desired_goal"][i], dtype=np.float32).reshape(-1)
            if terminated[i] or truncated[i]:
                self._flush(i)

    def _flush(self, i: int) -> None:
        ep, self.episodes[i] = self.episodes[i], Episode()
        rows, goal_steps = sample_goal_steps(self.cfg.strategy, self.cfg.k, len(ep), self.rng)
        batch = hindsight_transitions(ep, rows, goal_steps, self.env)
        for n in range(len(batch["rewards"])):
            self.replay.add(batch["obs"][n], batch["actions"][n], float(batch["rewards"][n]), batch["next_obs"][n],
                            bool(batch["terminated"][n]), self.gamma)
