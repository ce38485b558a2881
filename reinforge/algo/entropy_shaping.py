"""Advantages shaped by the policy's entropy or confidence: GTPO and GRPO-S (entropy-weighted token /
sequence rewards), AEPO's entropy-aware advantage, EGSW's entropy-guided sequence weights and ACE's
asymmetric confidence penalty.

They read, besides the rollout fields, what the no-grad pass at the start of an update computes for
them (they declare it in ``needs``): ``entropy`` [N, T] (H_t of pi_old, the policy that sampled the
batch, per trained token) or ``old_logp`` and ``ref_logp`` [N, T] (ACE's confidence shift).
Groups are ``group_index``; a row's tokens are its masked positions, and "position t" of a row is its
t-th trained token (k(t) = count of masked tokens before it), so multi-turn rows line up by trained
token, not by column. All compute in float64 and return ``mask.dtype``, zero off the mask.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor
from torch.nn.functional import softplus

from reinforge.algo.advantage_estimators import (
    ADVANTAGES,
    GroupNormSettings,
    NormSettings,
    group_mean_std,
    grpo_advantage,
)
from reinforge.algo.aggregation import masked_seq_mean
from reinforge.algo.groups import dense_groups, group_reduce

_TINY = 1e-12


class GTPOSettings(NormSettings):
    """The two reward weights of GTPO / GRPO-S (alpha1 the outcome's, alpha2 the entropy bonus's)."""

    alpha1: float = Field(1.0, ge=0, description="weight of the outcome reward r_i in the shaped reward")
    alpha2: float = Field(0.1, ge=0, description="weight of the entropy-weighted bonus in the shaped reward")


def _sides(rewards: Tensor, group_index: Tensor) -> Tensor:
    """s_i = +1 for a row above its group's mean reward (O+, the successful rows), -1 below (O-), 0 at it."""
    mean, _, _ = group_mean_std(rewards, group_index)
    return torch.sign(rewards.to(torch.float64) - mean)


def _group_norm(values: Tensor, group_index: Tensor, mask: Tensor, eps: float) -> Tensor:
    """(v - mean_g) / (std_g + eps) with mean and (unbiased) std over the masked tokens of each group."""
    m = (mask != 0).to(torch.float64)
    n_groups = int(group_index.max()) + 1
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, m.sum(-1))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, (values * m).sum(-1))
    mean = (total / count.clamp(min=1))[group_index][:, None]
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, (((values - mean) * m) ** 2).sum(-1))
    std = (sq / (count - 1).clamp(min=1)).sqrt()[group_index][:, None]
    return (values - mean) / (std + eps) * m


def _positional(weights: Tensor, keep: Tensor, group_index: Tensor, pos: Tensor) -> Tensor:
    """d_t w_{i,t} / sum_k w_{k,t}: the share of row i among the rows of its group in ``keep`` [N, T]
    (bool) at the same position ``pos`` [N, T], times d_t, the number of such rows (the shares average 1)."""
    width = int(pos.max()) + 1 if pos.numel() else 1
    key = (group_index[:, None] * width + pos)[keep]
    size = (int(group_index.max()) + 1) * width
    w = weights[keep]
    total = torch.zeros(size, dtype=torch.float64).index_add_(0, key, w)
    count = torch.zeros(size, dtype=torch.float64).index_add_(0, key, torch.ones_like(w))
    out = torch.zeros_like(weights)
    out[keep] = count[key] * w / total[key].clamp(min=_TINY)
    return out


@ADVANTAGES.register(
    "gtpo",
    formula=("r~_{i,t} = alpha1 r_i + alpha2 s_i d_t w_{i,t} / sum_{k in O_s} w_{k,t}, w = H (O+) or 1/H (O-), "
             "s_i = +-1; A_{i,t} = (r~_{i,t} - mean_g(r~)) / (std_g(r~) + eps)"),
    paper="Tan et al. 2025, GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy "
          "(arXiv:2508.04349)",
    needs=("entropy",),
    settings=GTPOSettings,
)
def gtpo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, entropy: Tensor, cfg: GTPOSettings) -> Tensor:
    """GTPO: every token gets its own reward, the outcome plus an entropy-weighted share.

    O+ = rows above their group's mean reward (the successful ones, s_i = +1), O- = below (s_i = -1).
    At trained position t (a row's t-th trained token), d_t rows of the same side are still generating;
    a successful row's token gets alpha1 r_i + alpha2 d_t H_{i,t} / sum_{k in O+} H_{k,t} (its
    high-entropy tokens, the decision points, are rewarded most), a failed row's token
    alpha1 r_i - alpha2 d_t H^-1_{i,t} / sum_{k in O-} H^-1_{k,t} (its confident tokens are penalised
    most). The token rewards are then normalised over all trained tokens of the group. Choices where
    the paper is written for binary rewards: "successful" is "above the group's mean", so any reward
    scale works (with 0/1 rewards O+ are the correct rows); the normalisation is over the group's
    tokens of both sides. A group with equal rewards has no O+/O- and its tokens get the (equal) outcome,
    which normalises to 0. H is pi_old's entropy at the token (no gradient)."""
    keep = mask != 0
    side = _sides(rewards, group_index)
    pos = torch.cumsum(keep.long(), dim=-1) - 1
    h = entropy.detach().to(torch.float64).clamp(min=_TINY)
    pos_rows = keep & (side > 0)[:, None]
    neg_rows = keep & (side < 0)[:, None]
    bonus = _positional(h, pos_rows, group_index, pos) - _positional(1.0 / h, neg_rows, group_index, pos)
    shaped = cfg.alpha1 * rewards.to(torch.float64)[:, None] + cfg.alpha2 * bonus
    return _group_norm(shaped, group_index, mask, cfg.adv_eps).to(mask.dtype)


