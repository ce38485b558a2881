"""Advantage estimators: rewards (and values) -> per-token advantages.

Signature of every estimator (registered in ``ADVANTAGES``)::

    fn(rewards: Tensor[N], group_index: Tensor[N] (long), mask: Tensor[N, T],
       values: Tensor[N, T] | None, cfg: AlgoConfig, *,
       token_rewards: Tensor[N, T] | None = None, baseline: Tensor[N] | None = None) -> Tensor[N, T]

``group_index[i]`` names the prompt that sequence ``i`` answers (its group); the result is zero
wherever ``mask`` is zero. ``values`` are critic values (needed by ``gae`` only).

``token_rewards`` are extra per-token rewards (e.g. ``-beta * KL`` when the KL penalty is placed in
the reward); only masked positions count. The outcome estimators (grpo, dr_grpo, rloo,
reinforce_pp_baseline, opo, remax) add to every masked token t its discounted return-to-go
``sum_{s >= t, m_s = 1} gamma^(k(s) - k(t)) tr_s`` (k counts masked tokens, so unmasked positions,
e.g. environment tokens between the model turns of a multi-turn episode, are skipped, not
discounted; ``gamma = cfg.gamma``); ``reinforce_pp`` and ``gae`` instead fold them into the per-token
return they normalise / bootstrap. ``baseline`` is a per-sequence baseline reward (the reward of the
greedy completion of the sequence's prompt), used by ``remax`` only.

All estimators compute in float64 and return ``mask.dtype``; without ``token_rewards`` the outcome
estimators give exactly the per-sequence advantage broadcast over the masked tokens.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from reinforge.registry import Registry, kind


class AdvantageFn(Protocol):
    def __call__(
        self,
        rewards: Tensor,
        group_index: Tensor,
        mask: Tensor,
        values: Tensor | None,
        cfg: Any,
        *,
        token_rewards: Tensor | None = None,
        baseline: Tensor | None = None,
    ) -> Tensor: ...


ADVANTAGES: Registry[AdvantageFn] = kind("advantage", Registry("advantage estimator"))


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


@ADVANTAGES.register(
    "grpo",
    formula="A_i = (r_i - mean_g(r)) / (std_g(r) + eps)  [std scaling optional], broadcast to every token",
    paper="Shao et al. 2024, DeepSeekMath (arXiv:2402.03300)",
)
def grpo_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """Group-relative advantage (GRPO, outcome supervision).

    A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps), with the unbiased std;
    without ``cfg.scale_by_std`` only the mean is subtracted. Every token of sequence i gets A_i.
    A group of one sample, or one whose rewards are all equal, gets advantage 0.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, std, _ = group_mean_std(rewards, group_index)
    adv = rewards.to(torch.float64) - mean
    if cfg.scale_by_std:
        adv = adv / (std + cfg.adv_eps)
    return _per_token(adv, mask, token_rewards, cfg)


def turn_returns(turn_rewards: list[float], gamma: float) -> list[float]:
    """Discounted per-turn returns of one episode: G_k = sum_{m >= k} gamma^(m - k) r_m."""
    out, running = [0.0] * len(turn_rewards), 0.0
    for k in range(len(turn_rewards) - 1, -1, -1):
        running = turn_rewards[k] + gamma * running
        out[k] = running
    return out


@ADVANTAGES.register(
    "grpo_turn",
    formula="A_{i,t} = (G_{i,k(t)} - mean_g(G_{.,0})) / (std_g(G_{.,0}) + eps), G_{i,k} = sum_{m>=k} gamma^(m-k) r_{i,m}, "
            "k(t) = the turn of token t  [std scaling optional]",
    paper="turn-level credit for multi-turn agents, cf. Zeng et al. 2025 (arXiv:2505.11821); group baseline of "
          "Shao et al. 2024 (arXiv:2402.03300)",
    needs=("turn_returns",),
)
def grpo_turn_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
    turn_returns: Tensor | None = None,
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


