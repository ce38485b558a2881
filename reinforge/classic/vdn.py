"""VDN (Sunehag et al. 2017, "Value-Decomposition Networks For Cooperative Multi-Agent Learning",
arXiv:1706.05296) on PettingZoo environments (classic/marl_envs.py), built on the DQN agent
(classic/dqn.py: its epsilon schedule, iteration, replay, n-step accumulators and target updates):

    Q_tot(o, a) = sum_i Q_i(o_i, a_i),   y = R + (1 - d) g sum_i max_a Q'_i(o'_i, a)   (algo/qlearning.py)

regressed by DQN's TD loss on the team reward R = sum_i r_i (the VDN paper's joint reward; with MPE's
per-agent rewards, their sum). The agents share one Q-network on [o_i, onehot(i)] (the paper's
weight sharing with the agent's index as an input; classic/marl_nets.py); each acts epsilon-greedily
on its own Q_i, so execution is decentralised.

Defaults: PyMARL's VDN configuration (Samvelyan et al. 2019, arXiv:1902.04043; default.yaml): learning
rate 5e-4, gamma 0.99, epsilon 1 -> 0.05 over 50,000 steps, gradient-norm clip 10. Departures: an MLP
instead of PyMARL's GRU agent (the MPE tasks are fully observed enough for it), Adam instead of
RMSprop, transitions instead of whole episodes in the replay (buffer 50,000 transitions, batches of
256), a hard target copy every 2,000 environment steps (PyMARL: every 200 episodes).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor, nn

from reinforge.algo.qlearning import vdn_q_total, vdn_targets
from reinforge.classic.agents import CLASSIC_AGENTS
from reinforge.classic.dqn import DQN, q_network
from reinforge.classic.envs import finished_episodes, next_observations
from reinforge.classic.marl_envs import MultiAgentVecEnv, multi_agent_envs
from reinforge.classic.marl_nets import actor_inputs
from reinforge.classic.replay import NStep, Replay, store_vector_step
from reinforge.registry import Settings


class VDNSettings(Settings):
    """VDN's hyper-parameters (PyMARL's VDN defaults where it has them; see the module docstring)."""

    lr: float = Field(5e-4, gt=0, description="Adam learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    buffer_size: int = Field(50_000, ge=1, description="replay capacity (joint transitions)")
    batch_size: int = Field(256, ge=1, description="joint transitions per gradient step")
    learning_starts: int = Field(2_000, ge=0, description="environment steps before the first gradient step")
    train_frequency: int = Field(1, ge=1, description="vector steps per iteration")
    gradient_steps: int = Field(1, ge=1, description="gradient steps per iteration")
    target_update_interval: int = Field(2_000, ge=1, description="environment steps between target updates")
    tau: float = Field(1.0, gt=0, le=1, description="target update: theta' <- tau theta + (1 - tau) theta' (1 = copy)")
    start_e: float = Field(1.0, ge=0, le=1, description="initial exploration epsilon")
    end_e: float = Field(0.05, ge=0, le=1, description="final exploration epsilon")
    exploration_fraction: float = Field(0.25, gt=0, le=1, description="share of the run over which epsilon decays")
    double_q: bool = Field(False, description="double Q-learning: each agent's online Q_i picks its next action")
    n_step: int = Field(1, ge=1, description="team rewards summed before bootstrapping")
    loss: Literal["mse", "huber"] = Field("mse", description="regression loss on the TD error")
    max_grad_norm: float | None = Field(10.0, gt=0, description="global gradient-norm clip (None = none)")
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1, description="MLP widths (ReLU)")


@CLASSIC_AGENTS.register(
    "vdn", formula="min E[(sum_i Q_i(o_i, a_i) - (R + (1 - d) gamma^k sum_i max_a Q'_i(o'_i, a)))^2], R = sum_i r_i",
    paper="1706.05296", settings=VDNSettings)
class VDN(DQN):
    """The agent: the shared online and target Q-networks, the joint replay and the environments' observations."""

    def __init__(self, envs: Any, seed: int, cfg: VDNSettings) -> None:
        self.cfg = cfg  # type: ignore[assignment]
        self.envs: MultiAgentVecEnv = multi_agent_envs(envs, "vdn")
        n, width = self.envs.n_agents, self.envs.obs_dim + self.envs.n_agents
        self.n_agents, self.n_actions = n, self.envs.n_actions
        torch.manual_seed(seed)
        self.net = q_network(width, cfg.hidden, self.n_actions)
        self.target = q_network(width, cfg.hidden, self.n_actions)
        self.target.load_state_dict(self.net.state_dict())
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.replay = Replay(cfg.buffer_size, n * self.envs.obs_dim, seed, action_dim=n)
        self.nstep = [NStep(cfg.n_step, cfg.gamma, self.replay) for _ in range(envs.num_envs)]
        self.her = None
        self.steps_per_iteration = cfg.train_frequency * envs.num_envs
        self.env_steps, self.last_target_update = 0, 0
        obs, _ = self.envs.reset(seed=seed)
        self.obs = torch.from_numpy(obs.reshape(envs.num_envs, -1))

    def q_values(self, net: nn.Module, obs: Tensor) -> Tensor:
        """Every agent's action values [B, N, A] from flat joint observations [B, N * D]."""
        return net(actor_inputs(obs.reshape(obs.shape[0], self.n_agents, -1)))

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool, epsilon: float = 0.0) -> Tensor:
        """Each agent's argmax_a Q_i(o_i, a) [B, N], or (with probability ``epsilon``, per agent) a uniform action."""
        greedy = self.q_values(self.net, obs).argmax(-1)
        if deterministic or epsilon <= 0:
            return greedy
        explore = torch.rand(greedy.shape, generator=self.generator) < epsilon
        random = torch.randint(self.n_actions, greedy.shape, generator=self.generator)
        return torch.where(explore, random, greedy)

    def _env_step(self, epsilon: float) -> list[tuple[float, int]]:
        """One vector step; the joint transition with the team reward sum_i r_i goes to the replay."""
        action = self.act(self.obs, False, epsilon)
        obs, reward, terminated, truncated, info = self.envs.step(action.numpy())
        store_vector_step(self.nstep, self.obs.numpy(), action.numpy(), reward.sum(-1), next_observations(obs, info),
                          terminated, truncated)
        self.obs = torch.from_numpy(np.ascontiguousarray(obs.reshape(self.envs.num_envs, -1)))
        self.env_steps += self.envs.num_envs
        return finished_episodes(info)

    def gradient_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """One regression step of Q_tot on VDN's target."""
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        q_tot = vdn_q_total(self.q_values(self.net, t["obs"]), t["actions"])
        with torch.no_grad():
            online = self.q_values(self.net, t["next_obs"]) if self.cfg.double_q else None
            y = vdn_targets(t["rewards"], t["discounts"], t["terminated"], self.q_values(self.target, t["next_obs"]), online)
        loss = nn.functional.mse_loss(q_tot, y) if self.cfg.loss == "mse" else nn.functional.smooth_l1_loss(q_tot, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        return {"train/td_loss": loss.item(), "train/q_tot_mean": q_tot.mean().item()}
