"""Policy losses: PPO's clipped surrogate and its close variants, one small registered function each.

    name       L_t per token (rho_t = pi(a_t) / pi_old(a_t), sg: stop-gradient)               paper (arXiv)
    ppo_clip   -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A); dual clip: min(L, -c A), A<0  PPO 1707.06347
    gspo       ppo_clip on the sequence ratio s_i = exp(mean_t log rho_t), token form         GSPO 2507.18071
    cispo      -sg(clip(rho, 1-eps_low, 1+eps_high)) A log pi: every token keeps a gradient   CISPO 2506.13585
    reinforce  -w A log pi, w = sg(min(rho, C)) (truncated IS, tis_cap C > 0) or 1            IMPALA 1802.01561
    repo       ppo_clip with rho = pi / mu, mu the policy that sampled the (replayed) row     RePO 2506.09340
    ce_gppo    ppo_clip's value; clipped tokens keep the gradient -beta (1 -+ eps) A          CE-GPPO 2509.20712
    aepo       ppo_clip; A > 0 above 1 + eps_high keeps the gradient -(1 + eps_high) A        AEPO 2510.14545
    dcpo       ppo_clip, bounds from q = pi_old(a_t): |(rho - 1) rho q| <= eps; cap r_max     DCPO 2509.02333
    aspo       PPO's token mask; weight 1/rho if A > 0, rho if A < 0; soft dual clip c        ASPO 2510.06062
    bapo       ppo_clip in [c_low, c_high] searched per batch for a positive share rho_0      BAPO 2510.18927
    m2po       -M_t rho A, M drops the largest (log rho)^2 until their mean <= tau_M2         M2PO 2510.01161

A policy loss (registered in ``POLICY_LOSSES``) declares only the parameters it reads: context
fields (``algo/context.py``, bound by name by ``Registry.call``: ``logp``, ``old_logp``,
``advantages``, ``mask``, ``sampling_logp``, ...) and ``cfg``, its own settings (its ``settings=``
model, validated from ``algo.policy_loss: {name: ..., option: value}``)::

    fn(logp: Tensor[N,T], old_logp: Tensor[N,T], advantages: Tensor[N,T], cfg)
        -> (loss: Tensor[N,T], metrics: dict[str, Tensor[N,T]])

``loss`` is per token (to be aggregated by a ``LOSS_AGG`` function, ``algo/aggregation.py``); each
metric is a per-token tensor that the learner averages over masked tokens.

BAPO's bounds and M2PO's mask are statistics of the batch, computed inside the loss over the tokens of
``mask``, i.e. over the micro-batch the loss is called on: exact for the mini-batch when it fits in one
micro-batch (the demo's: a mini-batch of 32 x 8 / train.minibatches rows of at most 8 completion tokens
is far under ``train.micro_batch_tokens`` = 8192), per micro-batch otherwise.

The policy losses of other kinds of objective stay with their method: ``luffy`` (``algo/guidance.py``),
``dpo`` and ``ipo`` (``algo/preference.py``), ``astar_po`` and ``pacs`` (``algo/regression.py``).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Protocol

import torch
from pydantic import AfterValidator, Field, model_validator
from torch import Tensor

from reinforge.algo.aggregation import masked_seq_mean
from reinforge.algo.context import PART_INPUTS
from reinforge.registry import Registry, Settings, kind


class PolicyLossFn(Protocol):
    """A policy loss: keyword parameters named after the context fields it reads, ``cfg`` its
    settings; returns (per-token loss, per-token metrics)."""

    def __call__(self, **fields: Any) -> tuple[Tensor, dict[str, Tensor]]: ...


POLICY_LOSSES: Registry[PolicyLossFn] = kind(
    "policy_loss", Registry("policy loss", inputs=PART_INPUTS, references=True))


def _off_or_above_one(v: float) -> float:
    if 0 < v <= 1:
        raise ValueError("must be 0 (off) or a constant c > 1 (e.g. 3.0)")
    return v


DualClip = Annotated[float, AfterValidator(_off_or_above_one)]  # a dual-clip constant: 0 (off) or c > 1


class ClipSettings(Settings):
    """The clip range [1 - clip_low, 1 + clip_high] of an importance ratio."""

    clip_low: float = Field(0.2, ge=0, description="lower clip range: the ratio is clipped at 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="upper clip range: the ratio is clipped at 1 + clip_high "
                             "(clip-higher: above clip_low)")


class PPOClipSettings(ClipSettings):
    """PPO's clip range and its optional dual clip."""

    dual_clip: DualClip = Field(0.0, ge=0, description="PPO dual-clip constant c > 1 for A < 0 (0 = off)")