@ADVANTAGES.register(
    "grpo_s",
    formula=("r^_i = beta1 r_i + beta2 s_i n_s w_i / sum_{k in O_s} w_k, w = mean_t H_{i,t} (O+) or its inverse (O-); "
             "A_i = (r^_i - mean_g(r^)) / (std_g(r^) + eps), broadcast to every token"),
    paper="Tan et al. 2025, GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy "
          "(arXiv:2508.04349)",
    needs=("entropy",),
    settings=GTPOSettings,
)
def grpo_s_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, entropy: Tensor,
                     cfg: GTPOSettings) -> Tensor:
    """GRPO-S: GTPO at the sequence level. Each row's mean token entropy H^_i weighs its reward: in
    O+ (above the group's mean) r^_i = beta1 r_i + beta2 n_+ H^_i / sum_{k in O+} H^_k, in O-
    r^_i = beta1 r_i - beta2 n_- H^_i^-1 / sum_{k in O-} H^_k^-1 (n_s: rows on that side), then the
    group normalisation of GRPO, one advantage per row. ``alpha1``/``alpha2`` are beta1/beta2."""
    h = masked_seq_mean(entropy.detach().to(torch.float64), (mask != 0).to(torch.float64)).clamp(min=_TINY)
    side = _sides(rewards, group_index)
    zero = torch.zeros_like(group_index)
    bonus = (_positional(h[:, None], (side > 0)[:, None], group_index, zero[:, None])
             - _positional(1.0 / h[:, None], (side < 0)[:, None], group_index, zero[:, None]))[:, 0]
    shaped = cfg.alpha1 * rewards.to(torch.float64) + cfg.alpha2 * bonus
    mean, std, _ = group_mean_std(shaped, group_index)
    return ((shaped - mean) / (std + cfg.adv_eps))[:, None].to(mask.dtype) * mask


class AEPOAdvantageSettings(GroupNormSettings):
    """AEPO's entropy-aware advantage: the weight of the normalised entropy change."""

    alpha: float = Field(0.3, ge=0, description="weight of the entropy-change advantage A_dH in A_acc (1 + alpha A_dH)")


@ADVANTAGES.register(
    "aepo",
    formula=("A_{i,t} = A_acc,i (1 + alpha A_dH,i,t), A_acc = GRPO's, dH_{i,t} = H_{i,t} - H_{i,root}, "
             "A_dH = (dH - mean_g(dH)) / (std_g(dH) + eps)"),
    paper="Dong et al. 2025, Agentic Entropy-Balanced Policy Optimization (arXiv:2510.14545)",
    needs=("entropy",),
    settings=AEPOAdvantageSettings,
)
def aepo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, entropy: Tensor,
                   cfg: AEPOAdvantageSettings) -> Tensor:
    """AEPO's entropy-aware advantage estimation: GRPO's outcome advantage A_acc scaled per token by
    1 + alpha A_dH, where dH is the token's entropy change from the row's root entropy, normalised
    over the group's trained tokens: tokens whose entropy rose (exploratory steps, e.g. after a tool
    result) get a larger share of the credit or blame. Choices: the root entropy H_{i,root} is the
    entropy at the row's first trained token (the paper's entropy of the question, before any tool
    call); the normalisation is per group. H is pi_old's (no gradient)."""
    acc = grpo_advantage(rewards, group_index, mask, cfg).to(torch.float64)
    keep = mask != 0
    h = entropy.detach().to(torch.float64)
    first = torch.argmax(keep.long(), dim=-1)
    delta = (h - h.gather(1, first[:, None])) * keep
    a_dh = _group_norm(delta, group_index, mask, cfg.adv_eps)
    return (acc * (1.0 + cfg.alpha * a_dh)).to(mask.dtype)


