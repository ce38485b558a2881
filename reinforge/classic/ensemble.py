"""A critic ensemble as one batched module: E MLPs Q_e(s, a) whose weights are stacked [E, in, out], so one
``torch.baddbmm`` per layer evaluates all members (no Python loop over E). Optional LayerNorm after each
hidden layer's affine map, before its ReLU (Ball et al. 2023, RLPD, arXiv:2302.02948, section 3.2; the
authors' MLP: Dense -> LayerNorm -> ReLU), with a per-member scale and shift. Each member is initialised as
``nn.Linear`` would (weights and biases uniform in +-1/sqrt(fan_in)), independently.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class EnsembleLinear(nn.Module):
    """E independent affine maps: x [E, B, in] -> [E, B, out]."""

    def __init__(self, members: int, fan_in: int, fan_out: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = nn.Parameter(torch.empty(members, fan_in, fan_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, fan_out).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the features of each member, with the member's own scale (init 1) and shift (init 0)."""

    def __init__(self, members: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, 1, width))
        self.bias = nn.Parameter(torch.zeros(members, 1, width))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.layer_norm(x, x.shape[-1:]) * self.weight + self.bias


class EnsembleCritic(nn.Module):
    """Q_e(s, a) for e = 1..E as [E, B]: a ReLU MLP per member over cat(s, a), LayerNorm optional."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], members: int, layer_norm: bool) -> None:
        super().__init__()
        self.members = members
        layers: list[nn.Module] = []
        width = obs_dim + act_dim
        for out in hidden:
            layers.append(EnsembleLinear(members, width, out))
            if layer_norm:
                layers.append(EnsembleLayerNorm(members, out))
            layers.append(nn.ReLU())
            width = out
        layers.append(EnsembleLinear(members, width, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        x = torch.cat([obs, action], -1)
        return self.body(x.unsqueeze(0).expand(self.members, *x.shape)).squeeze(-1)


def subset_min(q: Tensor, subset: Tensor) -> Tensor:
    """REDQ's target value (Chen et al. 2021, arXiv:2101.05982): min over the members ``subset`` (indices [M])
    of the ensemble's values q [E, B] -> [B]."""
    return q.index_select(0, subset).min(0).values
