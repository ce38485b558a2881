"""T-PPO's Extended GAE (Fan et al. 2025, Truncated Proximal Policy Optimization, arXiv:2506.15050).

A row whose generation ``continues`` (cut by a window of T-PPO's truncated rollouts, finished in a later
step) has no outcome reward yet and no terminal state: its last state s_l is not the end of the episode.
EGAE takes the value after the window to be the value at its last token, V(s_l) = V(s_{l-1}) (the
paper's assumption), so the last TD residual of such a row is

    delta_{l-1} = r_{l-1} + gamma V(s_{l-1}) - V(s_{l-1})         (r: per-token rewards only, no outcome)

and A_t = sum_k (gamma lam)^k delta_{t+k} over the window, as GAE. A row that ends (EOS, stop string or
the total length limit) is plain GAE: its outcome reward on its last token, V = 0 after it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reinforge.algo.advantages import ADVANTAGES
from reinforge.algo.advantages_batch import GAESettings
from reinforge.algo.returns import (
    _masked_whiten,
    gae_advantages_and_returns,
    last_token_onehot,
    outcome_token_rewards,
)


def egae_token_rewards(rewards: Tensor, mask: Tensor, values: Tensor, gamma: float,
                       continues: Tensor | None = None, token_rewards: Tensor | None = None) -> Tensor:
    """The per-token rewards [N, T] (float64) that make ``gae_advantages_and_returns`` compute EGAE:
    an ending row's outcome reward on its last token (``outcome_token_rewards``); a continuing row gets no
    outcome reward and gamma V_last on its last token instead, which stands for the bootstrap
    gamma V(s_l) = gamma V(s_{l-1}) (the recursion puts V = 0 after a row's last token)."""
    if continues is None:
        return outcome_token_rewards(rewards, mask, token_rewards)
    cont = continues.to(torch.bool).to(mask.device)
    r = outcome_token_rewards(torch.where(cont, 0.0, rewards.to(torch.float64)), mask, token_rewards)
    boot = gamma * values.detach().to(torch.float64)
    return r + torch.where(last_token_onehot(mask) & cont[:, None], boot, 0.0)


@ADVANTAGES.register(
    "egae",
    formula=("GAE over each row's window; a row that continues (T-PPO's truncated rollouts) has no outcome "
             "reward and bootstraps with V(s_l) = V(s_{l-1}): delta_last = r_last + gamma V_last - V_last"),
    paper="Fan et al. 2025, Truncated Proximal Policy Optimization (arXiv:2506.15050); GAE: arXiv:1506.02438",
    needs=("values", "ungrouped"),
    settings=GAESettings,
)
def egae_advantage(rewards: Tensor, mask: Tensor, values: Tensor | None, cfg: GAESettings,
                   continues: Tensor | None = None, token_rewards: Tensor | None = None) -> Tensor:
    """EGAE advantages (module docstring); whitened over the batch's masked tokens with ``cfg.scale_by_std``.
    ``continues`` [N] (bool): the rows whose generation goes on in a later step (None: every row ends, and
    this is ``gae``)."""
    if values is None:
        raise ValueError("advantage 'egae' needs values= (critic values per token, shape [N, T])")
    r = egae_token_rewards(rewards, mask, values, float(cfg.gamma), continues, token_rewards)
    adv, _ = gae_advantages_and_returns(r, values.detach().to(torch.float64), mask, float(cfg.gamma), float(cfg.lam))
    if cfg.scale_by_std:
        adv = _masked_whiten(adv, mask, cfg.adv_eps)
    return (adv * (mask != 0)).to(mask.dtype)