def _per_token(adv: Tensor, mask: Tensor, token_rewards: Tensor | None = None, cfg: Any = None) -> Tensor:
    """Broadcast a per-sequence float64 advantage ``[N]`` to ``[N, T]``, zero where ``mask`` is 0.

    With ``token_rewards``, every masked token t also gets the discounted return-to-go of the token
    rewards, ``returns_to_go(token_rewards, mask, cfg.gamma)[t]`` (summed in float64).
    """
    if token_rewards is None:
        return adv.to(mask.dtype)[:, None] * mask
    rtg = returns_to_go(token_rewards.to(torch.float64), mask, _gamma(cfg))
    return ((adv[:, None] + rtg) * (mask != 0)).to(mask.dtype)


def _gamma(cfg: Any) -> float:
    return float(getattr(cfg, "gamma", 1.0))


def returns_to_go(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted return-to-go over the masked tokens of each row.

    G_t = sum_{s >= t, m_s = 1} gamma^(k(s) - k(t)) tr_s for masked t (0 where ``mask`` is 0), with
    k(s) the number of masked tokens before s: the discount counts masked tokens only, so masked
    positions may be non-contiguous (unmasked ones, e.g. environment tokens between model turns,
    are skipped: they neither contribute nor discount). Equivalently, over the masked positions in
    order, G_t = tr_t + gamma * G_next with G = 0 after the last one. Token rewards at unmasked
    positions are ignored. Computed in float64, returned in ``token_rewards.dtype``.
    """
    live = mask != 0
    tr = torch.where(live, token_rewards.to(torch.float64), 0.0)
    if gamma == 1.0:
        out = tr.flip(-1).cumsum(-1).flip(-1)
    else:
        out = torch.zeros_like(tr)
        running = tr.new_zeros(tr.shape[0])
        for t in range(tr.shape[-1] - 1, -1, -1):  # sequential recurrence over T, tensor ops over N
            running = torch.where(live[:, t], tr[:, t] + gamma * running, running)
            out[:, t] = running
    return torch.where(live, out, 0.0).to(token_rewards.dtype)


def last_token_onehot(mask: Tensor) -> Tensor:
    """Bool ``[N, T]``: True at the last position of each row where ``mask`` is nonzero (none if empty)."""
    live = mask != 0
    if live.shape[-1] == 0:
        return live
    t = live.shape[-1]
    last = t - 1 - live.flip(-1).to(torch.int8).argmax(-1)
    return (torch.arange(t, device=mask.device)[None, :] == last[:, None]) & live.any(-1, keepdim=True)


def outcome_token_rewards(rewards: Tensor, mask: Tensor, token_rewards: Tensor | None = None) -> Tensor:
    """Per-token rewards with the outcome reward on the last token, float64 ``[N, T]``.

    r_t = tr_t + r_i [t = last masked token of row i] at masked positions (tr = ``token_rewards``,
    0 if None), 0 elsewhere; a zero-length row is all zeros (its reward is nowhere). This is the
    ``token_level_rewards`` input of ``gae_advantages_and_returns`` used by the ``gae`` estimator.
    """
    live = mask != 0
    out = torch.where(last_token_onehot(mask), rewards.to(torch.float64)[:, None], 0.0)
    if token_rewards is not None:
        out = out + torch.where(live, token_rewards.to(torch.float64), 0.0)
    return out


def _masked_whiten(x: Tensor, mask: Tensor, eps: float) -> Tensor:
    """(x - mean) / (std + eps) over the masked entries (population std); 0 where ``mask`` is 0."""
    live = mask != 0
    mu, sigma = _batch_mean_std(x[live])
    return torch.where(live, (x - mu) / (sigma + eps), 0.0)


def _batch_mean_std(values: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and population (biased, divide-by-N) std of a 1-D float64 tensor; 0, 0 when empty."""
    if values.numel() == 0:
        zero = values.new_zeros(())
        return zero, zero
    mean = values.mean()
    return mean, ((values - mean) ** 2).mean().sqrt()


@ADVANTAGES.register(
    "dr_grpo",
    formula="A_i = r_i - mean_g(r)  [never std-scaled], broadcast to every token",
    paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO, arXiv:2503.20783)",
)
def dr_grpo_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """Dr. GRPO advantage: GRPO without the per-group std division.

    A_i = r_i - mean_{j in g(i)} r_j, every token of sequence i gets A_i. ``cfg.scale_by_std`` is
    ignored: removing the std (which up-weights near-uniform groups) is the point of Dr. GRPO.
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
)
def rloo_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """REINFORCE leave-one-out (RLOO) advantage.

    A_i = r_i - (1 / (|g| - 1)) sum_{j in g(i), j != i} r_j = |g| / (|g| - 1) * (r_i - mean_g r):
    each sample's baseline is the mean reward of the *other* samples of its prompt, which keeps
    the gradient estimate unbiased. A group of one has no other sample and gets advantage 0.
    No std scaling (``cfg.scale_by_std`` is ignored). Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, count = group_mean_std(rewards, group_index)
    factor = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.zeros_like(count))
    return _per_token(factor * (rewards.to(torch.float64) - mean), mask, token_rewards, cfg)


