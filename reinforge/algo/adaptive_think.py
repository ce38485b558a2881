"""AutoThink's stage-wise reward shaping for adaptive thinking (Tu et al. 2025, "Learning When to Think:
Shaping Adaptive Reasoning in R1-Style Models via Multi-Stage RL", arXiv:2505.10832; registered in
``REWARD_SHAPERS`` as ``autothink``; docs/algorithms.md, "Length and budget control").

A response either *thinks* or answers at once (*no-think*). With the ellipsis prompt (the
``autothink_ellipsis`` group sampler appends ``<think>\\n...\\n`` to the prompt) an R1-style model
either closes the thinking block at once (``</think>`` first: no-think) or goes on thinking.
``think_flags`` classifies a response by its text: by default it is no-think when it starts with
``no_think_prefix`` (leading whitespace ignored), as the authors' code does; with ``think_marker`` set,
it thinks when the marker occurs in it (e.g. ``=`` for working written before an arithmetic answer,
for a model that has no think tags).

The reward replaces the verifier's (the term added is the difference), in three stages:

1. naive reward R(think, correct): think 1 / 0, no-think 2 / -1 (correct / wrong), then the batch-level
   balance: with p the batch's fraction of think (resp. no-think) responses and gamma the balance
   rate, lambda = clip(k (p - gamma), 0, 1), and every response of the over-represented mode moves
   toward its penalised target: r <- (1 - lambda) r + lambda r_target (think: 0 / -1, no-think: 1 / -2);
2. the naive reward alone (gamma = 1: no balance);
3. plus the length-aware terms within each group: a correct response gets exp(-alpha z) - 1, a wrong one
   1 - exp(-beta z), z the length's z-score among the group's correct (resp. wrong) responses
   (unbiased std, at least 1e-6; only where the group has two or more of them).

The formulas and constants are the authors' code's (``RewardManager._reweight_rewards`` in
``verl/trainer/main_ppo.py``, ``RewardConfig`` in ``deepscaler/rewards/reward_types.py``, the stage
scripts' ``batch_balance_rate`` 0.5 / 1 / 1 and ``reward_alpha = reward_beta`` 0 / 0 / 0.05).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.groups import dense_groups, group_reduce
from reinforge.algo.length_shapers import correctness
from reinforge.algo.shaping import REWARD_SHAPERS, Shaping
from reinforge.registry import Settings

AUTOTHINK = ("Tu et al. 2025, Learning When to Think: Shaping Adaptive Reasoning in R1-Style Models via "
             "Multi-Stage RL (AutoThink, arXiv:2505.10832; constants from the authors' code)")
STAGE_BALANCE = {1: 0.5, 2: 1.0, 3: 1.0}  # the stage scripts' batch_balance_rate
STAGE_LENGTH = {1: 0.0, 2: 0.0, 3: 0.05}  # the stage scripts' reward_alpha = reward_beta


class AutoThinkSettings(Settings):
    stage: Literal[1, 2, 3] = Field(1, description="AutoThink stage: 1 naive reward + batch balance, 2 naive "
                                    "reward, 3 naive reward + length-aware terms")
    balance_rate: float | None = Field(None, ge=0, le=1, description="gamma, the mode fraction above which "
                                       "the batch balance acts (default: 0.5 in stage 1, 1 = off otherwise)")
    slope: float = Field(2.0, ge=0, description="k, lambda = clip(k (p - gamma), 0, 1) (the code's penalty_slope)")
    alpha: float | None = Field(None, ge=0, description="length weight on correct responses (default: 0.05 in "
                                "stage 3, 0 otherwise)")
    beta: float | None = Field(None, ge=0, description="length weight on wrong responses (default as alpha)")
    think_correct: float = 1.0
    think_wrong: float = 0.0
    no_think_correct: float = 2.0
    no_think_wrong: float = -1.0
    no_think_prefix: str = Field("</think>", min_length=1, description="a response starting with this (leading "
                                 "whitespace ignored) is no-think")
    think_marker: str | None = Field(None, min_length=1, description="if set, a response thinks iff it "
                                     "contains this (replaces no_think_prefix)")


def think_flags(texts: tuple[str, ...] | list[str], cfg: AutoThinkSettings) -> Tensor:
    """[N] bool: does each response think (module docstring)."""
    if cfg.think_marker is not None:
        return torch.tensor([cfg.think_marker in t for t in texts], dtype=torch.bool)
    return torch.tensor([not t.lstrip().startswith(cfg.no_think_prefix) for t in texts], dtype=torch.bool)


def naive_reward(think: Tensor, ok: Tensor, cfg: AutoThinkSettings) -> Tensor:
    """R(think, correct) [N], float64."""
    on_think = torch.where(ok, cfg.think_correct, cfg.think_wrong)
    off = torch.where(ok, cfg.no_think_correct, cfg.no_think_wrong)
    return torch.where(think, on_think, off).to(torch.float64)


def length_terms(lengths: Tensor, ok: Tensor, group_index: Tensor, alpha: float, beta: float) -> Tensor:
    """Stage 3 [N]: exp(-alpha z) - 1 for a correct response, 1 - exp(-beta z) for a wrong one, z the length's
    z-score among the group's responses of the same correctness (0 where there are fewer than two)."""
    gid, n_groups = dense_groups(group_index)
    out = torch.zeros(lengths.shape, dtype=torch.float64)
    if n_groups == 0:
        return out
    length = lengths.to(torch.float64)
    for side in (True, False):
        rows = ok == side
        cell = torch.where(rows, gid, torch.full_like(gid, n_groups))  # the other side in a spare cell
        count = group_reduce(rows.to(torch.float64), cell, n_groups + 1, "sum")
        mean = group_reduce(torch.where(rows, length, 0.0), cell, n_groups + 1, "sum") / count.clamp(min=1)
        sq = group_reduce(torch.where(rows, (length - mean) ** 2, 0.0), cell, n_groups + 1, "sum")
        std = (sq / (count - 1).clamp(min=1)).sqrt().clamp(min=1e-6)
        z = (length - mean) / std
        term = torch.exp(-alpha * z) - 1 if side else 1 - torch.exp(-beta * z)
        out = torch.where(rows & (count > 1), term, out)
    return out