class EGSWSettings(GroupNormSettings):
    """EGSW's entropy weight alpha and softmax temperature P."""

    egsw_alpha: float = Field(0.1, ge=0, description="alpha: weight of the sequence entropy H_i next to A_i in the "
                              "softmax score (A_i + alpha H_i) / P")
    temperature: float = Field(1.0, gt=0, description="P, the softmax temperature: large P -> uniform weights "
                               "(plain GRPO), small P -> the best-scored sequence takes the group's weight")


@ADVANTAGES.register(
    "egsw",
    formula=("A'_i = n_g w_i A_i, w_i = exp((A_i + alpha H_i) / P) / sum_{j in g} exp((A_j + alpha H_j) / P), "
             "A_i = GRPO's, H_i = mean_t H_{i,t} (n_g: rows in the group)"),
    paper="Vanlioglu 2025, Entropy-guided sequence weighting for efficient exploration in RL-based LLM "
          "fine-tuning (EGSW, arXiv:2503.22456); trajectory-wise variant",
    needs=("entropy",),
    settings=EGSWSettings,
)
def egsw_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, entropy: Tensor,
                   cfg: EGSWSettings) -> Tensor:
    """EGSW, trajectory-wise: GRPO's advantage of each row reweighted by a temperature-scaled softmax,
    over its group, of its advantage plus alpha times its entropy H_i (the mean over its trained tokens
    of pi_old's per-token entropy, no gradient), so rows that are both good and uncertain get most of
    the update. The paper's weights sum to 1 over the group and take the place of GRPO's 1/G; here they
    are scaled by the group size n_g (they average 1 over the group), which is the same objective with
    GRPO's 1/G kept. Groups of one row get w = 1. With alpha = 0 and large P every w_i -> 1 (GRPO).
    Choices: the step-wise variant (a weight per token position) is not built; the softmax is over the
    row's group (the paper's sum over the G outputs of a prompt). Token rewards are not read (the
    advantage is GRPO's outcome advantage)."""
    adv = grpo_advantage(rewards, group_index, mask, cfg).to(torch.float64)
    m = (mask != 0).to(torch.float64)
    a = (adv * m).sum(-1) / m.sum(-1).clamp(min=1)  # the row's (broadcast) advantage
    h = masked_seq_mean(entropy.detach().to(torch.float64), m)
    score = (a + cfg.egsw_alpha * h) / cfg.temperature
    gid, n_groups = dense_groups(group_index)
    e = torch.exp(score - group_reduce(score, gid, n_groups, "amax"))  # the softmax is shift-invariant in a group
    size = torch.bincount(gid, minlength=n_groups)[gid].to(torch.float64)
    w = size * e / group_reduce(e, gid, n_groups, "sum")
    return (adv * w[:, None]).to(mask.dtype)


class ACESettings(GroupNormSettings):
    """ACE's penalty strength on overconfident errors."""

    ace_alpha: float = Field(1.0, ge=0, description="alpha: a negative advantage is scaled by 1 + alpha softplus(c_i)")


@ADVANTAGES.register(
    "ace_grpo",
    formula=("A_i = GRPO's; A_i < 0: A_i <- A_i (1 + alpha softplus(c_i)), "
             "c_i = sum_t (log pi_old(y_it) - log pi_ref(y_it))"),
    paper="Xu et al. 2026, Overconfident Errors Need Stronger Correction: Asymmetric Confidence Penalties "
          "for Reinforcement Learning (ACE) (arXiv:2602.21420)",
    needs=("old_logp", "ref_logp"),
    settings=ACESettings,
)
def ace_grpo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, old_logp: Tensor, ref_logp: Tensor,
                       cfg: ACESettings) -> Tensor:
    """ACE over GRPO: the rows with a negative advantage (the errors) are penalised more the more
    confident the policy has become in them relative to the reference: the confidence shift
    c_i = log pi(y_i|x) / pi_ref(y_i|x) (summed over the row's trained tokens, pi = pi_old, the
    policy that sampled them) enters through softplus, so a row the RL run has made likelier than the
    reference did (an overconfident error, c_i > 0) gets up to 1 + alpha c_i times its penalty, one it
    made unlikelier (c_i << 0) about the plain one. Correct rows are unchanged (asymmetric). ``ace_alpha``
    is the paper's alpha (our default 1.0)."""
    adv = grpo_advantage(rewards, group_index, mask, cfg)
    m = (mask != 0).to(torch.float64)
    shift = ((old_logp.to(torch.float64) - ref_logp.to(torch.float64)) * m).sum(-1)
    scale = (1.0 + cfg.ace_alpha * softplus(shift))[:, None].to(adv.dtype)
    return torch.where(adv < 0, adv * scale, adv)
