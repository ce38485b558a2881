"""KL penalties whose target or weight adapts to the rewards, and APO's length regulariser.

- ``kl_dads`` (loss term): APO's Difficulty-Adaptive Divergence Shaping, a per-sample KL weight from
  the accuracy of the sample's group; the correct (positive) samples of hard prompts are held less
  tightly to the reference.
- ``grpo_stcr`` (advantage): APO's Suboptimal Trajectory Complexity Regularization, the wrong
  (negative) samples longer than their group's correct ones get a larger negative advantage.
- ``rapo_kl`` (loss term): RAPO's forward KL to a reward-reweighted reference pi_ref^phi(r) / Z.
- ``kl_dynamic`` (loss term): GRPO-D's KL weight that follows a schedule over training, small early
  (the policy explores away from the reference) and growing later (it exploits, held close).

A part that reads group statistics in the loss declares ``whole_groups``: the learner then keeps every
group inside one mini-batch and one micro-batch, so the accuracy is the whole group's.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, GroupNormSettings, group_mean_std, grpo_advantage
from reinforge.algo.kl import KL_ESTIMATORS, kl_k3_fwd
from reinforge.algo.objective import LOSS_TERMS
from reinforge.registry import Settings

_APO = "Hong et al. 2025, APO: Enhancing Reasoning Ability of MLLMs via Asymmetric Policy Optimization (arXiv:2506.21655)"
_RAPO = ("Deng et al. 2025, Unlocking Reasoning Capabilities in LLMs via Reinforcement Learning Exploration "
         "(RAPO, arXiv:2510.03865)")


def group_accuracy(rewards: Tensor, group_index: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """(correct [N] bool: r_i >= threshold, acc [N]: the fraction correct in row i's group). Rows
    outside any group (group id < 0, e.g. a demonstration in a group of its own) get acc = their own
    correctness."""
    correct = rewards >= threshold
    acc = correct.to(torch.float64)
    grouped = group_index >= 0
    if grouped.any():
        mean, _, _ = group_mean_std(acc[grouped], group_index[grouped])
        acc = acc.clone()
        acc[grouped] = mean
    return correct, acc


class KLEstimatorSettings(Settings):
    """A KL term's choice of registered estimator."""

    estimator: str = Field("k3", description="the KL estimator weighed (a registered one: k1, k2, k3, k3_fwd, ...)")

    @field_validator("estimator")
    @classmethod
    def _registered(cls, v: str) -> str:
        if v not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {v!r}; allowed: {', '.join(KL_ESTIMATORS.names())}")
        return v


class DadsSettings(KLEstimatorSettings):
    """Options of APO's difficulty-adaptive KL weight."""

    correct_threshold: float = Field(1.0, description="a sample with reward >= this is correct (a positive sample)")
    sharpness: float = Field(math.e, gt=0, description="c of the weight f(d) = 1 - exp(-c (1 - d)); the "
                             "authors' code uses e")


def dads_weight(rewards: Tensor, group_index: Tensor, cfg: DadsSettings) -> Tensor:
    """w_i [N] (float64): 1 - exp(-c (1 - d_g)) for a correct sample of a group with some wrong ones,
    d_g = 1 - acc_g; 1 for every other sample (wrong ones, and groups all correct, where the code's
    f(0) = 1)."""
    correct, acc = group_accuracy(rewards, group_index, cfg.correct_threshold)
    difficulty = 1.0 - acc
    f = 1.0 - torch.exp(-cfg.sharpness * (1.0 - difficulty))
    return torch.where(correct & (difficulty > 0), f, torch.ones_like(f))


@LOSS_TERMS.register(
    "kl_dads",
    formula="+ beta * agg(w_i k(log pi, log pi_ref)); w_i = 1 - exp(-c (1 - d_g)) if r_i is correct and d_g > 0, "
            "else 1; d_g = 1 - acc_g (fraction of wrong samples in the group)",
    paper=_APO + "; Difficulty-Adaptive Divergence Shaping (DADS), weight function of the authors' code",
    needs=("ref_logp", "whole_groups"),
    settings=DadsSettings,
)
def kl_dads_term(logp: Tensor, ref_logp: Tensor, rewards: Tensor, group_index: Tensor,
                 cfg: DadsSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """APO's DADS: the KL penalty of each positive (correct) sample weighed by its prompt's difficulty.

    d_g = 1 - acc_g is the fraction of wrong samples in the group; a correct sample gets
    w = f(d) = 1 - exp(-c (1 - d)), c = e: 0.93 as d -> 0 (an easy prompt), 1 - exp(-c / G) when it is
    the group's only correct sample (0.29 for G = 8), so the policy may move away from the reference
    on what it rarely gets right and stays close where it is already good. Wrong samples, and every
    sample of an all-correct group (f(0) = 1 in the authors' code), keep w = 1. As in the code, the
    positive samples are the correct ones (for 0/1 rewards: those with a positive GRPO advantage) and
    k is the run's chosen estimator (k3 in the paper). The weight is per sequence, so with
    ``loss_agg: seq_mean_token_mean`` the term is the code's mean_i(w_i mean_t k_it).
    Metrics: ``kl_ref`` (the unweighted KL), ``kl_weight`` (w_i on every token).
    """
    kl = KL_ESTIMATORS.get(cfg.estimator)(logp, ref_logp)
    w = dads_weight(rewards, group_index, cfg).to(kl.dtype)[:, None]
    return w * kl, {"kl_ref": kl.detach(), "kl_weight": w.expand_as(kl)}


class StcrSettings(GroupNormSettings):
    """GRPO's options and APO's length regulariser."""

    stcr_rate: float = Field(1e-5, ge=0, description="kappa of the weight 2 - exp(-kappa dL) per token of excess "
                             "length; the authors' code: ln(1.00001) = 1e-5 (responses up to 4096 tokens)")
    correct_threshold: float = Field(1.0, description="a sample with reward >= this is correct")


@ADVANTAGES.register(
    "grpo_stcr",
    formula="A_i = v_i * A_i^grpo, v_i = 2 - exp(-kappa (L_i - mean_{j in g correct} L_j)) if i is wrong, its group "
            "has a correct sample and L_i exceeds their mean length, else 1",
    paper=_APO + "; Suboptimal Trajectory Complexity Regularization (STCR), as in the authors' code",
    settings=StcrSettings,
)
def grpo_stcr_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: StcrSettings,
                        token_rewards: Tensor | None = None) -> Tensor:
    """APO's STCR on top of the GRPO advantage: a wrong answer longer than the mean length of its
    group's correct answers (L = trained tokens) is pushed down harder, v = 2 - exp(-kappa dL) in
    [1, 2), so overlong wrong reasoning is penalised while short wrong answers (exploration) are not.
    A group with no correct answer has no reference length and is left as GRPO's (advantage 0 for
    0/1 rewards anyway). Since A_i < 0 for a wrong sample of a group with a correct one, v > 1
    makes it more negative. The multiplication applies to the whole advantage, token-reward
    returns included, as in the code."""
    adv = grpo_advantage(rewards, group_index, mask, cfg, token_rewards).to(torch.float64)
    correct, acc = group_accuracy(rewards, group_index, cfg.correct_threshold)
    lengths = mask.sum(-1).to(torch.float64)
    grouped = group_index >= 0
    excess = torch.zeros_like(lengths)
    if grouped.any():
        gi = group_index[grouped]
        n = int(gi.max()) + 1
        ok = correct[grouped].to(torch.float64)
        total = torch.zeros(n, dtype=torch.float64).index_add_(0, gi, ok * lengths[grouped])
        count = torch.zeros(n, dtype=torch.float64).index_add_(0, gi, ok)
        excess[grouped] = lengths[grouped] - total[gi] / count[gi].clamp(min=1)
    apply = ~correct & (acc > 0) & (excess > 0)
    v = torch.where(apply, 2.0 - torch.exp(-cfg.stcr_rate * excess), torch.ones_like(excess))
    return (adv * v[:, None]).to(mask.dtype)


class RapoSettings(Settings):
    """Options of RAPO's reweighted reference."""

    phi_min: float = Field(0.5, ge=0, le=1, description="phi(r) at r <= 0: the exponent of pi_ref for a wrong "
                           "sample (0: a uniform target, 1: pi_ref itself)")


def rapo_phi(rewards: Tensor, cfg: RapoSettings) -> Tensor:
    """phi(r) = phi_min + (1 - phi_min) clip(r, 0, 1) [N]: increasing in r, 1 for a correct sample."""
    return cfg.phi_min + (1.0 - cfg.phi_min) * rewards.to(torch.float64).clamp(0.0, 1.0)


@LOSS_TERMS.register(
    "rapo_kl",
    formula="+ alpha * agg(k3_fwd(log pi, phi(r_i) log pi_ref)), phi(r) = phi_min + (1 - phi_min) clip(r, 0, 1): "
            "forward KL to pi_ref^phi(r) / Z",
    paper=_RAPO + "; forward KL to the reward-reweighted reference; phi is this project's choice",
    needs=("ref_logp",),
    settings=RapoSettings,
)
def rapo_kl_term(logp: Tensor, ref_logp: Tensor, rewards: Tensor, cfg: RapoSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """RAPO's penalty alpha KL(pi_ref_hat || pi), pi_ref_hat(y|x) = pi_ref(y|x)^phi(r(x, y)) / Z: the
    forward KL (mass-covering: pi must keep mass wherever the target has some, so it may also spread
    beyond it) to a reference that is pi_ref itself for a correct sample and flattened toward uniform
    for a wrong one, which frees the policy to explore away from the reference's modes there.

    Per token, with log rho~ = phi_i log pi_ref(y_t) - log pi(y_t), the value and gradient are
    ``k3_fwd``'s: rho~ log rho~ - (rho~ - 1), gradient (1 - rho~) grad log pi. The normaliser
    Z_t = sum_v pi_ref(v)^phi is left out (it needs the reference's whole distribution, the learner has
    only the sampled token's log-prob): the expected gradient is then -sum_v pi_ref(v)^phi grad log pi(v)
    = Z_t grad KL(pi_ref_hat || pi), the exact forward-KL direction scaled by Z_t in [1, |V|^(1-phi)],
    and the value is the generalised KL of the unnormalised target (>= 0, 0 iff pi = pi_ref at
    phi = 1). phi(r) = phi_min + (1 - phi_min) clip(r, 0, 1) is this project's choice: the paper's
    phi is monotone in the reward, maps to [0, 1] and flattens the reference for low rewards, which
    this reproduces. Metrics: ``kl_fwd`` (the term's value), ``rapo_phi``.
    """
    phi = rapo_phi(rewards, cfg).to(logp.dtype)[:, None]
    kl = kl_k3_fwd(logp, phi * ref_logp)
    return kl, {"kl_fwd": kl.detach(), "rapo_phi": phi.expand_as(kl)}


_OTHINK = ("Liu et al. 2025, OThink-MR1: Stimulating multimodal generalized reasoning capabilities via dynamic "
           "reinforcement learning (GRPO-D, arXiv:2503.16081)")


class KLScheduleController:
    """GRPO-D's clock: the number of updates s done so far, and the KL weight beta(s) it gives."""

    def __init__(self, settings: KLScheduleSettings) -> None:
        self.settings = settings
        self.step = 0

    def beta(self) -> float:
        """beta(s) = beta_start + (beta_end - beta_start) ramp(min(s / horizon, 1)); ramp(x) = x (linear) or
        (1 - cos(pi x)) / 2 (cosine)."""
        s = self.settings
        x = min(self.step / s.horizon, 1.0)
        ramp = x if s.shape == "linear" else 0.5 * (1.0 - math.cos(math.pi * x))
        return s.beta_start + (s.beta_end - s.beta_start) * ramp

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        """After an update: s advances; reports the weight the next update uses."""
        self.step += 1
        return {"kl_dynamic/beta": self.beta()}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class KLScheduleSettings(KLEstimatorSettings):
    """GRPO-D's schedule: the KL weight at the start and the end of ``horizon`` updates, and the ramp's shape."""

    controller: ClassVar[type] = KLScheduleController
    beta_start: float = Field(0.0, ge=0, description="KL weight at the first update (small: explore)")
    beta_end: float = Field(0.04, ge=0, description="KL weight from update ``horizon`` on (larger: exploit)")
    horizon: int = Field(100, ge=1, description="updates over which the weight moves from beta_start to beta_end "
                         "(set it to the run's train.steps)")
    shape: Literal["linear", "cosine"] = Field("linear", description="the ramp between them: linear, or cosine "
                                               "(slow at both ends)")


@LOSS_TERMS.register(
    "kl_dynamic",
    formula="+ beta(s) * agg(k(log pi, log pi_ref)), beta(s) = beta_0 + (beta_1 - beta_0) ramp(min(s / S, 1)), "
            "s = updates done, ramp linear or cosine",
    paper=_OTHINK + "; the dynamic KL strategy, its ramp is this project's",
    needs=("ref_logp",),
    settings=KLScheduleSettings,
)
def kl_dynamic_term(logp: Tensor, ref_logp: Tensor, cfg: KLScheduleController) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO-D's dynamic KL: the KL penalty to the reference with a weight that changes over training,
    beta_start (small) at the first update rising to beta_end over ``horizon`` updates, so the policy may
    move away from the reference early (exploration) and is held close later (exploitation), instead of
    GRPO's constant beta. The term's own ``coef`` multiplies beta(s) (leave it at 1). The clock counts the
    learner's updates (one a training step) and is saved with checkpoints. k is the chosen estimator
    (k3, GRPO's, by default). Choices: the paper gives the direction (a low KL weight early, a higher one
    late); the linear and cosine ramps and the default weights are this
    project's. Metrics: ``kl_ref`` (the unweighted KL), ``kl_dynamic/beta`` (after each update)."""
    kl = KL_ESTIMATORS.get(cfg.settings.estimator)(logp, ref_logp)
    return cfg.beta() * kl, {"kl_ref": kl.detach()}
