"""Preference objectives on pairs inside a group: DPO (and cDPO's label smoothing) and IPO.

A group's pair is its best and its worst row by reward (``pair_rows``): an offline pair (chosen
reward 1, rejected 0) or, online, the best and worst of a prompt's sampled completions by the
verifier (a group whose rewards are all equal has no pair). The loss is per pair, computed from
the sequence log-ratios of both rows, so a part declares ``whole_groups``: the learner keeps every
group in one mini-batch and one micro-batch.

Per token the loss is the pair's loss spread over each of its two rows, scaled so that with
``loss_agg: seq_mean_token_sum`` (sum over a row's tokens, mean over rows) the mini-batch loss is
exactly the mean over its pairs when the groups have one size (rows outside a pair carry 0).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.registry import Settings


def pair_rows(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor]:
    """(chosen, rejected) row indices, one pair per group whose rewards are not all equal: the first
    row with the group's highest reward and the first with its lowest (ties go to the earlier row)."""
    groups, inverse = torch.unique(group_index, return_inverse=True)
    g = len(groups)
    r = rewards.to(torch.float64)
    hi = torch.full((g,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, inverse, r, "amax")
    lo = torch.full((g,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, inverse, r, "amin")
    rows = torch.arange(len(rewards), device=r.device)
    big = torch.full((g,), len(rewards), dtype=torch.long, device=r.device)
    first_hi = big.scatter_reduce(0, inverse[r == hi[inverse]], rows[r == hi[inverse]], "amin")
    first_lo = big.scatter_reduce(0, inverse[r == lo[inverse]], rows[r == lo[inverse]], "amin")
    has_pair = hi > lo
    return first_hi[has_pair], first_lo[has_pair]


def _pair_margins(logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: Tensor, group_index: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """(chosen, rejected, h): h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)),
    sequence log-probs summed over each row's trained tokens."""
    seq = ((logp - ref_logp) * mask).sum(-1)
    chosen, rejected = pair_rows(rewards, group_index)
    return chosen, rejected, seq[chosen] - seq[rejected]


def _spread(pair_loss: Tensor, chosen: Tensor, rejected: Tensor, mask: Tensor, group_index: Tensor) -> Tensor:
    """Per-token values whose sum over a group's rows is (group size) x the pair's loss, put on the
    pair's two rows evenly over their tokens (see the module docstring)."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    size = counts[inverse].to(pair_loss.dtype)
    per_row = torch.zeros(mask.shape[0], dtype=pair_loss.dtype, device=mask.device)
    per_row = per_row.index_put((chosen,), pair_loss * size[chosen] / 2).index_put(
        (rejected,), pair_loss * size[rejected] / 2)
    return per_row[:, None] * mask / mask.sum(-1, keepdim=True).clamp(min=1)


def _metrics(h: Tensor, beta: float, chosen: Tensor, rejected: Tensor, mask: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """Metrics over the pairs' rows (each a (values, rows) pair): the implicit reward margin beta * h
    and whether the pair is ranked right (h > 0)."""
    n = mask.shape[0]
    margin, right, rows = (torch.zeros(n, device=mask.device) for _ in range(3))
    for idx in (chosen, rejected):
        margin[idx], right[idx], rows[idx] = (beta * h).detach().float(), (h > 0).float(), 1.0
    in_pair = rows[:, None].expand_as(mask).to(mask.dtype)
    return {"preference/margin": (margin[:, None].expand_as(mask).to(mask.dtype), in_pair),
            "preference/accuracy": (right[:, None].expand_as(mask).to(mask.dtype), in_pair)}


class DPOSettings(Settings):
    beta: float = Field(0.1, gt=0, description="inverse temperature of the implicit reward beta * log(pi/pi_ref)")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="cDPO: the probability eps that a pair's "
                                   "label is flipped (0 = plain DPO)")


@POLICY_LOSSES.register(
    "dpo",
    formula=("L = -(1-eps) log sigmoid(beta h) - eps log sigmoid(-beta h), h = log(pi(y_w)/pi_ref(y_w)) - "
             "log(pi(y_l)/pi_ref(y_l)), per pair (best and worst row of a group by reward)"),
    paper=("Rafailov et al. 2023, Direct Preference Optimization (arXiv:2305.18290); label smoothing: cDPO, "
           "Mitchell 2023; online from ranked samples: Guo et al. 2024 (arXiv:2402.04792), Noukhovitch et al. "
           "2024, Asynchronous RLHF (arXiv:2410.18252)"),
    settings=DPOSettings,
    needs=("ref_logp", "whole_groups"),
)
def dpo_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: Tensor, group_index: Tensor,
             cfg: DPOSettings) -> tuple[Tensor, dict[str, Any]]:
    """DPO on each group's pair. dL/dh = -beta (sigmoid(-beta h) (1 - eps) - eps sigmoid(beta h)):
    the chosen answer's log-probability is pushed up and the rejected one's down, each token of a
    row alike, by a weight that vanishes once the pair is ranked by a wide margin."""
    chosen, rejected, h = _pair_margins(logp, ref_logp, mask, rewards, group_index)
    eps = cfg.label_smoothing
    pair_loss = -(1 - eps) * F.logsigmoid(cfg.beta * h) - eps * F.logsigmoid(-cfg.beta * h)
    return _spread(pair_loss, chosen, rejected, mask, group_index), _metrics(h, cfg.beta, chosen, rejected, mask)


class IPOSettings(Settings):
    tau: float = Field(0.1, gt=0, description="regularisation: the loss pulls h towards 1 / (2 tau)")


@POLICY_LOSSES.register(
    "ipo",
    formula="L = (h - 1/(2 tau))^2, h = log(pi(y_w)/pi_ref(y_w)) - log(pi(y_l)/pi_ref(y_l)), per pair",
    paper="Azar et al. 2023, A General Theoretical Paradigm to Understand Learning from Human Preferences (IPO) "
          "(arXiv:2310.12036)",
    settings=IPOSettings,
    needs=("ref_logp", "whole_groups"),
)
def ipo_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: Tensor, group_index: Tensor,
             cfg: IPOSettings) -> tuple[Tensor, dict[str, Any]]:
    """IPO: a squared loss that regresses the log-ratio gap to the target 1 / (2 tau) instead of
    pushing it without bound (DPO's failure mode on deterministic preferences). h uses summed
    sequence log-probs, as in the paper's formulation (Eq. 17)."""
    chosen, rejected, h = _pair_margins(logp, ref_logp, mask, rewards, group_index)
    pair_loss = (h - 1 / (2 * cfg.tau)) ** 2
    return _spread(pair_loss, chosen, rejected, mask, group_index), _metrics(h, 1.0, chosen, rejected, mask)