def balance(r: Tensor, think: Tensor, ok: Tensor, gamma: float, slope: float) -> Tensor:
    """Stage 1's batch balance [N]: the over-represented mode's rewards moved toward their targets
    (think: 0 / -1, no-think: 1 / -2, correct / wrong) by lambda = clip(k (p - gamma), 0, 1)."""
    if r.numel() == 0:
        return r
    for mode, targets in ((True, (0.0, -1.0)), (False, (1.0, -2.0))):
        rows = think == mode
        lam = min(1.0, max(0.0, (rows.to(torch.float64).mean().item() - gamma) * slope))
        if lam > 0:
            target = torch.where(ok, targets[0], targets[1]).to(torch.float64)
            r = torch.where(rows, (1 - lam) * r + lam * target, r)
    return r


@REWARD_SHAPERS.register(
    "autothink",
    formula="r_i <- R(think_i, correct_i) (think 1 / 0, no-think 2 / -1); stage 3: + exp(-alpha z_i) - 1 if correct, "
            "+ 1 - exp(-beta z_i) if wrong (z: length z-score among the group's same-correctness rows); stage 1: "
            "the batch's over-represented mode r <- (1 - lam) r + lam r_target, lam = clip(k (p_mode - gamma), 0, 1)",
    paper=AUTOTHINK,
    settings=AutoThinkSettings,
)
def autothink(rewards: Tensor, lengths: Tensor, group_index: Tensor, texts: tuple[str, ...] | None,
              cfg: AutoThinkSettings, correct: Tensor | None = None) -> Shaping:
    """AutoThink's stage-wise reward (module docstring); it replaces the verifier's reward, so the term
    added is R_autothink - r. Order as in the authors' code: naive reward, length terms, then the balance.

    Departures: a response the code scores as a format error (no ``</think>``: 0) is scored here by the
    verifier's verdict like any other; correctness is ``correct`` (``rewards > 0`` when not given).
    """
    ok = correctness(correct, rewards)
    if texts is None or len(texts) != ok.numel():
        raise ValueError("autothink reads the responses' texts (ShapeInputs.texts), one per reward")
    think = think_flags(texts, cfg)
    r = naive_reward(think, ok, cfg)
    alpha = cfg.alpha if cfg.alpha is not None else STAGE_LENGTH[cfg.stage]
    beta = cfg.beta if cfg.beta is not None else STAGE_LENGTH[cfg.stage]
    if alpha > 0 or beta > 0:
        r = r + length_terms(lengths, ok, group_index, alpha, beta)
    gamma = cfg.balance_rate if cfg.balance_rate is not None else STAGE_BALANCE[cfg.stage]
    r = balance(r, think, ok, gamma, cfg.slope)
    return Shaping(reward=r - rewards.to(torch.float64))
