"""VinePPO's advantage: Monte Carlo values of intermediate states instead of a critic (Kazemnejad et
al. 2024, "VinePPO: Refining Credit Assignment in RL Training of LLMs", arXiv:2410.01679).

A completion is cut into steps (the paper: its lines) at cut points p_0 < p_1 < ... < p_{m-1}, p_0
its first generated token; s_k = y_<p_k is the state (prompt and the tokens before p_k) that step k
acts from. The loop (orchestrate/state_values.py) samples K continuations of every s_k with the
current policy, scores them with the run's reward and gives the mean as V(s_k). Step k's advantage
is the one-step temporal difference of these values (gamma = 1, the only reward the outcome R at
the end, the value of the terminal state 0), and every token of the step gets it:

    A_t = r_k + V(s_{k+1}) - V(s_k)   for t in step k;  V(s_m) = 0 (terminal), r_k = R [k = m - 1], else 0

so the last step gets R - V(s_{m-1}). The paper whitens the advantages over the batch's tokens
(``whiten``, on by default). The loop hands the values as two [N, T] context fields:
``state_values`` (V(s_k) at position p_k, 0 elsewhere) and ``state_mask`` (1 at the p_k). A row
without any estimated state (e.g. a demonstration; or every row, when no values are given) gets A_t = R.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.returns import _masked_whiten
from reinforge.registry import Settings


class VineSettings(Settings):
    """K, how a completion is cut into steps, and the whitening (the loop reads the first four)."""

    rollouts: int = Field(9, ge=1, description="K: continuations sampled from each state for its Monte Carlo "
                          "value (the paper: 9)")
    step_split: Literal["newline", "tokens"] = Field(
        "newline", description="where steps end: after each line of the completion (newline, the paper's), or "
        "every step_tokens generated tokens (tokens: for completions without lines)")
    step_tokens: int = Field(1, ge=1, description="tokens per step with step_split: tokens")
    max_cuts: int = Field(20, ge=0, description="at most this many intermediate states per completion are "
                          "estimated (the first ones; the rest of the completion is one step, the paper's "
                          "cap: 20 on MATH, 25 on GSM8K); the prompt's state is always estimated")
    whiten: bool = Field(True, description="whiten the advantages over the batch's tokens (the paper's)")
    adv_eps: float = Field(1e-6, gt=0, description="epsilon added to the std when whitening")


def step_values(rewards: Tensor, mask: Tensor, state_values: Tensor, state_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(V(s_k), r_k + V(s_{k+1})) at every position t of step k, each [N, T] float64: the value of the
    last estimated state at or before t (0 if none), and the value of the first one after t (the
    outcome ``rewards`` [N] when there is none: the step ends the completion)."""
    n, width = mask.shape
    values = state_values.to(torch.float64)
    pos = torch.arange(width, device=mask.device).expand(n, width)
    is_state = state_mask != 0
    last = torch.where(is_state, pos, -1).cummax(dim=1).values
    before = torch.where(last >= 0, values.gather(1, last.clamp(min=0)), 0.0)
    first_from = torch.where(is_state, pos, width).flip(1).cummin(dim=1).values.flip(1)  # first state at >= t
    after_t = torch.cat([first_from[:, 1:], first_from.new_full((n, 1), width)], dim=1)  # first state at > t
    outcome = rewards.to(torch.float64)[:, None].expand(n, width)
    after = torch.where(after_t < width, values.gather(1, after_t.clamp(max=width - 1)), outcome)
    return before, after


@ADVANTAGES.register(
    "vineppo",
    formula="A_t = r_k + V(s_{k+1}) - V(s_k) for every token t of step k, V(s) = mean reward of K continuations "
            "of state s by the current policy, V(terminal) = 0, r_k = R at the last step else 0; whitened over "
            "the batch's tokens",
    paper="Kazemnejad et al. 2024, VinePPO (arXiv:2410.01679)",
    needs=("state_values", "ungrouped"),
    settings=VineSettings,
)
def vineppo_advantage(rewards: Tensor, mask: Tensor, cfg: VineSettings, state_values: Tensor | None = None,
                      state_mask: Tensor | None = None) -> Tensor:
    """VinePPO's per-step temporal difference of Monte Carlo values (module docstring), per token."""
    if state_values is None or state_mask is None:  # no state estimated anywhere: A_t = R
        state_values = state_mask = torch.zeros_like(mask)
    before, after = step_values(rewards, mask, state_values, state_mask)
    live = mask != 0
    adv = torch.where(live, after - before, 0.0)
    if cfg.whiten:
        adv = _masked_whiten(adv, mask, cfg.adv_eps)
    return adv.to(mask.dtype)