class TISSettings(Settings):
    """Truncated importance sampling of a plain policy gradient."""

    tis_cap: float = Field(0.0, ge=0, description="truncated importance-sampling cap C (0 = off)")


# ----------------------------------------- the PPO surrogate and its ratio: PPO, GSPO, CISPO, REINFORCE, RePO
def dual_clip_cap(loss: Tensor, advantages: Tensor, c: float) -> tuple[Tensor, Tensor]:
    """PPO's dual clip (Ye et al. 2020): for A_t < 0, L_t <- min(L_t, -c A_t) (a token on the cap gets no
    gradient); c = 0: off. Returns the capped loss and the tokens on the cap."""
    if c <= 0:
        return loss, torch.zeros_like(loss, dtype=torch.bool)
    cap = -c * advantages
    on_cap = (advantages < 0) & (cap < loss)
    return torch.where(on_cap, cap.to(loss.dtype), loss), on_cap


LOG_RATIO_BOUND = 20.0  # |log rho| beyond this is clamped before exp (verl's bound): e^20 is finite in float32


def bounded_log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """``clamp(log pi - log pi_old, -20, 20)``: unbounded, ``exp`` overflows float32 past |log rho| = 88.7
    (an infinite loss) and dwarfs every other token's term well before (e^50 = 5e21); bounded, a token
    that far off weighs at most e^20 and gets no gradient beyond the bound, as in verl."""
    return (logp - old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


@POLICY_LOSSES.register(
    "ppo_clip",
    formula=(
        "L_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t), rho_t = pi(a_t)/pi_old(a_t); "
        "dual clip (c > 1): L_t <- min(L_t, -c A_t) for A_t < 0"
    ),
    paper=(
        "Schulman et al. 2017, PPO (arXiv:1707.06347); clip-higher: Yu et al. 2025, DAPO (arXiv:2503.14476); "
        "dual clip: Ye et al. 2020, Mastering Complex Control in MOBA Games with Deep RL (arXiv:1912.09729)"
    ),
    settings=PPOClipSettings,
)
def ppo_clip_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: PPOClipSettings
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with separate lower and upper clip ranges (clip-higher) and optional dual clip.

    rho_t = exp(clamp(log pi(a_t) - log pi_old(a_t), -20, 20)) (``bounded_log_ratio``, as verl bounds it);
    L_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high)).
    Dual clip (``cfg.dual_clip`` = c > 1, 0 = off): for A_t < 0 the loss above grows without bound
    with rho_t (the unclipped term is active when rho_t > 1 + clip_high), so it is capped:
    L_t = min(max(-A_t rho_t, -A_t clip(rho_t, ...)), -c A_t), i.e. rho_t is effectively clipped
    at c; a token on the cap gets no gradient. Tokens with A_t >= 0 are unchanged.
    Metrics: ``clip_frac`` (tokens where the clipped term is the active one), ``dual_clip_frac``
    (tokens where the dual-clip cap is the active term; all zeros when off), ``ratio``,
    ``approx_kl_old`` (k3 between pi_old and pi).
    """
    dual = float(getattr(cfg, "dual_clip", 0.0) or 0.0)
    if 0.0 < dual <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or 0 to disable), got {dual}")
    log_ratio = bounded_log_ratio(logp, old_logp)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss, dual_active = dual_clip_cap(torch.maximum(unclipped, clipped), advantages, dual)
    with torch.no_grad():
        metrics = {
            "clip_frac": (clipped > unclipped).to(logp.dtype),
            "dual_clip_frac": dual_active.to(logp.dtype),
            "ratio": ratio.detach(),
            "approx_kl_old": torch.expm1(-log_ratio) + log_ratio,
        }
    return loss, metrics


@POLICY_LOSSES.register(
    "gspo",
    formula="s_i = exp(mean_t log(pi/pi_old)); L_i = -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i) (token form)",
    paper="Zheng et al. 2025, Group Sequence Policy Optimization (arXiv:2507.18071)",
    settings=ClipSettings,
)
def gspo_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: ClipSettings
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: a sequence-level importance ratio with sequence-level clipping, in the paper's GSPO-token form.

    s_i = exp((1/|y_i|) sum_t (log pi(y_it) - log pi_old(y_it))) over the sequence's masked tokens;
    s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)] (equal to s_i in value, gradient s_i grad log pi(y_it));
    L_it = max(-A_it s_it, -A_it clip(s_it, 1 - clip_low, 1 + clip_high)), the clip decided by s_i.
    With a per-sequence advantage and ``loss_agg: seq_mean_token_mean`` this is exactly the paper's
    sequence objective (1/G) sum_i min(s_i A_i, clip(s_i) A_i); the paper's clip ranges are ~3e-4/4e-4.
    """
    seq_log_ratio = masked_seq_mean(logp - old_logp, mask)
    s_seq = torch.exp(seq_log_ratio).detach()[:, None]
    s_tok = s_seq * torch.exp(logp - logp.detach())
    unclipped = -advantages * s_tok
    clipped = -advantages * torch.clamp(s_tok, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {"clip_frac": (clipped > unclipped).to(logp.dtype), "ratio": s_seq.expand_as(logp).clone()}
    return loss, metrics


@POLICY_LOSSES.register(
    "cispo",
    formula="L_t = -sg(clip(rho_t, 1-eps_low, 1+eps_high)) A_t log pi(a_t)",
    paper="MiniMax 2025, MiniMax-M1 (CISPO) (arXiv:2506.13585)",
    settings=ClipSettings,
)
def cispo_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: ClipSettings
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: clip the importance-sampling weight, not the update, so every token keeps a gradient.

    rho_t = pi(a_t) / pi_old(a_t); L_t = -sg(clip(rho_t, 1 - clip_low, 1 + clip_high)) A_t log pi(a_t).
    The gradient is -clip(rho_t) A_t grad log pi(a_t) for every token, clipped or not (PPO-clip drops
    the tokens outside its trust region). The paper effectively disables the lower bound (large clip_low).
    """
    ratio = torch.exp(logp - old_logp)
    weight = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high).detach()
    loss = -weight * advantages * logp
    with torch.no_grad():
        metrics = {"clip_frac": (weight != ratio).to(logp.dtype), "ratio": ratio.detach()}
    return loss, metrics


@POLICY_LOSSES.register(
    "reinforce",
    formula="L_t = -w_t A_t log pi(a_t), w_t = sg(min(pi/pi_old, C)) with truncated IS (C = tis_cap), else 1",
    paper="Williams 1992, REINFORCE; truncated IS: Espeholt et al. 2018, IMPALA (arXiv:1802.01561)",
    settings=TISSettings,
)
def reinforce_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: TISSettings
) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain policy gradient: L_t = -w_t A_t log pi(a_t).

    w_t = 1 (on-policy) or, with ``tis_cap`` C > 0, the truncated importance weight
    sg(min(pi(a_t) / pi_old(a_t), C)), which bounds the variance of off-policy updates.
    """
    ratio = torch.exp(logp - old_logp)
    cap = getattr(cfg, "tis_cap", 0.0)
    weight = torch.clamp(ratio, max=cap).detach() if cap > 0 else torch.ones_like(ratio)
    loss = -weight * advantages * logp
    with torch.no_grad():
        metrics = {"clip_frac": (ratio > cap).to(logp.dtype) if cap > 0 else torch.zeros_like(ratio),
                   "ratio": ratio.detach()}
    return loss, metrics


@POLICY_LOSSES.register(
    "repo", formula="L_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t), rho_t = pi(a_t)/mu(a_t), "
    "mu the behaviour policy that sampled the row (fresh or replayed)",
    paper="Li et al. 2025, RePO: Replay-Enhanced Policy Optimization (arXiv:2506.09340)", settings=ClipSettings,
)
def repo_loss(logp: Tensor, sampling_logp: Tensor, advantages: Tensor, cfg: ClipSettings) -> tuple[Tensor, dict]:
    """RePO's loss: PPO's clipped surrogate with the behaviour policy's log-probs in the ratio.

    RePO's objective is J_on + J_off: GRPO's clipped surrogate over the fresh samples and the same
    surrogate over the samples replayed from a per-prompt buffer (orchestrate/replay.py), each with the
    ratio of the current policy to the policy that *sampled* the row,

        rho_t = pi_theta(a_t) / mu(a_t),   L_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t),

    with mu the behaviour policy's token probability stored with the sample (``sampling_logp``: the
    rollout engine's log-probs). For a fresh row mu is the policy of this update (rho = pi / pi_old up to
    the engine's rounding); for a replayed row it is the older policy that drew it, so the clip bounds
    how far an update moves on stale samples. The two sums are one aggregation here (the run's
    ``algo.loss_agg`` over every row): docs/strategies.md gives the choice. Metrics as ``ppo_clip``'s
    (``ratio`` = pi / mu, ``approx_kl_old`` = k3 between mu and pi)."""
    return ppo_clip_loss(logp, sampling_logp, advantages, cfg)


# --------------------------------------------------------------------- other clips: CE-GPPO, AEPO, DCPO, ASPO
class CEGPPOSettings(ClipSettings):
    """CE-GPPO's clip range, the two gradient scales of the out-of-clip tokens and the dual clip."""

    beta1: float = Field(0.75, ge=0, description="gradient scale of tokens with A < 0 and rho < 1 - eps_low")
    beta2: float = Field(1.0, ge=0, description="gradient scale of tokens with A > 0 and rho > 1 + eps_high")
    dual_clip: DualClip = Field(3.0, ge=0, description="dual-clip constant c > 1 for A < 0 (0 = off)")


@POLICY_LOSSES.register(
    "ce_gppo",
    formula=("L_t = -beta1 (1-eps_low) rho_t/sg(rho_t) A_t if A_t < 0 and rho_t < 1-eps_low; "
             "-beta2 (1+eps_high) rho_t/sg(rho_t) A_t if A_t > 0 and rho_t > 1+eps_high; else -rho_t A_t; "
             "A_t < 0: L_t <- min(L_t, -c A_t)"),
    paper="Su et al. 2025, CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization "
          "(arXiv:2509.20712); GPPO: Klear-Reasoner (arXiv:2508.07629)",
    settings=CEGPPOSettings,
)
def ce_gppo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: CEGPPOSettings
                 ) -> tuple[Tensor, dict[str, Tensor]]:
    """Gradient-preserving clipping. Where PPO's clip is active (A < 0 with rho below the range, A > 0
    with rho above it) the forward value is the clipped one, beta x (1 -+ eps) A, but the gradient is
    not zero: rho / sg(rho) has value 1 and gradient grad log pi, so such a token gets
    -beta (1 -+ eps) A grad log pi, a bounded gradient scaled by beta1 (negative advantages: it
    sharpens, counters entropy growth) or beta2 (positive: it explores). The other tokens are PPO's
    unclipped term. Defaults are the paper's released implementation: beta1 0.75, beta2 1.0, dual
    clip c = 3 on A < 0. Metrics: ``clip_frac`` (tokens in the two clipped cases), ``dual_clip_frac``."""
    ratio = torch.exp(logp - old_logp)
    unit = ratio / ratio.detach()  # value 1, gradient grad log pi
    low = (ratio < 1.0 - cfg.clip_low) & (advantages < 0)
    high = (ratio > 1.0 + cfg.clip_high) & (advantages > 0)
    loss = -ratio * advantages
    loss = torch.where(low, -cfg.beta1 * (1.0 - cfg.clip_low) * unit * advantages, loss)
    loss = torch.where(high, -cfg.beta2 * (1.0 + cfg.clip_high) * unit * advantages, loss)
    loss, dual = dual_clip_cap(loss, advantages, cfg.dual_clip)
    with torch.no_grad():
        metrics = {"clip_frac": (low | high).to(logp.dtype), "dual_clip_frac": dual.to(logp.dtype),
                   "ratio": ratio.detach()}
    return loss, metrics


