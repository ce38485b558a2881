"""On-policy distillation: GKD (Agarwal et al. 2023, arXiv:2306.13649), a teacher's next-token
distribution as the target on the student's own samples.

The divergence is the paper's generalized Jensen-Shannon divergence between the teacher P = p_T and
the student Q = pi_theta over the FULL vocabulary, per token position t of a sequence:

    JSD(beta)(P || Q) = beta KL(P || M) + (1 - beta) KL(Q || M),   M = beta P + (1 - beta) Q

For 0 < beta < 1 it is bounded (by the entropy of the coin beta) and interpolates between the two
KLs: JSD(beta) / beta -> KL(P || Q) (forward KL) as beta -> 0 and JSD(beta) / (1 - beta) ->
KL(Q || P) (reverse KL) as beta -> 1 (Huszar 2015, quoted by the paper). At beta = 0 itself
JSD(beta) is 0 (M = Q), so ``beta: 0`` means the forward KL and ``beta: 1`` the reverse KL, the
paper's "Forward KL" and "Reverse KL" divergences; near the ends JSD(beta) is about beta (or
1 - beta) times the KL, which the term's ``coef`` can absorb.

The paper's token-level divergence of a sequence is the mean over its tokens, (1/L_y) sum_n D_n,
averaged over sequences: ``loss_agg: seq_mean_token_mean`` is exactly that (the recipe sets it).
Its student-data fraction lambda is ``algo.mixing: {name: convex, mu: 1 - lambda}`` with ``gkd`` on
the sampled rows and ``gkd_data`` on the demonstration rows (the fixed dataset's outputs): the
expectation of the paper's mixture, L = lambda E_{y~pi}[D] + (1 - lambda) E_{y~data}[D]. As in the
paper, no gradient flows through the student's sampling (the samples are fixed tokens). ``no_reward``
(A_t = 0) is the advantage of a run that trains on the divergence alone (no reward in the loss);
with another estimator the term adds to the RL objective (the paper's RLHF + GKD section).

Inputs are log-probability rows [N, T, V] (``Context.logp_vocab``: the student, with gradient;
``Context.teacher_logp_vocab``: the teacher, from a no-grad pass at prepare time), both at the
training temperature, re-tempered here by ``temperature``: log softmax(log p / tau).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.objective import LOSS_TERMS
from reinforge.registry import Settings

GKD_FORMULA = ("+ c * agg(D_t), D_t = JSD_beta(p_T || pi) = beta KL(p_T || M) + (1 - beta) KL(pi || M), "
               "M = beta p_T + (1 - beta) pi over the full vocabulary; beta = 0: KL(p_T || pi), beta = 1: KL(pi || p_T)")


class GKDSettings(Settings):
    """The divergence of GKD's term: the generalized JSD's beta and a softmax temperature."""

    beta: float = Field(0.5, ge=0, le=1, description="JSD(beta) between the teacher and the student; 0: forward "
                        "KL(teacher || student), 1: reverse KL(student || teacher)")
    temperature: float = Field(1.0, gt=0, description="both distributions re-tempered: softmax(log p / temperature)")


def _kl(log_a: Tensor, log_b: Tensor) -> Tensor:
    """KL(a || b) = sum_v a(v) (log a(v) - log b(v)) over the last dimension (0 log 0 = 0)."""
    a = log_a.exp()
    return torch.where(a > 0, a * (log_a - log_b), torch.zeros_like(a)).sum(-1)


def generalized_jsd(log_p: Tensor, log_q: Tensor, beta: float) -> Tensor:
    """JSD(beta)(P || Q) over the last dimension of log-probability rows ``log_p`` (P) and ``log_q`` (Q):
    beta KL(P || M) + (1 - beta) KL(Q || M), M = beta P + (1 - beta) Q; beta = 0 gives KL(P || Q) and
    beta = 1 KL(Q || P) (the limits of JSD(beta) / beta and JSD(beta) / (1 - beta))."""
    if beta == 0:
        return _kl(log_p, log_q)
    if beta == 1:
        return _kl(log_q, log_p)
    log_m = torch.logsumexp(torch.stack([log_p + math.log(beta), log_q + math.log(1 - beta)]), dim=0)
    return beta * _kl(log_p, log_m) + (1 - beta) * _kl(log_q, log_m)


def _retemper(logp: Tensor, temperature: float) -> Tensor:
    return logp if temperature == 1.0 else torch.log_softmax(logp / temperature, dim=-1)


@LOSS_TERMS.register(
    "gkd",
    formula=GKD_FORMULA + ", on the student's own samples",
    paper="Agarwal et al. 2023, GKD: On-Policy Distillation of Language Models (arXiv:2306.13649)",
    needs=("teacher_logp_vocab",),
    settings=GKDSettings,
)
def gkd_term(logp_vocab: Tensor, teacher_logp_vocab: Tensor, mask: Tensor, cfg: GKDSettings
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """GKD's divergence D_t = JSD(beta)(p_T || pi) per token of the sampled rows, over the full
    vocabulary ([N, T, V] rows in, [N, T] out, zero off ``mask``). Metric ``gkd``: D_t."""
    student = _retemper(logp_vocab, cfg.temperature)
    teacher = _retemper(teacher_logp_vocab.to(student.dtype), cfg.temperature)
    div = generalized_jsd(teacher, student, cfg.beta) * mask
    return div, {"gkd": div.detach()}


@LOSS_TERMS.register(
    "gkd_data",
    formula=GKD_FORMULA + ", on the demonstrations (the fixed dataset's outputs)",
    paper="Agarwal et al. 2023, GKD, its student-data fraction lambda < 1 (arXiv:2306.13649)",
    needs=("teacher_logp_vocab", "demonstrations"),
    settings=GKDSettings,
)
def gkd_data_term(logp_vocab: Tensor, teacher_logp_vocab: Tensor, mask: Tensor, cfg: GKDSettings
                  ) -> tuple[Tensor, dict[str, Tensor]]:
    """The same divergence on the demonstration rows (supervised KD when alone; with ``gkd`` and
    ``mixing: convex`` the paper's lambda mixture). Metric ``gkd_data``."""
    div, _ = gkd_term(logp_vocab, teacher_logp_vocab, mask, cfg)
    return div, {"gkd_data": div.detach()}


@ADVANTAGES.register(
    "no_reward",
    formula="A_t = 0",
    paper="no reward in the loss: a run trained by its loss terms alone (e.g. GKD's, arXiv:2306.13649)",
)
def zero_advantage(mask: Tensor) -> Tensor:
    """No advantage: the policy loss is zero (and so is its gradient); the loss terms train alone
    (pure on-policy distillation). The rewards are still computed and logged."""
    return torch.zeros_like(mask)
