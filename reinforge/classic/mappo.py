"""IPPO and MAPPO (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games",
arXiv:2103.01955; IPPO: de Witt et al. 2020, arXiv:2011.09533) on PettingZoo environments
(classic/marl_envs.py), built on the single-agent PPO (classic/ppo.py): its update, GAE, clipped loss and
clipped value loss are reused as they are; only the rollout differs.

Every agent i of every environment is one row of the rollout: it acts from [o_i, onehot(i)] with the
shared policy (parameter sharing, classic/marl_nets.py), and its value is V([o_i, onehot(i)]) (IPPO,
a decentralised critic) or V([s, onehot(i)]) with s the environment's global state (MAPPO's
centralised critic; the paper's "EP" state plus the agent id). Each agent's advantages are GAE over its
own rewards (``gae_with_ends`` over [T, E * N] rows), so a shared team reward and per-agent rewards
(a mixed or competitive task) both work. A truncated episode (MPE's ``max_cycles``) bootstraps from its
last observation and state, r <- r + gamma V(x_final), as classic PPO does.

Defaults: the MAPPO paper's MPE settings (appendix, its Table of MPE hyper-parameters and the authors'
on-policy code): Adam 7e-4 without decay, 10 epochs of one mini-batch, clip 0.2, entropy 0.01, gamma
0.99, lambda 0.95, gradient-norm clip 10, 64-64 hidden layers. Departures: CleanRL's tanh MLPs
without the paper's layer norm, value normalisation (PopArt-style ValueNorm) and Huber value loss;
the value loss is PPO's clipped MSE; advantages are whitened per mini-batch (the paper: per batch,
the same with one mini-batch); one learning rate for actor and critic.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.envs import finished_episodes
from reinforge.classic.marl_envs import MultiAgentVecEnv, multi_agent_envs
from reinforge.classic.marl_nets import SharedActorCritic, actor_inputs, critic_inputs
from reinforge.classic.ppo import PPO, PPOSettings, Rollout
from reinforge.errors import ConfigError


class MAPPOSettings(PPOSettings):
    """IPPO's and MAPPO's hyper-parameters (the MAPPO paper's MPE defaults; PPO's options)."""

    num_steps: int = Field(25, ge=1, description="steps per environment per rollout (MPE's episode length)")
    lr: float = Field(7e-4, gt=0, description="Adam learning rate (eps 1e-5), actor and critic")
    anneal_lr: bool = Field(False, description="decay the learning rate linearly to 0 over the run")
    num_minibatches: int = Field(1, ge=1, description="mini-batches per epoch")
    update_epochs: int = Field(10, ge=1, description="passes over each rollout")
    max_grad_norm: float = Field(10.0, gt=0, description="global gradient-norm clip")


class _MultiAgentPPO(PPO):
    """PPO over the rows (environment, agent); ``centralised`` picks the critic's input."""

    centralised = False
    registered = "ippo"

    def __init__(self, envs: Any, seed: int, cfg: MAPPOSettings) -> None:
        self.cfg = cfg
        self.envs: MultiAgentVecEnv = multi_agent_envs(envs, self.registered)
        n = self.envs.n_agents
        self.steps_per_iteration = cfg.num_steps * envs.num_envs
        if self.steps_per_iteration * n < cfg.num_minibatches:
            raise ConfigError(f"classic.agent.num_minibatches ({cfg.num_minibatches}) exceeds the rollout's "
                              f"{self.steps_per_iteration * n} agent steps")
        critic_dim = (self.envs.state_dim if self.centralised else self.envs.obs_dim) + n
        torch.manual_seed(seed)
        self.net = SharedActorCritic(self.envs.obs_dim + n, critic_dim, self.envs.n_actions, cfg.hidden)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)
        obs, info = self.envs.reset(seed=seed)
        self.obs, self.state = torch.from_numpy(obs), torch.from_numpy(info["state"])

    def rows(self, obs: Tensor, state: Tensor) -> Tensor:
        """The network's rows [B * N, actor + critic input] of observations [B, N, D] and states [B, S]."""
        x = torch.cat([actor_inputs(obs), critic_inputs(obs, state if self.centralised else None)], -1)
        return x.reshape(-1, x.shape[-1])

    def act(self, obs: Tensor, deterministic: bool) -> Tensor:
        """Every agent's action [B, N] from the flat observations [B, N * D] (the policy needs no state)."""
        obs = obs.reshape(obs.shape[0], self.envs.n_agents, -1)
        return self.net.policy(actor_inputs(obs), self.generator, deterministic)[0]

    def _truncation_bootstrap(self, reward: Tensor, terminated: np.ndarray, truncated: np.ndarray,
                              info: dict[str, Any]) -> Tensor:
        """r_i + gamma V(x_final, i) for the agents of the environments truncated in this step."""
        mask = info.get("_final_obs")
        if mask is None:
            return reward
        index = np.flatnonzero(mask & truncated & ~terminated)
        if len(index):
            obs = torch.from_numpy(np.stack([info["final_obs"][k] for k in index]))
            with torch.no_grad():
                v = self.net.value(self.rows(obs, torch.from_numpy(info["final_state"][index])))
            reward = reward.clone()
            reward[torch.as_tensor(index)] += self.cfg.gamma * v.reshape(len(index), -1)
        return reward

    def collect(self) -> Rollout:
        """``num_steps`` steps of every environment; rows are (environment, agent) pairs, [T, E * N]."""
        e, n = self.envs.num_envs, self.envs.n_agents
        xs, actions, logps, values, rewards, ends = [], [], [], [], [], []
        self.episodes: list[tuple[float, int]] = []
        self.agent_returns: list[np.ndarray] = []
        for _ in range(self.cfg.num_steps):
            x = self.rows(self.obs, self.state)
            action, logp, value = self.net.act(x, self.generator)
            obs, reward, terminated, truncated, info = self.envs.step(action.reshape(e, n).numpy())
            r = self._truncation_bootstrap(torch.from_numpy(reward), terminated, truncated, info)
            xs.append(x)
            actions.append(action)
            logps.append(logp)
            values.append(value)
            rewards.append(r.reshape(e * n))
            ends.append(torch.from_numpy(terminated | truncated).repeat_interleave(n))
            self._record_episodes(info)
            self.obs, self.state = torch.from_numpy(obs), torch.from_numpy(info["state"])
        open_ = ~ends[-1]
        with torch.no_grad():
            rewards[-1] = rewards[-1] + open_ * self.cfg.gamma * self.net.value(self.rows(self.obs, self.state))
        ends[-1] = torch.ones(e * n, dtype=torch.bool)
        return Rollout(torch.stack(xs), torch.stack(actions), torch.stack(logps), torch.stack(values),
                       torch.stack(rewards), torch.stack(ends), self.episodes)

    def _record_episodes(self, info: dict[str, Any]) -> None:
        self.episodes += finished_episodes(info)
        final = info.get("final_info")
        if final is not None:
            self.agent_returns += list(final["episode"]["agent_r"][final["_episode"]])

    def iterate(self, progress: float) -> Iteration:
        """A rollout and its PPO update, with each agent's mean episode return in the metrics."""
        it = super().iterate(progress)
        if self.agent_returns:
            means = np.mean(self.agent_returns, axis=0)
            it.metrics.update({f"episode/return_{name}": float(m) for name, m in zip(self.envs.agent_names, means,
                                                                                    strict=True)})
        return it


@CLASSIC_AGENTS.register(
    "ippo", formula="PPO-clip per agent on rows [o_i, onehot(i)], shared weights; A_i = GAE of r_i with V(o_i, i)",
    paper="2011.09533", settings=MAPPOSettings)
class IPPO(_MultiAgentPPO):
    """Independent PPO with parameter sharing: a decentralised critic V([o_i, onehot(i)])."""

    centralised = False
    registered = "ippo"


@CLASSIC_AGENTS.register(
    "mappo", formula="PPO-clip per agent on pi([o_i, onehot(i)]), shared weights; A_i = GAE of r_i with the "
    "centralised critic V([s, onehot(i)])", paper="2103.01955", settings=MAPPOSettings)
class MAPPO(_MultiAgentPPO):
    """Multi-agent PPO: decentralised actors, a centralised critic V([s, onehot(i)]) on the global state."""

    centralised = True
    registered = "mappo"
