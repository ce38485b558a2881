"""Critic (value model) loss and diagnostics for PPO with GAE.

- ``clipped_value_loss``: per-token PPO value loss with clipping around the old values, as in
  OpenAI baselines' PPO2 (Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients",
  arXiv:2005.12729, discuss it as one of PPO's code-level optimisations).
- ``explained_variance``: 1 - Var[R - V] / Var[R], the standard critic-quality diagnostic.
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped value loss.

    V_clip = V_old + clamp(V - V_old, -clip, clip);
    l_t = 0.5 * max((V_t - R_t)^2, (V_clip_t - R_t)^2)   (clip > 0),
    l_t = 0.5 * (V_t - R_t)^2                             (clip = 0: no clipping).
    Taking the max makes the update pessimistic: once V has moved more than ``clip`` from V_old
    in the direction that already reduced the error, the clipped (constant) term dominates and the
    token stops contributing a gradient. ``returns`` and ``old_values`` are targets (no gradient
    should flow through them; the caller detaches). Aggregate ``loss`` with a mask, like the
    policy loss. Metric ``value_clip_frac``: 1 where the clip acts, i.e. |V - V_old| > clip and the
    clipped term is strictly the larger one (inside the range V_clip equals V up to rounding, which
    must not count as clipped).
    """
    if clip < 0:
        raise ValueError(f"value clip must be >= 0, got {clip}")
    unclipped = (values - returns) ** 2
    if clip == 0:
        return 0.5 * unclipped, {"value_clip_frac": torch.zeros_like(unclipped).detach()}
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (v_clipped - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped, clipped)
    with torch.no_grad():
        active = ((values - old_values).abs() > clip) & (clipped > unclipped)
        metrics = {"value_clip_frac": active.to(loss.dtype)}
    return loss, metrics


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """Explained variance of the returns by the values over the masked tokens.

    EV = 1 - Var[R - V] / Var[R] (population variances over tokens with mask != 0): 1 for a perfect
    critic, 0 for one that predicts a constant (the mean), negative for one worse than that.
    Returns 0.0 when Var[R] = 0 (including no masked token), where EV is undefined.
    """
    live = mask != 0
    r = returns.detach().to(torch.float64)[live]
    v = values.detach().to(torch.float64)[live]
    if r.numel() == 0:
        return 0.0
    var_r = r.var(unbiased=False)
    if var_r.item() == 0.0:
        return 0.0
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