@ADVANTAGES.register(
    "reinforce_pp",
    formula=(
        "A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps)  [population std over all N sequences]; "
        "with token rewards: G_t = sum_{s>=t} gamma^(s-t) (tr_s + r_i [s = last]), "
        "A_t = (G_t - mean_tokens(G)) / (std_tokens(G) + eps)"
    ),
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262)",
)
def reinforce_pp_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """REINFORCE++ advantage: global batch normalisation of the outcome reward.

    A_i = (r_i - mu) / (sigma + eps), mu and sigma the mean and std of r over all N sequences of
    the batch (groups are ignored). sigma is the *population* std (divide by N, not N - 1): this
    standardises the batch itself, like batch normalisation, so the advantages have exactly zero
    mean and unit variance, and a batch of one is well defined (sigma = 0 -> A = 0), where the
    unbiased estimator would divide by zero. Every sequence counts once, including zero-length
    ones (the paper's implementation normalises over tokens; we weight by sequence, as the
    per-sequence reward is what is normalised). Normalisation is the estimator's definition, so
    ``cfg.scale_by_std`` is ignored; ``eps = cfg.adv_eps``. Every token of sequence i gets A_i.

    With ``token_rewards`` (e.g. the per-token KL penalty), the paper's token-level form is used:
    the outcome reward r_i is placed on the last masked token of sequence i, the per-token return
    G_t = returns_to_go(tr + r_i [t = last], mask, cfg.gamma) is computed, and A_t = (G_t - mu) /
    (sigma + eps) with mu, sigma the mean and population std of G over all masked tokens of the batch.
    """
    if token_rewards is not None:
        g = returns_to_go(outcome_token_rewards(rewards, mask, token_rewards), mask, _gamma(cfg))
        return _masked_whiten(g, mask, cfg.adv_eps).to(mask.dtype)
    r = rewards.to(torch.float64)
    mu, sigma = _batch_mean_std(r)
    return _per_token((r - mu) / (sigma + cfg.adv_eps), mask)


