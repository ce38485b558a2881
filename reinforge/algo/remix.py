"""ReMix's KL-Convex policy constraint: a convex combination of the KL to the base (reference) policy
and the KL to the precedent policy.

Liang et al. 2025, "Squeeze the Soaked Sponge: Efficient Off-policy Reinforcement Finetuning for Large
Language Model" (ReMix, arXiv:2507.06892). ReMix's other two parts are not loss terms: the mix-policy
proximal policy gradient is the ``repo`` policy loss (the ratio against the behaviour policy that
sampled each row, fresh or replayed) over ``rollout.replay``'s mix of fresh and past samples, with the
update-to-data ratio raised by ``train.minibatches`` / ``train.epochs``; policy reincarnation's switch
back to on-policy data is ``rollout.replay``'s ``until_step`` (orchestrate/replay.py).
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from reinforge.algo.kl import KL_ESTIMATORS
from reinforge.algo.kl_adaptive import KLEstimatorSettings
from reinforge.algo.objective import LOSS_TERMS


class KLConvexSettings(KLEstimatorSettings):
    """The weight of the base policy in the convex combination and the KL estimator of both terms."""

    base_weight: float = Field(0.5, ge=0, le=1, description="lambda: weight of KL(pi, pi_ref); 1 - lambda goes "
                               "to KL(pi, pi_old), the precedent policy")


@LOSS_TERMS.register(
    "kl_convex",
    formula="+ beta * agg(lambda k(log pi, log pi_ref) + (1 - lambda) k(log pi, log pi_old)), k = the estimator",
    paper="Liang et al. 2025, ReMix: Squeeze the Soaked Sponge, Efficient Off-policy Reinforcement Finetuning "
          "for Large Language Model (arXiv:2507.06892)",
    settings=KLConvexSettings,
    needs=("ref_logp",),
)
def kl_convex_term(logp: Tensor, ref_logp: Tensor, old_logp: Tensor, cfg: KLConvexSettings
                   ) -> tuple[Tensor, dict[str, Tensor]]:
    """lambda * KL(pi || pi_base) + (1 - lambda) * KL(pi || pi_prec) per token. The base is the frozen
    reference; the precedent policy is pi_old, the policy that began this step's update (the proximal
    policy of the PPO ratio). The second term only acts when a batch takes several updates (the
    increased update-to-data ratio ReMix pairs it with): with one update pi = pi_old, where k's value
    and gradient are 0. Metrics: ``kl_convex/ref`` and ``kl_convex/prev`` (the two KLs)."""
    kl = KL_ESTIMATORS.get(cfg.estimator)
    to_ref, to_prev = kl(logp, ref_logp), kl(logp, old_logp.detach())
    lam = cfg.base_weight
    return lam * to_ref + (1.0 - lam) * to_prev, {"kl_convex/ref": to_ref.detach(), "kl_convex/prev": to_prev.detach()}
