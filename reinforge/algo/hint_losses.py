"""Guide-GRPO's policy loss: samples drawn with a hint in context, trained for the context without it.

Nath et al. 2025, "Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models"
(arXiv:2506.13923), Guide-GRPO; reconstructed from the authors' code (github.com/vaskar-open-source-research/
guide_rl: ``core_algos.compute_policy_loss``, ``dp_actor`` with ``importance_weighted_reroll`` and the
paper's recipe ``guide_grpo_qwen.sh``). A hinted row (``hinted`` [N], written by the ``hints`` stage,
orchestrate/hint_stage.py) holds the prompt *without* the hint followed by a completion sampled *with* it;
its behaviour log-probs, log pi_old(o_t | q, h, o_<t), are the row's sampling log-probs
(``sampling_logp``: ``Trajectory.logprobs``, the channel LUFFY's demonstration rows use too, where a
token the policy did not sample carries 0, i.e. pi_old = 1). The learner's ``logp`` is the current
policy on the row as held, i.e. without the hint, so

    w_t = pi_theta(o_t | q, o_<t) / pi_old(o_t | q, h, o_<t) = exp(logp_t - sampling_logp_t)

and a hinted token's loss is L_t = -A_t f(w_t), not clipped; an unhinted row takes the PPO clipped
surrogate on rho_t = pi_theta / pi_old (the learner's ``old_logp``). f is the authors' off-policy
shaping (``shaping``): ``percentile`` f(w) = w / (w + gamma), gamma = the ``gamma`` quantile of w over
the hinted tokens (stop-gradient, at least 1e-4; the recipe's 0.9); ``constant`` f(w) = w / (w + gamma)
(LUFFY's form); ``none`` f(w) = w.

Departures: the quantile is taken over the hinted tokens of a micro-batch (the authors': of a PPO
mini-batch on one GPU); with one update per batch the learner's ``old_logp`` equals the behaviour
policy, so only the hinted rows need the stored log-probs.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.context import EXTRA_FIELDS, register_field
from reinforge.algo.policy_losses import POLICY_LOSSES, ClipSettings, bounded_log_ratio, ppo_clip_loss

if "hinted" not in EXTRA_FIELDS:
    register_field("hinted")  # [N] bool: the rows the hints stage sampled with a hint (orchestrate/hint_stage.py)


class GuideSettings(ClipSettings):
    """The unhinted rows' clip range and the hinted rows' shaping."""

    shaping: Literal["percentile", "constant", "none"] = Field(
        "percentile", description="f of a hinted token's ratio w: percentile (the authors' recipe) w / (w + gamma) "
        "with gamma the gamma-quantile of w over the hinted tokens; constant w / (w + gamma); none w")
    gamma: float = Field(0.9, gt=0, description="the quantile (percentile shaping, in (0, 1]) or the constant")


def shaped_ratio(ratio: Tensor, rows: Tensor, cfg: GuideSettings) -> tuple[Tensor, Tensor]:
    """(f(w), gamma) of the ratios ``ratio`` [N, L] on the hinted tokens ``rows`` (bool [N, L])."""
    if cfg.shaping == "none":
        return ratio, ratio.new_zeros(())
    if cfg.shaping == "constant":
        gamma = ratio.new_tensor(cfg.gamma)
    else:
        picked = ratio.detach()[rows]
        gamma = (torch.quantile(picked.float(), min(cfg.gamma, 1.0)).to(ratio.dtype) if picked.numel()
                 else ratio.new_tensor(1.0)).clamp(min=1e-4)
    return ratio / (ratio + gamma), gamma


@POLICY_LOSSES.register(
    "guide",
    formula=("unhinted rows: L_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t); hinted rows: "
             "L_t = -A_t f(w_t), w_t = pi_theta(o_t | q, o_<t) / pi_old(o_t | q, h, o_<t), f(w) = w / (w + gamma), "
             "gamma = quantile_0.9(w) over the hinted tokens (stop-gradient), no clip"),
    paper="Nath et al. 2025, Guide-GRPO, Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models "
          "(arXiv:2506.13923)",
    settings=GuideSettings,
)
def guide_loss(logp: Tensor, old_logp: Tensor, sampling_logp: Tensor, advantages: Tensor, mask: Tensor,
               hinted: Tensor | None, cfg: GuideSettings) -> tuple[Tensor, dict[str, Any]]:
    """Guide-GRPO (module docstring). Without hinted rows it is the PPO clipped surrogate. Metrics over
    the hinted tokens: ``guided/ratio`` (w) and ``guided/gamma``."""
    loss, metrics = ppo_clip_loss(logp, old_logp, advantages, cfg)
    metrics.pop("dual_clip_frac")
    if hinted is None or not bool(hinted.any()):
        return loss, metrics
    rows = hinted.bool()[:, None].expand_as(logp)
    ratio = torch.exp(bounded_log_ratio(logp, sampling_logp))
    shaped, gamma = shaped_ratio(ratio, rows & (mask > 0), cfg)
    with torch.no_grad():
        weight = rows.to(logp.dtype)
        metrics["guided/ratio"] = (ratio.detach(), weight)
        metrics["guided/gamma"] = (gamma.detach().expand_as(logp), weight)
    return torch.where(rows, -advantages * shaped, loss), metrics
