"""RePO's policy loss (Li et al. 2025, "RePO: Replay-Enhanced Policy Optimization", arXiv:2506.09340).

RePO's objective is J_on + J_off: GRPO's clipped surrogate over the fresh samples and the same
surrogate over the samples replayed from a per-prompt buffer (orchestrate/replay.py), each with the
ratio of the current policy to the policy that *sampled* the row,

    rho_t = pi_theta(a_t) / mu(a_t),   L_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t),

with mu the behaviour policy's token probability stored with the sample (``sampling_logp``: the
rollout engine's log-probs). For a fresh row mu is the policy of this update (rho = pi / pi_old up to
the engine's rounding); for a replayed row it is the older policy that drew it, so the clip bounds
how far an update moves on stale samples. The two sums are one aggregation here (the run's
``algo.loss_agg`` over every row): docs/strategies.md gives the choice.
"""

from __future__ import annotations

from torch import Tensor

from reinforge.algo.losses import POLICY_LOSSES, ClipSettings, ppo_clip_loss


@POLICY_LOSSES.register(
    "repo", formula="L_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t), rho_t = pi(a_t)/mu(a_t), "
    "mu the behaviour policy that sampled the row (fresh or replayed)",
    paper="Li et al. 2025, RePO: Replay-Enhanced Policy Optimization (arXiv:2506.09340)", settings=ClipSettings,
)
def repo_loss(logp: Tensor, sampling_logp: Tensor, advantages: Tensor, cfg: ClipSettings) -> tuple[Tensor, dict]:
    """PPO's clipped surrogate with the behaviour policy's log-probs in the ratio (module docstring);
    metrics as ``ppo_clip``'s (``ratio`` = pi / mu, ``approx_kl_old`` = k3 between mu and pi)."""
    return ppo_clip_loss(logp, sampling_logp, advantages, cfg)