@ADVANTAGES.register(
    "reinforce_pp_baseline",
    formula=(
        "d_i = r_i - mean_g(r);  A_i = (d_i - mean_batch(d)) / (std_batch(d) + eps)  "
        "[population std over all N sequences]"
    ),
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262), REINFORCE++-baseline variant",
)
def reinforce_pp_baseline_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """REINFORCE++-baseline advantage: group-mean baseline, then global batch normalisation.

    d_i = r_i - mean_{j in g(i)} r_j, then A_i = (d_i - mu) / (sigma + eps) with mu, sigma the
    mean and population std (divide by N, as in ``reinforce_pp``) of d over all N sequences.
    Since every group's d sums to 0, mu is 0 up to rounding; it is subtracted anyway to follow
    the paper. Unlike GRPO the scale is shared by the whole batch, so a group with a small spread
    is not blown up. Singleton and equal-reward groups have d = 0 and so A = 0 (mu = 0).
    ``cfg.scale_by_std`` is ignored; ``eps = cfg.adv_eps``. Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, _ = group_mean_std(rewards, group_index)
    d = rewards.to(torch.float64) - mean
    mu, sigma = _batch_mean_std(d)
    return _per_token((d - mu) / (sigma + cfg.adv_eps), mask, token_rewards, cfg)


@ADVANTAGES.register(
    "opo",
    formula="b_g = sum_{j in g} l_j r_j / sum_{j in g} l_j  (l_j = generated tokens of j);  A_i = r_i - b_g",
    paper="Hao et al. 2025, On-Policy RL with Optimal reward baseline (OPO, arXiv:2505.23585)",
)
def opo_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """OPO advantage: group baseline weighted by response length (the optimal baseline).

    l_j = number of nonzero entries of ``mask[j]`` (its generated tokens), b_g = sum_{j in g} l_j r_j
    / sum_{j in g} l_j and A_i = r_i - b_g. Under the paper's assumption that token gradients are
    i.i.d., this baseline minimises the variance of the sequence-level policy gradient. A group
    whose lengths are all zero has no baseline and gets 0 (its tokens are all masked anyway). No
    std scaling (``cfg.scale_by_std`` is ignored). Every token of sequence i gets A_i.
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
    "remax",
    formula="A_i = r_i - r(greedy completion of prompt(i)), broadcast to every token (+ token-reward returns-to-go)",
    paper="Li et al. 2023, ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs (arXiv:2310.10505)",
    needs=("baseline",),
)
def remax_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """ReMax advantage: REINFORCE with the greedy completion's reward as baseline.

    A_i = r_i - b_i with b_i = ``baseline[i]``, the reward of the greedy (argmax-decoded) completion
    of sequence i's prompt; the baseline removes the prompt's difficulty from the return without
    a critic. No normalisation (``cfg.scale_by_std`` is ignored); groups are not used. Every token
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


@torch.no_grad()
def gae_advantages_and_returns(
    token_level_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation over the masked tokens of each row (Schulman et al. 2016).

    Over the masked positions t of a row in order, with V_next the value of the next masked
    position (0 after the last one):
    delta_t = r_t + gamma * V_next - V_t;  A_t = delta_t + gamma * lam * A_next;  R_t = A_t + V_t.
    Unmasked positions (e.g. environment tokens between model turns) are skipped: they carry the
    running quantities through and neither discount nor contribute. Both outputs are 0 where
    ``mask`` is 0 (a zero-length row is all zeros). No gradient flows (values are critic outputs;
    the returns are regression targets). Computed in float64, returned in ``values.dtype``.
    """
    live = mask != 0
    r = torch.where(live, token_level_rewards.to(torch.float64), 0.0)
    v = torch.where(live, values.to(torch.float64), 0.0)
    adv = torch.zeros_like(v)
    next_v = v.new_zeros(v.shape[0])
    next_a = v.new_zeros(v.shape[0])
    for t in range(v.shape[-1] - 1, -1, -1):  # sequential recurrence over T, tensor ops over N
        m = live[:, t]
        a = r[:, t] + gamma * next_v - v[:, t] + gamma * lam * next_a
        adv[:, t] = torch.where(m, a, 0.0)
        next_a = torch.where(m, a, next_a)
        next_v = torch.where(m, v[:, t], next_v)
    returns = torch.where(live, adv + v, 0.0)
    return adv.to(values.dtype), returns.to(values.dtype)


@ADVANTAGES.register(
    "gae",
    formula=(
        "delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1} over masked tokens, "
        "r_t = tr_t + r_i [t = last]; whitened over the batch's masked tokens if scale_by_std"
    ),
    paper="Schulman et al. 2016, High-Dimensional Continuous Control Using GAE (arXiv:1506.02438)",
    needs=("values",),
)
def gae_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    values: Tensor | None,
    cfg: Any,
    *,
    token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
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
