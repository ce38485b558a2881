"""The policy's entropy and the stateful entropy terms: EPO's smoothed entropy regularisation, AEnt's
adaptively weighted entropy bonus (AEPO's clipped loss is a policy loss: ``algo/policy_losses.py``).

The two loss terms keep state across updates (a historical entropy average, a coefficient). Their
settings declare a ``controller`` class (``algo.objective.term_controllers``): the learner builds one
per run from the settings, passes it to the term as its ``cfg`` (``cfg.settings`` are the options),
calls ``update(metrics)`` after every update with the update's metrics (``entropy``: the mean
per-token entropy of the sampled rows over the update's forwards) and saves ``state_dict()`` in
checkpoints, so a resumed run continues with the same state.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from pydantic import Field, model_validator
from torch import Tensor

from reinforge.algo.objective import LOSS_TERMS
from reinforge.registry import Settings


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy H = logsumexp(z) - sum_v softmax(z)_v z_v of the distribution softmax(z)
    (in float32 at least: half-precision logits are upcast, float64 stays float64)."""
    logp = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


# --------------------------------------------------------------------------------------------- EPO
class EPOController:
    """EPO's state: the historical average entropy H_bar (the mean of the past updates' entropies)
    and the update count k of the phase-based weight beta_k."""

    def __init__(self, settings: EPOSettings) -> None:
        self.settings = settings
        self.step = 0
        self.entropy_sum = 0.0
        self.count = 0

    @property
    def history(self) -> float | None:
        """H_bar, the mean entropy of the updates so far (None before the first)."""
        return self.entropy_sum / self.count if self.count else None

    def weight(self) -> float:
        """beta_k: 1 -> 0.8 over the first half of ``horizon`` updates (slow exponential, rate
        ``lambda_slow``), then 0.8 -> ~0 over the second (fast, rate ``gamma``); 0.8 e^-gamma after."""
        s = self.settings
        k, half = min(self.step, s.horizon), s.horizon // 2
        if k <= half:
            return 1.0 - 0.2 * (1.0 - math.exp(-s.lambda_slow * k / max(half, 1)))
        return 0.8 * math.exp(-s.gamma * (k - half) / max(s.horizon - half, 1))

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        """After an update: its mean entropy joins the history, k advances."""
        if "entropy" in metrics:
            self.entropy_sum += float(metrics["entropy"])
            self.count += 1
        self.step += 1
        return {"epo/entropy_history": self.history or 0.0, "epo/smooth_weight": self.weight()}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "entropy_sum": self.entropy_sum, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.entropy_sum, self.count = int(state["step"]), float(state["entropy_sum"]), int(state["count"])


class EPOSettings(Settings):
    """EPO's smoothing band, its weight and the phase schedule's horizon and rates."""

    controller: ClassVar[type] = EPOController
    smooth_coef: float = Field(1.0, ge=0, description="weight of the smoothing penalty against the entropy bonus")
    kappa_low: float = Field(0.8, ge=0, description="lower edge of the band: kappa_low * H_bar (0 = no lower edge)")
    kappa_high: float = Field(1.2, gt=0, description="upper edge of the band: kappa_high * H_bar")
    horizon: int = Field(150, ge=1, description="updates over which the phase weight beta_k decays")
    lambda_slow: float = Field(2.0, ge=0, description="rate of beta_k's slow first phase (1 -> 0.8)")
    gamma: float = Field(3.0, ge=0, description="rate of beta_k's fast second phase (0.8 -> 0)")

    @model_validator(mode="after")
    def _band(self) -> EPOSettings:
        if self.kappa_low >= self.kappa_high:
            raise ValueError(f"kappa_low ({self.kappa_low}) must be below kappa_high ({self.kappa_high})")
        return self


@LOSS_TERMS.register(
    "epo_entropy",
    formula=("- c * agg(H_t - c_s beta_k P_t), P_t = |H_t - H_bar| if H_t outside [kappa_l H_bar, kappa_r H_bar] "
             "else 0, H_bar = mean past entropy, beta_k = phase weight"),
    paper="Xu et al. 2025, EPO: Entropy-regularized Policy Optimization for LLM Agents Reinforcement Learning "
          "(arXiv:2509.22576)",
    settings=EPOSettings,
)
def epo_entropy_term(entropy: Tensor, cfg: EPOController) -> tuple[Tensor, dict[str, Tensor]]:
    """EPO's entropy regularisation with its smoothing regulariser: the entropy bonus over every
    trained token of the trajectory (all turns), minus a penalty on the tokens whose entropy left the
    band [kappa_low H_bar, kappa_high H_bar] around the historical average H_bar, weighted by the
    phase weight beta_k (strong early, decaying late). Per token: -H_t + c_s beta_k P_t.
    Choices: the released code marks out-of-band tokens with a constant penalty, which carries no
    gradient; we take the distance |H_t - H_bar| outside the band, so the penalty pulls the entropy
    back into it (zero inside, as in the paper). The code keeps H_bar per turn index of the episode;
    the context has no turn index, so H_bar is one average over all trained tokens of the past
    updates. No penalty before the first update (no history). Metric ``epo/out_of_band``."""
    s, hist = cfg.settings, cfg.history
    if hist is None:
        return -entropy, {"epo/out_of_band": torch.zeros_like(entropy.detach())}
    outside = (entropy < s.kappa_low * hist) | (entropy > s.kappa_high * hist)
    penalty = torch.where(outside, (entropy - hist).abs(), torch.zeros_like(entropy))
    return -entropy + s.smooth_coef * cfg.weight() * penalty, {"epo/out_of_band": outside.detach().to(entropy.dtype)}


