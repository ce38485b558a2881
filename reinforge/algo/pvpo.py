"""PVPO: a static per-prompt baseline from the reference policy (Feng et al. 2025, arXiv:2508.21104).

    A_i = r_i - V_ref(x_i),   V_ref(x) = mean_{j=1..N} r(x, y_j),  y_j ~ pi_ref(. | x)

V_ref is sampled once per prompt from the frozen reference policy (the loop's ``reference_value``
estimate, orchestrate/value_estimates.py, the machinery of A*-PO's V*: cached by task id, saved in
checkpoints) and handed in ``baseline``. The baseline does not move with the policy, so the advantage
keeps a signal when every sample of a group scores the same. Prompts all of whose reference samples
are correct are trivial and, with ``skip_solved``, kept out of the loss (the paper's pre-sampling filter).
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from reinforge.algo.advantages import ADVANTAGES, GroupNormSettings, group_mean_std
from reinforge.algo.returns import _per_token


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
    Raises ``ValueError`` without ``baseline``."""
    if baseline is None or baseline.shape != rewards.shape:
        raise ValueError("advantage 'pvpo' needs baseline= (V_ref per sequence, shape [N]): declared "
                         "reference_value, filled by the loop")
    adv = rewards.double() - baseline.double()
    if cfg.scale_by_std:
        _, std, _ = group_mean_std(rewards, group_index)
        adv = adv / (std + cfg.adv_eps)
    return _per_token(adv, mask, token_rewards, cfg)
