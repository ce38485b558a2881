"""Pure tensor math of RL post-training: advantage estimators, policy losses, aggregation, KL.

Every part is a plain function registered by name; see ``reinforge algos`` for the list.
"""

from reinforge.algo.advantages import ADVANTAGES
from reinforge.algo.kl import KL_ESTIMATORS
from reinforge.algo.losses import LOSS_AGG, POLICY_LOSSES, AggNorm, entropy_from_logits

REGISTRIES = {
    "advantage": ADVANTAGES,
    "policy_loss": POLICY_LOSSES,
    "loss_agg": LOSS_AGG,
    "kl_estimator": KL_ESTIMATORS,
}

__all__ = ["ADVANTAGES", "KL_ESTIMATORS", "LOSS_AGG", "POLICY_LOSSES", "REGISTRIES", "AggNorm", "entropy_from_logits"]