@POLICY_LOSSES.register(
    "aepo",
    formula=("L_t = -(1+eps_high) rho_t/sg(rho_t) A_t if A_t > 0 and rho_t > 1+eps_high; "
             "else -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t)"),
    paper="Dong et al. 2025, Agentic Entropy-Balanced Policy Optimization (arXiv:2510.14545)",
    settings=ClipSettings,
)
def aepo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: ClipSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """AEPO's entropy clipping-balanced surrogate: PPO's, except on the upper clip. A token with A > 0
    and rho above 1 + eps_high (in the paper's agent runs, the high-entropy tokens of exploratory tool
    calls, whose probability moves most) keeps PPO's clipped value (1 + eps_high) A but not its zero
    gradient: rho / sg(rho) has value 1 and gradient grad log pi, so the token gets
    -(1 + eps_high) A grad log pi, a bounded, rescaled gradient. The lower clip is PPO's. The rule acts
    on the ratio (the paper motivates it by the entropy of the tokens the clip hits; it does not test
    the entropy). The gradient equals ``ce_gppo`` with beta1 = 0, beta2 = 1 and no dual clip.
    Metrics: ``clip_frac`` (tokens on either clip), ``clip_high_kept`` (tokens whose gradient the rule keeps)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped)
    high = (ratio > 1.0 + cfg.clip_high) & (advantages > 0)
    loss = torch.where(high, -(1.0 + cfg.clip_high) * (ratio / ratio.detach()) * advantages, loss)
    with torch.no_grad():
        metrics = {"clip_frac": (clipped > unclipped).to(logp.dtype), "clip_high_kept": high.to(logp.dtype),
                   "ratio": ratio.detach()}
    return loss, metrics


class DCPOSettings(Settings):
    """DCPO's probability-dependent clip bounds (its epsilons) and their cap."""

    clip_low: float = Field(0.16, ge=0, description="eps_low of the bound |(r - 1) p| <= eps below 1")
    clip_high: float = Field(0.2, ge=0, description="eps_high of the bound |(r - 1) p| <= eps above 1")
    max_ratio: float = Field(10.0, gt=1, description="cap of the upper bound and dual clip for A < 0 (r_max)")


