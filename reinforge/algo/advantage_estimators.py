"""Advantage estimators: rewards (and values) -> per-token advantages, one small registered function each.

    name                   A_i, on each token of sequence i (A_t: per token; g: i's group)  paper (arXiv)
    grpo                   (r_i - mean_g r) / (std_g r + eps), the std optional             GRPO 2402.03300
    grpo_turn              A_t = (G_{i,k(t)} - mean_g G_0) / (std_g G_0 + eps), G: turns    2505.11821
    dr_grpo                r_i - mean_g r, never std-scaled                                 Dr. GRPO 2503.20783
    rloo                   r_i - the mean reward of the other samples of g                  RLOO 2402.14740
    opo                    r_i - sum_g l_j r_j / sum_g l_j (l_j: lengths)                   OPO 2505.23585
    treepo                 mean of grpo's advantages in g and in each subtree above i       TreePO 2508.17445
    reinforce_pp           A_t = return-to-go G_t whitened over the batch's tokens          REINFORCE++ 2501.03262
    reinforce_pp_baseline  r_i - mean_g r, whitened over the batch's sequences              REINFORCE++ 2501.03262
    remax                  r_i - r(the greedy completion of i's prompt)                     ReMax 2310.10505
    pvpo                   r_i - V_ref(x_i), mean reward of reference samples               PVPO 2508.21104
    gae                    A_t = sum_k (gamma lam)^k delta_{t+k}, delta: TD residuals       GAE 1506.02438
    egae                   gae; a row that continues bootstraps V(s_l) = V(s_{l-1})         T-PPO 2506.15050

An estimator (registered in ``ADVANTAGES``) declares only the parameters it reads: each is a field
of the context record (``algo/context.py``, bound by name by ``Registry.call``), and ``cfg`` is the
estimator's own settings (its ``settings=`` model, validated from ``algo.advantage: {name: ...,
option: value}``). The fields: ``rewards`` [N], ``group_index`` [N] (long: the prompt, i.e. group,
of each sequence), ``mask`` [N, T], ``values`` [N, T] (a critic's; ``gae``), ``token_rewards``
[N, T], ``baseline`` [N] (``remax``), ``turn_returns`` [N, T] (``grpo_turn``). The result is
[N, T] and zero wherever ``mask`` is zero.

``token_rewards`` are extra per-token rewards (e.g. ``-beta * KL`` when the KL penalty is placed in
the reward); only masked positions count. The outcome estimators (grpo, dr_grpo, rloo,
reinforce_pp_baseline, opo, remax) add to every masked token t its discounted return-to-go
``sum_{s >= t, m_s = 1} gamma^(k(s) - k(t)) tr_s`` (k counts masked tokens, so unmasked positions,
e.g. environment tokens between the model turns of a multi-turn episode, are skipped, not
discounted; ``gamma = cfg.gamma``); ``reinforce_pp`` and ``gae`` instead fold them into the per-token
return they normalise / bootstrap. ``baseline`` is a per-sequence baseline reward (the reward of the
greedy completion of the sequence's prompt), used by ``remax`` (``pvpo``'s is the reference
policy's mean reward on the prompt).

All estimators compute in float64 and return ``mask.dtype``; without ``token_rewards`` the outcome
estimators give exactly the per-sequence advantage broadcast over the masked tokens.

Estimators with machinery of their own stay in their modules: ``gigpo`` (anchor states, ``algo/gigpo.py``),
``spo`` (a per-prompt value tracker, ``algo/spo.py``), ``vineppo`` (Monte Carlo state values,
``algo/vineppo.py``), ``segment_po`` (segment values at low-probability cutpoints, ``algo/segment_po.py``),
``treerl`` (tree node values, ``algo/treerl.py``), ``vtrace`` (``algo/vtrace.py``), the entropy-shaped ones (``algo/entropy_shaping.py``),
APO's ``grpo_stcr`` (``algo/kl_adaptive.py``) and ``no_reward`` (``algo/distill.py``); the returns and
normalisations they share are ``algo/returns.py``'s.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.context import PART_INPUTS
from reinforge.algo.returns import (
    _batch_mean_std,
    _gamma,
    _masked_whiten,
    _per_token,
    gae_advantages_and_returns,
    last_token_onehot,
    outcome_token_rewards,
    returns_to_go,
)
from reinforge.registry import Registry, Settings, kind


class AdvantageFn(Protocol):
    """An estimator: keyword parameters named after the context fields it reads, ``cfg`` its
    settings; returns the [N, T] advantages (e.g. ``fn(rewards, group_index, mask, cfg)``)."""

    def __call__(self, **fields: Any) -> Tensor: ...


ADVANTAGES: Registry[AdvantageFn] = kind(
    "advantage", Registry("advantage estimator", inputs=PART_INPUTS, references=True))


class DiscountSettings(Settings):
    """The discount of per-token rewards, the one option every built-in estimator reads."""

    gamma: float = Field(1.0, ge=0, le=1, description="discount of per-token rewards (returns-to-go, GAE, "
                         "multi-turn turn returns)")


class NormSettings(DiscountSettings):
    """Estimators that divide by a standard deviation (REINFORCE++)."""

    adv_eps: float = Field(1e-6, gt=0, description="epsilon added to the std in the denominator")


class GroupNormSettings(NormSettings):
    """GRPO-like estimators, whose std scaling is optional."""

    scale_by_std: bool = Field(True, description="divide by the std (grpo: the group's; gae: whiten over the batch)")


def group_mean_std(values: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element group mean, unbiased group std (0 for groups of one) and group size."""
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    values = values.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, torch.ones_like(values))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, values)
    mean = (total / count)[group_index]
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, (values - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return mean, var.sqrt()[group_index], count[group_index]


def group_relative(r: Tensor, index: Tensor, cfg: GroupNormSettings) -> Tensor:
    """GRPO's group-relative advantage of ``r`` [N] (float64) in the groups ``index``: (r - mean_g r) /
    (std_g r + eps), or r - mean_g r without ``cfg.scale_by_std``."""
    mean, std, _ = group_mean_std(r, index)
    adv = r - mean
    return adv / (std + cfg.adv_eps) if cfg.scale_by_std else adv


# ------------------------------------------- group-relative: GRPO, its turn form, Dr. GRPO, RLOO, OPO, TreePO
@ADVANTAGES.register(
    "grpo",
    formula="A_i = (r_i - mean_g(r)) / (std_g(r) + eps)  [std scaling optional], broadcast to every token",
    paper="Shao et al. 2024, DeepSeekMath (arXiv:2402.03300)",
    settings=GroupNormSettings,
)
def grpo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: GroupNormSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """Group-relative advantage (GRPO, outcome supervision).

    A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps), with the unbiased std;
    without ``cfg.scale_by_std`` only the mean is subtracted. Every token of sequence i gets A_i.
    A group of one sample, or one whose rewards are all equal, gets advantage 0.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    return _per_token(group_relative(rewards.to(torch.float64), group_index, cfg), mask, token_rewards, cfg)


@ADVANTAGES.register(
    "grpo_turn",
    formula="A_{i,t} = (G_{i,k(t)} - mean_g(G_{.,0})) / (std_g(G_{.,0}) + eps), G_{i,k} = sum_{m>=k} gamma^(m-k) r_{i,m}, "
            "k(t) = the turn of token t  [std scaling optional]",
    paper="turn-level credit for multi-turn agents, cf. Zeng et al. 2025 (arXiv:2505.11821); group baseline of "
          "Shao et al. 2024 (arXiv:2402.03300)",
    needs=("turn_returns",),
    settings=GroupNormSettings,
)
def grpo_turn_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    cfg: GroupNormSettings,
    token_rewards: Tensor | None = None,
    turn_returns: Tensor | None = None,  # the context field (the function of that name is returns.py's)
) -> Tensor:
    """Turn-level group-relative advantage for multi-turn episodes.

    Every model token t of episode i gets the discounted return from its own turn on, G_{i,k(t)}
    (``turn_returns[i, t]``, filled by the orchestrator from ``Trajectory.turn_rewards`` with
    ``cfg.gamma``), minus the mean over the group (episodes of the same task) of the episodes'
    returns from the start G_{j,0}, divided by their std (``cfg.scale_by_std``). A later turn is
    credited only with the rewards that came after it; with one turn (or gamma = 1 and a reward
    at the end only) this is ``grpo``. Without ``turn_returns`` every token gets r_i (single-turn).
    """
    if turn_returns is None:
        turn_returns = rewards.to(torch.float64)[:, None].expand(mask.shape)
    turn_returns = turn_returns.to(torch.float64)
    live = mask != 0
    has_tokens = live.any(1)
    first = live.to(torch.int64).argmax(1)
    g0 = torch.where(has_tokens, turn_returns.gather(1, first[:, None])[:, 0], rewards.to(torch.float64))
    mean, std, _ = group_mean_std(g0, group_index)
    adv = turn_returns - mean[:, None]
    if cfg.scale_by_std:
        adv = adv / (std[:, None] + cfg.adv_eps)
    if token_rewards is not None:
        adv = adv + returns_to_go(token_rewards.to(torch.float64), mask, _gamma(cfg))
    return (adv * live).to(mask.dtype)


@ADVANTAGES.register(
    "dr_grpo",
    formula="A_i = r_i - mean_g(r)  [never std-scaled], broadcast to every token",
    paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO, arXiv:2503.20783)",
    settings=DiscountSettings,
)
def dr_grpo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """Dr. GRPO advantage: GRPO without the per-group std division.

    A_i = r_i - mean_{j in g(i)} r_j, every token of sequence i gets A_i. It has no ``scale_by_std``
    option: removing the std (which up-weights near-uniform groups) is the point of Dr. GRPO.
    (The paper's other fix, dropping the 1/|o_i| length normalisation, is a loss aggregation
    choice and lives in the loss, not here.) A group of one, or with equal rewards, gets 0.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, _ = group_mean_std(rewards, group_index)
    return _per_token(rewards.to(torch.float64) - mean, mask, token_rewards, cfg)


@ADVANTAGES.register(
    "rloo",
    formula="A_i = r_i - (sum_g r - r_i) / (|g| - 1) = |g| / (|g| - 1) * (r_i - mean_g(r)); 0 if |g| = 1",
    paper=(
        "Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization for Learning from "
        "Human Feedback in LLMs (arXiv:2402.14740); estimator from Kool et al. 2019"
    ),
    settings=DiscountSettings,
)
def rloo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """REINFORCE leave-one-out (RLOO) advantage.

    A_i = r_i - (1 / (|g| - 1)) sum_{j in g(i), j != i} r_j = |g| / (|g| - 1) * (r_i - mean_g r):
    each sample's baseline is the mean reward of the *other* samples of its prompt, which keeps
    the gradient estimate unbiased. A group of one has no other sample and gets advantage 0.
    No std scaling. Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, count = group_mean_std(rewards, group_index)
    factor = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.zeros_like(count))
    return _per_token(factor * (rewards.to(torch.float64) - mean), mask, token_rewards, cfg)


@ADVANTAGES.register(
    "opo",
    formula="b_g = sum_{j in g} l_j r_j / sum_{j in g} l_j  (l_j = generated tokens of j);  A_i = r_i - b_g",
    paper="Hao et al. 2025, On-Policy RL with Optimal reward baseline (OPO, arXiv:2505.23585)",
    settings=DiscountSettings,
)
def opo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """OPO advantage: group baseline weighted by response length (the optimal baseline).

    l_j = number of nonzero entries of ``mask[j]`` (its generated tokens), b_g = sum_{j in g} l_j r_j
    / sum_{j in g} l_j and A_i = r_i - b_g. Under the paper's assumption that token gradients are
    i.i.d., this baseline minimises the variance of the sequence-level policy gradient. A group
    whose lengths are all zero has no baseline and gets 0 (its tokens are all masked anyway). No
    std scaling. Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    r = rewards.to(torch.float64)
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    length = (mask != 0).sum(dim=-1).to(torch.float64)
    len_sum = r.new_zeros(n_groups).index_add_(0, group_index, length)
    weighted = r.new_zeros(n_groups).index_add_(0, group_index, length * r)
    b_g = (weighted / len_sum.clamp(min=1))[group_index]
    adv = torch.where(len_sum[group_index] > 0, r - b_g, torch.zeros_like(r))
    return _per_token(adv, mask, token_rewards, cfg)


@ADVANTAGES.register(
    "treepo",
    formula="A_i = mean_{j in J_i} (r_i - mean_{S_j}(r)) / (std_{S_j}(r) + eps), S_j = the prompt's group and each "
            "subtree above leaf i with >= 2 leaves  [std scaling optional]",
    paper="Li et al. 2025, TreePO (arXiv:2508.17445)",
    needs=("subgroups",),
    settings=GroupNormSettings,
)
def treepo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: GroupNormSettings,
                     subgroups: Tensor | None = None, token_rewards: Tensor | None = None) -> Tensor:
    """TreePO's tree-based (segment-level) advantage, broadcast to every token of the sequence.

    A tree sampler (rollout/tree_sampler.py) records, for every completion, the branch points above it;
    the learner gives them as ``subgroups`` [N, K] (long; the ids of the subtrees each sequence belongs
    to besides its whole group, -1 padding; ids are unique across the batch). Each subtree S_j above
    leaf i (the prompt's whole group S_0 included) is a sub-group with its own group-relative advantage,
    and the leaf's advantage is their plain average:

        A_i = (1 / |J_i|) sum_{j in J_i} (r_i - mean_{S_j} r) / (std_{S_j} r + eps)

    J_i: the whole group and every subtree above i with at least two leaves (std: unbiased; without
    ``scale_by_std`` only the mean is subtracted). Without subtrees this is GRPO.
    """
    r = rewards.to(torch.float64)
    total = group_relative(r, group_index, cfg)
    count = torch.ones_like(r)
    if subgroups is not None and subgroups.numel():
        for column in subgroups.T:
            member = column >= 0
            if not bool(member.any()):
                continue
            _, compact = torch.unique(column[member], return_inverse=True)
            _, _, size = group_mean_std(r[member], compact)
            adv = group_relative(r[member], compact, cfg)
            counted = size >= 2
            idx = member.nonzero().squeeze(-1)[counted]
            total[idx] += adv[counted]
            count[idx] += 1
    return _per_token(total / count, mask, token_rewards, cfg)


