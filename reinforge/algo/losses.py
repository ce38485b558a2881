"""Policy losses (per token) and loss aggregation with global denominators.

A policy loss (registered in ``POLICY_LOSSES``) declares only the parameters it reads: context
fields (``algo/context.py``, bound by name by ``Registry.call``: ``logp``, ``old_logp``,
``advantages``, ``mask``, ``sampling_logp``, ...) and ``cfg``, its own settings (its ``settings=``
model, validated from ``algo.policy_loss: {name: ..., option: value}``)::

    fn(logp: Tensor[N,T], old_logp: Tensor[N,T], advantages: Tensor[N,T], cfg)
        -> (loss: Tensor[N,T], metrics: dict[str, Tensor[N,T]])

``loss`` is per token (to be aggregated by a ``LOSS_AGG`` function); each metric is a per-token
tensor that the learner averages over masked tokens.

Aggregation signature (registered in ``LOSS_AGG``)::

    fn(values: Tensor[N,T], mask: Tensor[N,T], norm: AggNorm) -> Tensor (scalar)

``AggNorm`` holds denominators computed once over the whole optimizer mini-batch, so summing
the aggregated loss of its micro-batches gives exactly the loss (and gradient) of the whole
mini-batch however it is split. An aggregation's settings (``seq_mean_token_sum_norm``'s
``max_len_norm``) are read by the learner into ``AggNorm``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from pydantic import Field, field_validator
from torch import Tensor

from reinforge.algo.context import PART_INPUTS
from reinforge.registry import Registry, Settings, kind


class PolicyLossFn(Protocol):
    """A policy loss: keyword parameters named after the context fields it reads, ``cfg`` its
    settings; returns (per-token loss, per-token metrics)."""

    def __call__(self, **fields: Any) -> tuple[Tensor, dict[str, Tensor]]: ...


POLICY_LOSSES: Registry[PolicyLossFn] = kind(
    "policy_loss", Registry("policy loss", inputs=PART_INPUTS, references=True))


class ClipSettings(Settings):
    """The clip range [1 - clip_low, 1 + clip_high] of an importance ratio."""

    clip_low: float = Field(0.2, ge=0, description="lower clip range: the ratio is clipped at 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="upper clip range: the ratio is clipped at 1 + clip_high "
                             "(clip-higher: above clip_low)")


class PPOClipSettings(ClipSettings):
    """PPO's clip range and its optional dual clip."""

    dual_clip: float = Field(0.0, ge=0, description="PPO dual-clip constant c > 1 for A < 0 (0 = off)")

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip(cls, v: float) -> float:
        if 0 < v <= 1:
            raise ValueError("must be 0 (off) or a constant c > 1 (e.g. 3.0)")
        return v


class TISSettings(Settings):
    """Truncated importance sampling of a plain policy gradient."""

    tis_cap: float = Field(0.0, ge=0, description="truncated importance-sampling cap C (0 = off)")


class LengthNormSettings(Settings):
    """The constant length normaliser of ``seq_mean_token_sum_norm``."""

    max_len_norm: float = Field(0.0, ge=0, description="L_max; 0 = rollout.max_new_tokens")


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

    rho_t = exp(log pi(a_t) - log pi_old(a_t));
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
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual > 0.0:
        cap = -advantages * dual
        dual_active = (advantages < 0) & (cap < loss)
        loss = torch.where(dual_active, cap.to(loss.dtype), loss)
    else:
        dual_active = torch.zeros_like(loss, dtype=torch.bool)
    with torch.no_grad():
        metrics = {
            "clip_frac": (clipped > unclipped).to(logp.dtype),
            "dual_clip_frac": dual_active.to(logp.dtype),
            "ratio": ratio.detach(),
            "approx_kl_old": torch.expm1(-log_ratio) + log_ratio,
        }
    return loss, metrics


def _masked_seq_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


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
    seq_log_ratio = _masked_seq_mean(logp - old_logp, mask)
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


@dataclass(frozen=True)
class AggNorm:
    """Global denominators of one optimizer mini-batch.

    ``num_tokens``: masked tokens in the mini-batch; ``num_seqs``: sequences in it;
    ``max_len``: the constant length normaliser of ``seq_mean_token_sum_norm``.
    """

    num_tokens: float
    num_seqs: float
    max_len: float = 1.0

    @classmethod
    def of(cls, mask: Tensor, max_len: float = 1.0, rows: Tensor | None = None) -> AggNorm:
        """The denominators of ``mask``'s tokens and of its sequences (every row, or the ``rows`` [N] bool)."""
        seqs = float(rows.sum()) if rows is not None else float(mask.shape[0])
        return cls(num_tokens=max(float(mask.sum()), 1.0), num_seqs=max(seqs, 1.0), max_len=max_len)


AggFn = Callable[[Tensor, Tensor, AggNorm], Tensor]
LOSS_AGG: Registry[AggFn] = kind("loss_agg", Registry("loss aggregation"))


@LOSS_AGG.register(
    "token_mean",
    formula="L = sum_{i,t} m_it l_it / sum_{i,t} m_it",
    paper="Yu et al. 2025, DAPO token-level loss (arXiv:2503.14476)",
)
def token_mean(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Mean over all masked tokens of the mini-batch: every token weighs the same."""
    return (values * mask).sum() / norm.num_tokens


@LOSS_AGG.register(
    "seq_mean_token_sum",
    formula="L = (1/N) sum_i sum_t m_it l_it",
    paper="sequence-sum aggregation (REINFORCE-style; as in verl's seq-mean-token-sum)",
)
def seq_mean_token_sum(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Sum over each sequence's tokens, mean over sequences."""
    return (values * mask).sum() / norm.num_seqs


@LOSS_AGG.register(
    "seq_mean_token_mean",
    formula="L = (1/N) sum_i (sum_t m_it l_it / sum_t m_it)",
    paper="Shao et al. 2024, GRPO's original per-sequence mean (arXiv:2402.03300)",
)
def seq_mean_token_mean(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Mean over each sequence's tokens, then mean over sequences (empty sequences contribute 0)."""
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / norm.num_seqs


@LOSS_AGG.register(
    "seq_mean_token_sum_norm",
    formula="L = (1/N) sum_i sum_t m_it l_it / L_max",
    paper="Liu et al. 2025, Dr. GRPO (arXiv:2503.20783)",
    settings=LengthNormSettings,
)
def seq_mean_token_sum_norm(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Sum over tokens divided by a constant maximum length, mean over sequences (no length bias);
    L_max = ``norm.max_len``, the ``max_len_norm`` option (or ``rollout.max_new_tokens``)."""
    return (values * mask).sum() / (norm.num_seqs * norm.max_len)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy H = logsumexp(z) - sum_v softmax(z)_v z_v of the distribution softmax(z)
    (in float32 at least: half-precision logits are upcast, float64 stays float64)."""
    logp = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