# -------------------------------------------------------------------------------------------- AEnt
class AdaptiveEntropyController:
    """AEnt's coefficient alpha, moved after each update toward keeping the entropy in [low, high]."""

    def __init__(self, settings: AdaptiveEntropySettings) -> None:
        self.settings = settings
        self.coef = settings.init_coef

    metric = "entropy"  # the batch mean the coefficient follows (the clamped term's own, below)

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        """alpha <- clip(alpha + delta [H < low] - delta [H > high], alpha_min, alpha_max)."""
        s, h = self.settings, metrics.get(self.metric)
        if h is not None:
            step = s.delta if h < s.low else -s.delta if h > s.high else 0.0
            self.coef = min(max(self.coef + step, s.coef_min), s.coef_max)
        return {"aent/coef": self.coef}

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef = float(state["coef"])


class AdaptiveEntropySettings(Settings):
    """AEnt's entropy band and the coefficient's start, step and bounds."""

    controller: ClassVar[type] = AdaptiveEntropyController
    init_coef: float = Field(1e-3, ge=0, description="initial entropy coefficient alpha_0")
    delta: float = Field(1e-4, ge=0, description="step of alpha per update")
    low: float = Field(0.2, ge=0, description="entropy below which alpha grows")
    high: float = Field(1.0, ge=0, description="entropy above which alpha shrinks")
    coef_min: float = Field(0.0, ge=0, description="lower bound of alpha")
    coef_max: float = Field(1e-2, ge=0, description="upper bound of alpha")

    @model_validator(mode="after")
    def _bounds(self) -> AdaptiveEntropySettings:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if not self.coef_min <= self.init_coef <= self.coef_max:
            raise ValueError(f"init_coef ({self.init_coef}) must lie in [coef_min, coef_max]")
        return self


@LOSS_TERMS.register(
    "adaptive_entropy",
    formula="- agg(alpha_k H_t), alpha_{k+1} = clip(alpha_k + delta [H < H_low] - delta [H > H_high], alpha_min, alpha_max)",
    paper="Shen 2025, On Entropy Control in LLM-RL Algorithms (AEnt) (arXiv:2509.03493)",
    settings=AdaptiveEntropySettings,
)
def adaptive_entropy_term(entropy: Tensor, cfg: AdaptiveEntropyController) -> tuple[Tensor, dict[str, Tensor]]:
    """AEnt's automatically adjusted entropy bonus: -alpha_k H_t per token, alpha_k moved by ``delta``
    after each update toward keeping the batch entropy inside [low, high], within [coef_min, coef_max]
    (give the term ``coef: 1``; alpha is the coefficient). AEnt evaluates H on the re-normalised
    policy over the top tokens (the clamped entropy); the learner's forwards give the full-vocabulary
    entropy only, so H is the full one here; ``clamped_entropy`` is the same term on the clamped
    entropy (it needs the full-vocabulary rows)."""
    return -cfg.coef * entropy, {}


class ClampedEntropyController(AdaptiveEntropyController):
    """AEnt's coefficient, following the batch mean of the clamped entropy."""

    metric = "aent/clamped_entropy"


class ClampedEntropySettings(AdaptiveEntropySettings):
    """AEnt's coefficient settings and the clamp: the fraction of the vocabulary left out."""

    controller: ClassVar[type] = ClampedEntropyController
    clamp_p: float = Field(0.3, ge=0, lt=1, description="fraction p of the vocabulary, the floor(p V) least "
                           "probable tokens of each position, left out of the clamped entropy")


def clamped_entropy(logp_vocab: Tensor, clamp_p: float) -> Tensor:
    """H^c_t = -sum_{v in K_t} q_t(v) log q_t(v), q_t = pi_t re-normalised on K_t, the V - floor(p V) most
    probable tokens at t (the set K_t carries no gradient; q_t does). [N, T, V] -> [N, T]."""
    k = int(logp_vocab.shape[-1] * clamp_p)
    if k == 0:
        drop = torch.zeros_like(logp_vocab, dtype=torch.bool)
    else:
        with torch.no_grad():
            lowest = torch.topk(logp_vocab, k, dim=-1, largest=False).indices
            drop = torch.zeros_like(logp_vocab, dtype=torch.bool).scatter_(-1, lowest, True)
    kept = logp_vocab.masked_fill(drop, float("-inf"))
    log_q = kept - torch.logsumexp(kept, dim=-1, keepdim=True)
    return -(log_q.exp() * log_q.masked_fill(drop, 0.0)).sum(-1)


@LOSS_TERMS.register(
    "clamped_entropy",
    formula=("- agg(alpha_k H^c_t), H^c_t = entropy of pi_t re-normalised on its V - floor(p V) most probable "
             "tokens; alpha_k moved as adaptive_entropy's on the batch mean of H^c"),
    paper="Shen 2025, On Entropy Control in LLM-RL Algorithms, AEnt (arXiv:2509.03493)",
    settings=ClampedEntropySettings,
)
def clamped_entropy_term(logp_vocab: Tensor, cfg: ClampedEntropyController) -> tuple[Tensor, dict[str, Tensor]]:
    """AEnt as the paper has it: the clamped entropy bonus with the automatically adjusted coefficient.
    The token space is clamped as the authors' released code does (``clamp_p`` 0.3 in their recipe):
    the floor(p V) lowest-probability tokens of each position are removed and the policy re-normalised
    on the rest, so the bonus spreads probability among plausible tokens only. Reads the full
    next-token rows (``logp_vocab``), which the learner computes only for a term that reads them:
    N x T x V floats per micro-batch (docs/distillation.md has the memory bound). The coefficient
    moves on the clamped entropy's batch mean (metric ``aent/clamped_entropy``); give the term
    ``coef: 1``."""
    h = clamped_entropy(logp_vocab, cfg.settings.clamp_p)
    return -cfg.coef * h, {"aent/clamped_entropy": h.detach()}
