"""V-trace (Espeholt et al. 2018, IMPALA, arXiv:1802.01561): off-policy value targets and policy-gradient
advantages from trajectories of a behaviour policy mu, for a target policy pi.

Over the masked positions s of a row in order (the [N, T] convention of ``gae_advantages_and_returns``;
a row is one episode, its end is terminal, V = 0 after it; unmasked positions are skipped):

    rho_s = min(rho_bar, pi(a_s)/mu(a_s)),  c_s = lam * min(c_bar, pi(a_s)/mu(a_s)),
    delta_s = rho_s (r_s + gamma V_{s+1} - V_s),
    v_s = V_s + delta_s + gamma c_s (v_{s+1} - V_{s+1})      (paper, Remark 1),
    A_s = rho_s (r_s + gamma v_{s+1} - V_s)                 (the policy-gradient advantage, Section 4.2).

On-policy (all ratios 1) with rho_bar, c_bar >= 1 and lam = 1, v_s is the TD(lambda=1) return, i.e.
GAE(lambda=1)'s return, and A_s its advantage. Time-major data with episode ends and a bootstrap
value: fold gamma V(x_T) into the last reward of an unfinished segment and cut the segments into rows
with ``returns.episode_rows`` (the classic agents' convention, reinforge/classic/ppo.py).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, DiscountSettings
from reinforge.algo.returns import outcome_token_rewards


class VTraceSettings(DiscountSettings):
    """V-trace's truncation levels and its lambda."""

    rho_bar: float = Field(1.0, gt=0, description="truncation rho_bar of the importance weight in delta_s and A_s "
                           "(the fixed point's policy lies between mu and pi; paper default 1)")
    c_bar: float = Field(1.0, gt=0, description="truncation c_bar of the trace coefficients c_s (the speed of "
                         "convergence; paper default 1)")
    lam: float = Field(1.0, ge=0, le=1, description="lambda of the traces, c_s = lam min(c_bar, ratio) (paper, Remark 2)")


@torch.no_grad()
def vtrace_returns(
    token_level_rewards: Tensor, values: Tensor, log_rhos: Tensor, mask: Tensor, gamma: float,
    rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace targets ``v_s`` and policy-gradient advantages ``A_s`` over the masked positions of each
    row (formulas in the module docstring); ``log_rhos`` = log pi(a_s) - log mu(a_s). Both outputs are 0
    where ``mask`` is 0. Computed in float64 without gradient, returned in ``values.dtype``."""
    live = mask != 0
    r = torch.where(live, token_level_rewards.to(torch.float64), 0.0)
    v = torch.where(live, values.to(torch.float64), 0.0)
    ratio = torch.exp(log_rhos.to(torch.float64))
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    vs = torch.zeros_like(v)
    adv = torch.zeros_like(v)
    next_v = v.new_zeros(v.shape[0])  # V_{s+1}
    next_vs = v.new_zeros(v.shape[0])  # v_{s+1}
    for t in range(v.shape[-1] - 1, -1, -1):  # sequential recurrence over T, tensor ops over N
        m = live[:, t]
        delta = rho[:, t] * (r[:, t] + gamma * next_v - v[:, t])
        vs_t = v[:, t] + delta + gamma * c[:, t] * (next_vs - next_v)
        adv[:, t] = torch.where(m, rho[:, t] * (r[:, t] + gamma * next_vs - v[:, t]), 0.0)
        vs[:, t] = torch.where(m, vs_t, 0.0)
        next_vs = torch.where(m, vs_t, next_vs)
        next_v = torch.where(m, v[:, t], next_v)
    return vs.to(values.dtype), adv.to(values.dtype)


@ADVANTAGES.register(
    "vtrace",
    formula=(
        "rho_s = min(rho_bar, pi/mu), c_s = lam min(c_bar, pi/mu), delta_s = rho_s (r_s + gamma V_{s+1} - V_s), "
        "v_s = V_s + delta_s + gamma c_s (v_{s+1} - V_{s+1}), A_s = rho_s (r_s + gamma v_{s+1} - V_s)"
    ),
    paper="Espeholt et al. 2018, IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner "
          "Architectures (arXiv:1802.01561)",
    needs=("values", "old_logp", "sampling_logp"),
    settings=VTraceSettings,
)
def vtrace_advantage(
    rewards: Tensor, mask: Tensor, values: Tensor | None, old_logp: Tensor | None, cfg: VTraceSettings,
    sampling_logp: Tensor | None = None, token_rewards: Tensor | None = None,
) -> Tensor:
    """V-trace policy-gradient advantages A_s with a critic, for tokens sampled by a behaviour policy.

    The target policy pi is pi_old (``old_logp``: the learner's policy when the update starts) and the
    behaviour policy mu is the rollout engine's (``sampling_logp``; without it mu = pi, all ratios 1).
    Per-token reward r_t = tr_t + r_i on the last masked token (as ``gae``). A_s already carries the
    truncated weight rho_s, so it goes with the plain policy gradient (``policy_loss: reinforce``) for
    IMPALA's update; with ``ppo_clip`` the ratio pi/pi_old is applied on top. The critic's regression
    targets of the LLM loop stay GAE's returns (``algo.discount``); ``vtrace_returns`` gives v_s.
    """
    if values is None or old_logp is None:
        raise ValueError("advantage 'vtrace' needs values= (a critic) and old_logp= (the target policy)")
    log_rhos = old_logp - sampling_logp if sampling_logp is not None else torch.zeros_like(old_logp)
    r = outcome_token_rewards(rewards, mask, token_rewards)
    _, adv = vtrace_returns(r, values.detach(), log_rhos.detach(), mask, float(cfg.gamma), cfg.rho_bar, cfg.c_bar,
                            cfg.lam)
    return (adv.to(torch.float64) * (mask != 0)).to(mask.dtype)
