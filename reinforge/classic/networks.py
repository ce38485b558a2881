"""Small MLP actor-critic for vector observations, as CleanRL's ``Agent`` (ppo.py, ppo_continuous_action.py):
separate tanh MLPs for the actor and the critic, orthogonal initialisation (gain sqrt(2) in the hidden
layers, 0.01 on the policy head, 1 on the value head, zero biases: Engstrom et al. 2020,
arXiv:2005.12729, and Andrychowicz et al. 2021, arXiv:2006.05990).

Discrete actions: a categorical over the actor's logits. Box actions: a diagonal Gaussian with a
state-independent log-std (a parameter, initialised to 0); the environment's ``ClipAction`` wrapper
clips a sample to the bounds, the log-prob is the unclipped sample's (CleanRL's convention).
Sampling draws from the given ``torch.Generator`` so a run is reproducible from its seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from reinforge.algo.entropy import entropy_from_logits


@dataclass(frozen=True)
class ActionSpec:
    """What the policy outputs: ``n`` discrete actions, or a Box of ``dim`` dimensions (``n`` = 0)."""

    n: int = 0
    dim: int = 0

    @property
    def discrete(self) -> bool:
        return self.n > 0


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(inputs: int, hidden: list[int], outputs: int, head_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(inputs, width)), nn.Tanh()]
        inputs = width
    return nn.Sequential(*layers, layer_init(nn.Linear(inputs, outputs), std=head_std))


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, action: ActionSpec, hidden: list[int]) -> None:
        super().__init__()
        self.action = action
        self.critic = mlp(obs_dim, hidden, 1, head_std=1.0)
        self.actor = mlp(obs_dim, hidden, action.n if action.discrete else action.dim, head_std=0.01)
        self.log_std = None if action.discrete else nn.Parameter(torch.zeros(1, action.dim))

    def value(self, obs: Tensor) -> Tensor:
        """V(s) [B]."""
        return self.critic(obs).squeeze(-1)

    def _log_prob(self, out: Tensor, action: Tensor) -> Tensor:
        if self.action.discrete:
            return torch.log_softmax(out, -1).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        assert self.log_std is not None
        log_std = self.log_std.expand_as(out)
        z = (action - out) / log_std.exp()
        return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def _entropy(self, out: Tensor) -> Tensor:
        if self.action.discrete:
            return entropy_from_logits(out)
        assert self.log_std is not None
        return (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std.expand_as(out)).sum(-1)

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log pi(a|s), the policy's entropy at s and V(s), each [B] (with gradient)."""
        out = self.actor(obs)
        return self._log_prob(out, action), self._entropy(out), self.value(obs)

    @torch.no_grad()
    def act(self, obs: Tensor, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """A sampled action (the mode if ``deterministic``), its log-prob and V(s)."""
        out = self.actor(obs)
        if self.action.discrete:
            probs = torch.softmax(out, -1)
            action = probs.argmax(-1) if deterministic else torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        else:
            assert self.log_std is not None
            noise = torch.randn(out.shape, generator=generator, dtype=out.dtype)
            action = out if deterministic else out + self.log_std.exp() * noise
        return action, self._log_prob(out, action), self.value(obs)  # no entropy: the rollout does not use it


def action_spec(space: object) -> ActionSpec:
    """The ActionSpec of a Gymnasium single-action space (Discrete or Box)."""
    from gymnasium.spaces import Box, Discrete

    if isinstance(space, Discrete):
        return ActionSpec(n=int(space.n))
    if isinstance(space, Box):
        return ActionSpec(dim=int(math.prod(space.shape)))
    raise ValueError(f"unsupported action space {space}: the classic agents take Discrete or Box actions")


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """theta' <- tau theta + (1 - tau) theta' for every parameter (tau = 1: a hard copy)."""
    for p_target, p in zip(target.parameters(), online.parameters(), strict=True):
        p_target.mul_(1.0 - tau).add_(p, alpha=tau)