# ------------------------------------------------------ batch-normalised or a baseline from outside the group
class ReinforcePPSettings(NormSettings):
    """REINFORCE++: how the batch whitening weighs tokens."""

    whiten: Literal["token", "sequence"] = Field(
        "token", description="token: every masked token weighs the same in the batch mean/std (the paper); "
        "sequence: every sequence weighs the same (token weight 1/|y_i|)")


@ADVANTAGES.register(
    "reinforce_pp",
    formula=(
        "G_t = sum_{s>=t} gamma^(s-t) (tr_s + r_i [s = last])  [tr = 0 without token rewards]; "
        "A_t = (G_t - mean_w(G)) / (std_w(G) + eps) over the batch's masked tokens, "
        "w_t = 1 (whiten: token) or 1/|y_i| (whiten: sequence)"
    ),
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262)",
    settings=ReinforcePPSettings,
)
def reinforce_pp_advantage(
    rewards: Tensor, mask: Tensor, cfg: ReinforcePPSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """REINFORCE++ advantage: the per-token return, whitened over the whole batch (groups ignored).

    The outcome reward r_i sits on the last masked token of sequence i, plus the per-token rewards
    ``tr`` when there are any (e.g. -beta * KL with the KL in the reward); G_t is the discounted
    return-to-go over the masked tokens. G is whitened over every masked token of the batch:
    A_t = (G_t - mu) / (sigma + eps), mu and sigma the weighted mean and *population* std
    (divide by the total weight, so a batch of one or an all-equal batch gives A = 0).

    The weights are the same with and without token rewards, so turning the KL off does not change
    how long responses count: ``whiten: token`` (default, the paper's per-token normalisation:
    w_t = 1, a long response weighs more) or ``whiten: sequence`` (w_t = 1/|y_i|: every response
    weighs the same; with gamma = 1 and no token rewards this is the per-sequence normalisation of
    r_i). Zero-length responses have no tokens and do not count. ``eps = cfg.adv_eps``.
    """
    tr = token_rewards if token_rewards is not None else torch.zeros_like(mask)
    g = returns_to_go(outcome_token_rewards(rewards, mask, tr), mask, _gamma(cfg)).to(torch.float64)
    live = mask != 0
    weight = live.to(torch.float64)
    if getattr(cfg, "whiten", "token") == "sequence":
        weight = weight / weight.sum(-1, keepdim=True).clamp(min=1)
    total = weight.sum()
    if total == 0:
        return torch.zeros_like(mask)
    mu = (weight * g).sum() / total
    sigma = ((weight * (g - mu) ** 2).sum() / total).sqrt()
    return torch.where(live, (g - mu) / (sigma + cfg.adv_eps), 0.0).to(mask.dtype)


@ADVANTAGES.register(
    "reinforce_pp_baseline",
    formula=(
        "d_i = r_i - mean_g(r);  A_i = (d_i - mean_batch(d)) / (std_batch(d) + eps)  "
        "[population std over all N sequences]"
    ),
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262), REINFORCE++-baseline variant",
    settings=NormSettings,
)
def reinforce_pp_baseline_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: NormSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """REINFORCE++-baseline advantage: group-mean baseline, then global batch normalisation.

    d_i = r_i - mean_{j in g(i)} r_j, then A_i = (d_i - mu) / (sigma + eps) with mu, sigma the
    mean and population std (divide by N, as in ``reinforce_pp``) of d over all N sequences.
    Since every group's d sums to 0, mu is 0 up to rounding; it is subtracted anyway to follow
    the paper. Unlike GRPO the scale is shared by the whole batch, so a group with a small spread
    is not blown up. Singleton and equal-reward groups have d = 0 and so A = 0 (mu = 0).
    There is no ``scale_by_std`` option; ``eps = cfg.adv_eps``. Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, _ = group_mean_std(rewards, group_index)
    d = rewards.to(torch.float64) - mean
    mu, sigma = _batch_mean_std(d)
    return _per_token((d - mu) / (sigma + cfg.adv_eps), mask, token_rewards, cfg)


@ADVANTAGES.register(
    "remax",
    formula="A_i = r_i - r(greedy completion of prompt(i)), broadcast to every token (+ token-reward returns-to-go)",
    paper="Li et al. 2023, ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs (arXiv:2310.10505)",
    needs=("greedy_baseline",),
    settings=DiscountSettings,
)
def remax_advantage(
    rewards: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """ReMax advantage: REINFORCE with the greedy completion's reward as baseline.

    A_i = r_i - b_i with b_i = ``baseline[i]``, the reward of the greedy (argmax-decoded) completion
    of sequence i's prompt; the baseline removes the prompt's difficulty from the return without
    a critic. No normalisation; groups are not used. Every token
    of sequence i gets A_i. With ``token_rewards``, every masked token t also gets
    ``returns_to_go(token_rewards)[t]``. Raises ``ValueError`` without ``baseline``.
    """
    if baseline is None:
        raise ValueError(
            "advantage 'remax' needs baseline= (the reward of each prompt's greedy completion, shape [N])"
        )
    if baseline.shape != rewards.shape:
        raise ValueError(f"remax baseline has shape {tuple(baseline.shape)}, expected {tuple(rewards.shape)}")
    adv = rewards.to(torch.float64) - baseline.to(torch.float64)
    return _per_token(adv, mask, token_rewards, cfg)


class PVPOSettings(GroupNormSettings):
    """PVPO: the reference samples per prompt, the filters, and an optional group std scaling."""

    scale_by_std: bool = Field(False, description="divide by the group's reward std (not in the paper's A = r - V)")
    value_samples: int = Field(8, ge=1, description="reference samples per prompt for V_ref (drawn once, cached)")
    skip_solved: bool = Field(True, description="no loss for a prompt all of whose reference samples reach "
                              "solved_reward (trivial: the paper filters them out)")
    solved_reward: float = Field(1.0, description="the reward of a solved sample (skip_solved)")
    skip_unsolved: bool = Field(False, description="no loss for a prompt none of whose reference samples scored "
                                "(the paper keeps them and injects ground-truth trajectories: demonstrations.guidance failed_groups)")


@ADVANTAGES.register(
    "pvpo",
    formula="A_i = r_i - V_ref(x_i), V_ref(x) = mean_j r(x, y_j), y_j ~ pi_ref, N = value_samples, once per prompt "
            "[divided by std_g(r) + eps: optional]",
    paper="Feng et al. 2025, PVPO: Pre-Estimated Value-Based Policy Optimization for Agentic Reasoning "
          "(arXiv:2508.21104)",
    needs=("reference_value", "ungrouped"),
    settings=PVPOSettings,
)
def pvpo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: PVPOSettings,
                   baseline: Tensor | None = None, token_rewards: Tensor | None = None) -> Tensor:
    """PVPO's advantage: the reward minus the reference policy's mean reward on the prompt
    (``baseline``, the loop's ``reference_value``); with ``scale_by_std`` divided by the group's
    reward std + eps. Every token of sequence i gets A_i (+ the token rewards' returns-to-go).
    Raises ``ValueError`` without ``baseline``.

        A_i = r_i - V_ref(x_i),   V_ref(x) = mean_{j=1..N} r(x, y_j),  y_j ~ pi_ref(. | x)

    V_ref is sampled once per prompt from the frozen reference policy (the loop's ``reference_value``
    estimate, orchestrate/value_estimates.py, the machinery of A*-PO's V*: cached by task id, saved in
    checkpoints) and handed in ``baseline``. The baseline does not move with the policy, so the advantage
    keeps a signal when every sample of a group scores the same. Prompts all of whose reference samples
    are correct are trivial and, with ``skip_solved``, kept out of the loss (the paper's pre-sampling filter).
    """
    if baseline is None or baseline.shape != rewards.shape:
        raise ValueError("advantage 'pvpo' needs baseline= (V_ref per sequence, shape [N]): declared "
                         "reference_value, filled by the loop")
    adv = rewards.double() - baseline.double()
    if cfg.scale_by_std:
        _, std, _ = group_mean_std(rewards, group_index)
        adv = adv / (std + cfg.adv_eps)
    return _per_token(adv, mask, token_rewards, cfg)


# ----------------------------------------------------------------------------------- with a critic: GAE, EGAE
class GAESettings(GroupNormSettings):
    """GAE: the discount, lambda and the optional whitening of the advantages."""

    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")


@ADVANTAGES.register(
    "gae",
    formula=(
        "delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1} over masked tokens, "
        "r_t = tr_t + r_i [t = last]; whitened over the batch's masked tokens if scale_by_std"
    ),
    paper="Schulman et al. 2016, High-Dimensional Continuous Control Using GAE (arXiv:1506.02438)",
    needs=("values",),
    settings=GAESettings,
)
def gae_advantage(
    rewards: Tensor, mask: Tensor, values: Tensor | None, cfg: GAESettings, token_rewards: Tensor | None = None
) -> Tensor:
    """GAE advantage with a critic (PPO with a value model).

    The per-token reward is r_t = tr_t (``token_rewards``, 0 if absent) plus the outcome reward r_i
    on the last masked token of row i; A = ``gae_advantages_and_returns(r, values, mask, cfg.gamma,
    cfg.lam)[0]``. With ``cfg.scale_by_std`` the advantages are whitened over all masked tokens of
    the batch: A_t <- (A_t - mean) / (std + cfg.adv_eps) (population std). Groups are not used.
    Requires ``values`` (``ValueError`` without). The returns for the value loss are obtained by
    calling ``gae_advantages_and_returns`` directly.
    """
    if values is None:
        raise ValueError("advantage 'gae' needs values= (critic values per token, shape [N, T])")
    r = outcome_token_rewards(rewards, mask, token_rewards)
    adv, _ = gae_advantages_and_returns(r, values.detach().to(torch.float64), mask, float(cfg.gamma), float(cfg.lam))
    if cfg.scale_by_std:
        adv = _masked_whiten(adv, mask, cfg.adv_eps)
    return (adv * (mask != 0)).to(mask.dtype)


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
    """T-PPO's Extended GAE; whitened over the batch's masked tokens with ``cfg.scale_by_std``.
    ``continues`` [N] (bool): the rows whose generation goes on in a later step (None: every row ends, and
    this is ``gae``).

    A row whose generation ``continues`` (cut by a window of T-PPO's truncated rollouts, finished in a later
    step) has no outcome reward yet and no terminal state: its last state s_l is not the end of the episode.
    EGAE takes the value after the window to be the value at its last token, V(s_l) = V(s_{l-1}) (the
    paper's assumption), so the last TD residual of such a row is

        delta_{l-1} = r_{l-1} + gamma V(s_{l-1}) - V(s_{l-1})         (r: per-token rewards only, no outcome)

    and A_t = sum_k (gamma lam)^k delta_{t+k} over the window, as GAE. A row that ends (EOS, stop string or
    the total length limit) is plain GAE: its outcome reward on its last token, V = 0 after it.
    """
    if values is None:
        raise ValueError("advantage 'egae' needs values= (critic values per token, shape [N, T])")
    r = egae_token_rewards(rewards, mask, values, float(cfg.gamma), continues, token_rewards)
    adv, _ = gae_advantages_and_returns(r, values.detach().to(torch.float64), mask, float(cfg.gamma), float(cfg.lam))
    if cfg.scale_by_std:
        adv = _masked_whiten(adv, mask, cfg.adv_eps)
    return (adv * (mask != 0)).to(mask.dtype)