def dcpo_bounds(old_logp: Tensor, cfg: DCPOSettings) -> tuple[Tensor, Tensor]:
    """Per-token clip bounds of DCPO from the token's prior probability q = pi_old(a_t):
    0.5 + 0.5 sqrt(max(1 - 4 eps_low / q, 0)) <= r <= min(0.5 + 0.5 sqrt(1 + 4 eps_high / q), r_max)."""
    q = torch.exp(old_logp.detach()).clamp(min=1e-12)
    low = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * cfg.clip_low / q, min=0.0))
    high = torch.clamp(0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * cfg.clip_high / q), max=cfg.max_ratio)
    return low, high


@POLICY_LOSSES.register(
    "dcpo",
    formula=("L_t = -min(rho_t A_t, clip(rho_t, lo(q_t), hi(q_t)) A_t), q_t = pi_old(a_t), "
             "lo = 0.5 + 0.5 sqrt(max(1 - 4 eps_low/q, 0)), hi = min(0.5 + 0.5 sqrt(1 + 4 eps_high/q), r_max); "
             "A_t < 0: L_t <- min(L_t, -r_max A_t)"),
    paper="Yang et al. 2025, DCPO: Dynamic Clipping Policy Optimization (arXiv:2509.02333)",
    settings=DCPOSettings,
)
def dcpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: DCPOSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Dynamic-adaptive clipping: PPO's surrogate with clip bounds that widen as the token's prior
    probability q falls. The bounds solve |(r - 1) p| <= eps with p = r q (the change of the token's
    probability, not of its ratio, is bounded), so a token with q = 1 keeps ~[0.8, 1.17] and a rare
    one may move far more. The paper caps both sides at r_max = 10 "as the dual clip": here the upper
    bound is capped at r_max and, for A < 0, the loss at -r_max A (PPO's dual clip). Defaults: the
    paper's eps_low 0.16, eps_high 0.2. Metrics: ``clip_frac``, ``ratio``, ``clip_upper`` (mean hi)."""
    ratio = torch.exp(logp - old_logp)
    low, high = dcpo_bounds(old_logp, cfg)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.minimum(torch.maximum(ratio, low), high)
    loss = torch.maximum(unclipped, clipped)
    loss, dual = dual_clip_cap(loss, advantages, cfg.max_ratio)
    with torch.no_grad():
        metrics = {"clip_frac": (clipped > unclipped).to(logp.dtype), "dual_clip_frac": dual.to(logp.dtype),
                   "ratio": ratio.detach(), "clip_upper": high}
    return loss, metrics


class ASPOSettings(ClipSettings):
    """ASPO's clip range (kept for the token mask) and its soft dual clip."""

    dual_clip: float = Field(3.0, gt=1, description="soft dual clip c: weights above c are set to c, gradient kept")


@POLICY_LOSSES.register(
    "aspo",
    formula=("A_t > 0: L_t = -A_t pi_old pi/sg(pi^2) (= 1/rho_t in value, gradient (1/rho_t) grad log pi), "
             "none if rho_t > 1+eps_high; A_t < 0: L_t = -rho_t A_t, none if rho_t < 1-eps_low; "
             "soft dual clip: a weight above c becomes c rho_t/sg(rho_t)"),
    paper="Wang et al. 2025, ASPO: Asymmetric Importance Sampling Policy Optimization (arXiv:2510.06062)",
    settings=ASPOSettings,
)
def aspo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: ASPOSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Asymmetric importance sampling. Step 1, token masking: PPO's clip stays (A > 0 with rho above
    1 + eps_high, A < 0 with rho below 1 - eps_low: no gradient). Step 2, weight flipping: a
    positive-advantage token is weighted by 1/rho (pi_old pi / sg(pi^2): value 1/rho, gradient
    (1/rho) grad log pi), so tokens that lag behind pi_old learn faster and already-reinforced ones
    slower; negative tokens keep rho. Step 3, soft dual clip (CISPO-style): a weight above c (1/rho > c
    for A > 0, rho > c for A < 0) is valued c and keeps the gradient c grad log pi. The paper does not
    say whether the negative side's dual clip is soft; the loss we could read (Archer2.0's verl code)
    makes both soft, as here. Defaults: eps 0.2 (the paper), c = 3. Metrics: ``clip_frac`` (masked
    tokens), ``dual_clip_frac``, ``ratio``."""
    ratio = torch.exp(logp - old_logp)
    unit = ratio / ratio.detach()  # value 1, gradient grad log pi
    pos, neg = advantages > 0, advantages < 0
    masked = (pos & (ratio > 1.0 + cfg.clip_high)) | (neg & (ratio < 1.0 - cfg.clip_low))
    weight = torch.where(pos, 1.0 / ratio.detach(), ratio.detach())  # the token's weight, flipped for A > 0
    dual = ~masked & (pos | neg) & (weight > cfg.dual_clip)
    weight = torch.where(dual, torch.full_like(weight, cfg.dual_clip), weight)
    active = -advantages * weight * unit
    frozen = -advantages * torch.where(pos, 1.0 / (1.0 + cfg.clip_high), 1.0 - cfg.clip_low)  # masked: no gradient
    loss = torch.where(masked, frozen.to(active.dtype), active)
    with torch.no_grad():
        metrics = {"clip_frac": masked.to(logp.dtype), "dual_clip_frac": dual.to(logp.dtype), "ratio": ratio.detach()}
    return loss, metrics


# ---------------------------------------------------- trust regions from a statistic of the batch: BAPO, M2PO
class BAPOSettings(Settings):
    """BAPO's target positive share rho_0 and the movable ranges and steps of its two clip bounds
    (explicit ratio bounds, not epsilons)."""

    pos_share: float = Field(0.4, ge=0, le=1, description="rho_0: the positive tokens' target share of the loss")
    clip_low_start: float = Field(0.6, gt=0, le=1, description="a-: the lower ratio bound to start from")
    clip_low_max: float = Field(0.9, gt=0, le=1, description="b-: the highest the lower bound may go")
    clip_low_step: float = Field(0.02, gt=0, description="delta_2: step of the lower bound")
    clip_high_start: float = Field(1.2, ge=1, description="a+: the upper ratio bound to start from")
    clip_high_max: float = Field(3.0, ge=1, description="b+: the highest the upper bound may go")
    clip_high_step: float = Field(0.05, gt=0, description="delta_1: step of the upper bound")

    @model_validator(mode="after")
    def _ranges(self) -> BAPOSettings:
        if self.clip_low_max < self.clip_low_start:
            raise ValueError("clip_low_max must be >= clip_low_start")
        if self.clip_high_max < self.clip_high_start:
            raise ValueError("clip_high_max must be >= clip_high_start")
        return self


def bapo_candidates(cfg: BAPOSettings) -> tuple[Tensor, Tensor]:
    """The (c_low, c_high) pairs BAPO tries, in order: c_high from a+ up by delta_1 to b+ (c_low = a-),
    then c_low from a- up by delta_2 to b- (c_high = b+)."""
    n_high = math.ceil((cfg.clip_high_max - cfg.clip_high_start) / cfg.clip_high_step - 1e-9)
    n_low = math.ceil((cfg.clip_low_max - cfg.clip_low_start) / cfg.clip_low_step - 1e-9)
    high = (cfg.clip_high_start + cfg.clip_high_step * torch.arange(n_high + 1, dtype=torch.float64)).clamp(
        max=cfg.clip_high_max)
    low = (cfg.clip_low_start + cfg.clip_low_step * torch.arange(1, n_low + 1, dtype=torch.float64)).clamp(
        max=cfg.clip_low_max)
    high[-1] = cfg.clip_high_max  # the last step lands on the maximum exactly (0.6 + 15 * 0.02 != 0.9 in floats)
    if len(low):
        low[-1] = cfg.clip_low_max
    lows = torch.cat([torch.full_like(high, cfg.clip_low_start), low])
    highs = torch.cat([high, torch.full_like(low, cfg.clip_high_max)])
    return lows, highs


def bapo_bounds(ratio: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: BAPOSettings
                ) -> tuple[float, float, float]:
    """(c_low, c_high, rho) for the masked tokens: the first candidate pair whose positive share
    rho = sum_{A>0} q |min(r A, clip(r, 0, c_high) A)| / sum_t q |min(r A, clip(r, c_low, c_high) A)|
    reaches rho_0 (q = pi_old(a_t)), else the last pair (both bounds at their maxima)."""
    on = mask.bool()
    r, a = ratio.detach()[on].double(), advantages.detach()[on].double()
    w = torch.exp(old_logp.detach()[on].double()) * a.abs()
    lows, highs = bapo_candidates(cfg)
    pos = ((a > 0) * w)[None, :] * torch.minimum(r[None, :], highs[:, None])  # [K, n]: |min(rA, clip(r,0,c_high)A)|
    neg = ((a < 0) * w)[None, :] * torch.maximum(r[None, :], lows[:, None])  # |min(rA, clip(r,c_low,c_high)A)|, A < 0
    p, total = pos.sum(-1), pos.sum(-1) + neg.sum(-1)
    share = torch.where(total > 0, p / total.clamp(min=1e-300), torch.ones_like(total))
    ok = torch.nonzero(share >= cfg.pos_share)
    k = int(ok[0, 0]) if len(ok) else len(share) - 1
    return float(lows[k]), float(highs[k]), float(share[k])


@POLICY_LOSSES.register(
    "bapo",
    formula=("L_t = -min(rho_t A_t, clip(rho_t, c_low, c_high) A_t); (c_low, c_high): the first of c_high = a+ .. b+ "
             "(step delta_1), then c_low = a- .. b- (step delta_2), with sum_{A>0} q |min(rho A, clip(rho, 0, c_high) A)| "
             ">= rho_0 sum_t q |min(rho A, clip(rho, c_low, c_high) A)|, q = pi_old(a_t), over the micro-batch"),
    paper="Xi et al. 2025, BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy "
          "Optimization with Adaptive Clipping (arXiv:2510.18927)",
    settings=BAPOSettings,
)
def bapo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: BAPOSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Balanced policy optimization with adaptive clipping: PPO's surrogate with ratio bounds
    [c_low, c_high] chosen for each batch. Starting from (a-, a+), c_high rises by delta_1 (letting in
    more low-probability positive tokens: entropy-raising updates) up to b+, then c_low by delta_2 up
    to b-, until the positive tokens' share rho of the loss reaches rho_0 (Algorithm 1 of the paper).
    rho is the paper's, each token weighted by its rollout probability q and valued by its clipped
    surrogate. Note that in this value a negative token counts |A| max(r, c_low), so raising c_low
    does not raise rho: the c_low phase runs to b- whenever c_high = b+ is not enough, i.e. the
    low-ratio negative tokens are then dropped from the gradient as far as allowed. Defaults: the
    paper's rho_0 0.4, [a-, b-] = [0.6, 0.9], [a+, b+] = [1.2, 3.0], delta_1 0.05, delta_2 0.02. The
    paper's pi_rollout is ``old_logp`` here (pi_old; in async runs the proximal policy, the stale
    behaviour -> proximal gap being ``algo.mismatch``'s). Batch statistic over ``mask``: per micro-batch.
    Metrics: ``clip_frac``, ``ratio``, ``bapo_clip_low``, ``bapo_clip_high``, ``bapo_pos_share``."""
    ratio = torch.exp(logp - old_logp)
    c_low, c_high, share = bapo_bounds(ratio, old_logp, advantages, mask, cfg)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, c_low, c_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {"clip_frac": (clipped > unclipped).to(logp.dtype), "ratio": ratio.detach(),
                   "bapo_clip_low": torch.full_like(ratio, c_low), "bapo_clip_high": torch.full_like(ratio, c_high),
                   "bapo_pos_share": torch.full_like(ratio, share)}
    return loss, metrics


