"""Networks and inputs of the multi-agent agents: one network shared by all agents (parameter sharing), told
apart by an agent-id one-hot appended to each agent's input (MAPPO, Yu et al. 2022, arXiv:2103.01955,
section 4 / appendix: "parameter sharing" with the agent id in the input; VDN, Sunehag et al. 2017,
arXiv:1706.05296, section 4: shared weights with the agent's index as an input).

Inputs, for N agents with observations o_i [D] (zero-padded to the widest) and the global state s [S]:

    actor_i  = [o_i, onehot(i)]                      (both IPPO and MAPPO)
    critic_i = [o_i, onehot(i)]   (IPPO)    or    [s, onehot(i)]   (MAPPO's centralised critic)

The actor-critic takes both packed in one row ``x = [actor_i, critic_i]`` so the single-agent PPO's
update (classic/ppo.py) trains it unchanged; its MLPs are CleanRL's (classic/networks.py ``mlp``:
tanh, orthogonal initialisation, 0.01 gain on the policy head).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reinforge.algo.entropy import entropy_from_logits
from reinforge.classic.networks import ActionSpec, mlp


def agent_one_hot(batch: int, n_agents: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """onehot(i) for every agent of every batch row, [B, N, N]."""
    return torch.eye(n_agents, dtype=dtype).expand(batch, n_agents, n_agents)


def actor_inputs(obs: Tensor) -> Tensor:
    """[o_i, onehot(i)] from observations [B, N, D] -> [B, N, D + N]."""
    return torch.cat([obs, agent_one_hot(obs.shape[0], obs.shape[1], obs.dtype)], -1)


def critic_inputs(obs: Tensor, state: Tensor | None) -> Tensor:
    """The critic's input per agent, [B, N, C + N]: [s, onehot(i)] with the global state [B, S] (MAPPO),
    or the actor's [o_i, onehot(i)] when ``state`` is None (IPPO)."""
    if state is None:
        return actor_inputs(obs)
    b, n = obs.shape[:2]
    return torch.cat([state.unsqueeze(1).expand(b, n, state.shape[-1]), agent_one_hot(b, n, state.dtype)], -1)


class SharedActorCritic(nn.Module):
    """A categorical actor on ``actor_dim`` and a value critic on ``critic_dim`` inputs, taking rows
    ``x = [actor input, critic input]`` (the interface of networks.ActorCritic)."""

    def __init__(self, actor_dim: int, critic_dim: int, n_actions: int, hidden: list[int]) -> None:
        super().__init__()
        self.action = ActionSpec(n=n_actions)
        self.actor_dim = actor_dim
        self.actor = mlp(actor_dim, hidden, n_actions, head_std=0.01)
        self.critic = mlp(critic_dim, hidden, 1, head_std=1.0)

    def value(self, x: Tensor) -> Tensor:
        """V(critic input) [B]."""
        return self.critic(x[..., self.actor_dim:]).squeeze(-1)

    def evaluate(self, x: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log pi(a | actor input), the policy's entropy and V, each [B] (with gradient)."""
        logits = self.actor(x[..., :self.actor_dim])
        logp = torch.log_softmax(logits, -1).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return logp, entropy_from_logits(logits), self.value(x)

    @torch.no_grad()
    def policy(self, actor_x: Tensor, generator: torch.Generator | None = None,
               deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """A sampled action (the argmax if ``deterministic``) from actor inputs [..., actor_dim], and its log-prob."""
        logits = self.actor(actor_x)
        probs = torch.softmax(logits, -1)
        flat = probs.reshape(-1, probs.shape[-1])
        action = flat.argmax(-1) if deterministic else torch.multinomial(flat, 1, generator=generator).squeeze(-1)
        action = action.reshape(probs.shape[:-1])
        return action, torch.log_softmax(logits, -1).gather(-1, action.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def act(self, x: Tensor, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(action, log-prob, V) of rows ``x`` [B, actor_dim + critic_dim]."""
        action, logp = self.policy(x[..., :self.actor_dim], generator, deterministic)
        return action, logp, self.value(x)
