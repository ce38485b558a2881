"""Returns and normalisations the advantage estimators share: discounted returns-to-go over masked tokens,
per-turn returns, the outcome reward as a per-token reward, GAE, batch whitening. Pure float64 tensor math."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def turn_returns(turn_rewards: list[float], gamma: float) -> list[float]:
    """Discounted per-turn returns of one episode: G_k = sum_{m >= k} gamma^(m - k) r_m."""
    out, running = [0.0] * len(turn_rewards), 0.0
    for k in range(len(turn_rewards) - 1, -1, -1):
        running = turn_rewards[k] + gamma * running
        out[k] = running
    return out


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


def episode_rows(ends: Tensor) -> tuple[Tensor, Tensor, int, int]:
    """Time-major trajectories cut at their episode ends, laid out as rows of the [N, T] convention.

    ``ends`` [E, T] (bool) marks the last step of an episode (termination, truncation or the end of
    the collected segment) in each of E environments' T steps. Every segment between ends becomes its
    own row, so the row estimators (``gae_advantages_and_returns``, ``vtrace_returns``) see episode
    ends as row ends. Returns (row [E, T], col [E, T], n_rows, width): step (e, t) sits at
    ``[row[e, t], col[e, t]]`` of an [n_rows, width] layout; ``x_rows = zeros(n_rows, width);
    x_rows[row, col] = x`` lays a tensor out, ``y_rows[row, col]`` reads it back.
    """
    e, t = ends.shape
    ends = ends.to(torch.bool)
    seg = torch.cumsum(ends.to(torch.int64), 1) - ends.to(torch.int64)  # segments ended before step t
    per_env = seg[:, -1] + 1 if t else torch.zeros(e, dtype=torch.int64)
    row = (torch.cumsum(per_env, 0) - per_env)[:, None] + seg
    starts = torch.zeros_like(ends)
    starts[:, :1] = True
    starts[:, 1:] = ends[:, :-1]
    steps = torch.arange(t).expand(e, t)
    col = steps - torch.cummax(torch.where(starts, steps, 0), dim=1).values
    width = int(col.max()) + 1 if col.numel() else 0
    return row, col, int(per_env.sum()), width