class M2POSettings(Settings):
    """M2PO's bound on the second moment of the log importance ratio."""

    m2_threshold: float = Field(0.04, gt=0, description="tau_M2: mask tokens until mean (log r)^2 <= tau")


def m2po_mask(log_ratio: Tensor, advantages: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """M2PO's Algorithm 1 ([N, T] bool, True = kept): over the trust-region tokens (A > 0 and r > 1, or
    A < 0 and r < 1) of ``mask``, drop the one with the largest (log r)^2 while the mean (log r)^2 of
    the trust-region tokens left exceeds ``threshold``. Sorted once: after dropping the k largest of
    n, the mean is (S - top_k sum) / (n - k); k is the first that brings it to ``threshold`` or below
    (k = n when none does)."""
    lr = log_ratio.detach()
    trust = mask.bool() & (((advantages > 0) & (lr > 0)) | ((advantages < 0) & (lr < 0)))
    idx = torch.nonzero(trust.flatten()).flatten()
    keep = torch.ones(lr.numel(), dtype=torch.bool, device=lr.device)
    if idx.numel():
        m2 = (lr.flatten()[idx].double()) ** 2
        values, order = torch.sort(m2, descending=True, stable=True)
        n = values.numel()
        removed = torch.cat([values.new_zeros(1), torch.cumsum(values, 0)[:-1]])  # sum of the k largest, k = 0..n-1
        means = (values.sum() - removed) / torch.arange(n, 0, -1, dtype=values.dtype, device=values.device)
        below = torch.nonzero(means <= threshold)
        k = int(below[0, 0]) if len(below) else n
        keep[idx[order[:k]]] = False
    return keep.view_as(lr)


@POLICY_LOSSES.register(
    "m2po",
    formula=("L_t = -M_t rho_t A_t; M_t = 0 for the trust-region tokens (A>0, rho>1 or A<0, rho<1) with the largest "
             "(log rho_t)^2, dropped until their mean (log rho)^2 <= tau_M2, over the micro-batch; else M_t = 1"),
    paper="Zheng et al. 2025, Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs? "
          "(M2PO) (arXiv:2510.01161)",
    settings=M2POSettings,
)
def m2po_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: M2POSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Second-moment trust policy optimization: no epsilon clip; the unclipped surrogate rho A on
    every token except those M2PO's mask drops (``m2po_mask``: the largest (log rho)^2 among the tokens
    PPO could clip, until the second moment of the rest is <= tau = 0.04, the paper's single setting).
    A dropped token keeps its place in the denominator (the paper averages over all tokens, to mimic
    PPO's clip): use ``loss_agg: token_mean``. rho is against ``old_logp`` (pi_old; the paper's
    pi_behav; in async runs the proximal policy, the behaviour -> proximal gap left to
    ``algo.mismatch``). Batch statistic over ``mask``: per micro-batch. Metrics: ``clip_frac``
    (dropped tokens), ``ratio``, ``m2`` ((log rho)^2: its mean is the batch's M2 before masking)."""
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    keep = m2po_mask(log_ratio, advantages, mask, cfg.m2_threshold)
    loss = -advantages * ratio * keep.to(ratio.dtype)
    with torch.no_grad():
        metrics = {"clip_frac": (~keep).to(logp.dtype), "ratio": ratio.detach(), "m2": log_ratio.detach() ** 2}
    return loss, metrics
