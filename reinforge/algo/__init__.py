"""Pure tensor math of RL post-training: advantage estimators, policy losses, aggregation, KL.

Every part is a plain function registered by name; see ``reinforge algos`` for the list. The
helpers outside the registries (value loss, KL controller, mismatch correction, reward shaping)
are exported here too.
"""

import reinforge.algo.advantages_batch  # noqa: F401  (registers reinforce_pp, reinforce_pp_baseline, remax, gae)
import reinforge.algo.advantages_tree  # noqa: F401  (registers treepo)
import reinforge.algo.egae  # noqa: F401  (registers T-PPO's egae estimator)
import reinforge.algo.gigpo  # noqa: F401  (registers the gigpo estimator)
import reinforge.algo.guidance  # noqa: F401  (registers the luffy policy loss and the nll_phi term)
import reinforge.algo.losses_clip  # noqa: F401  (registers ce_gppo, dcpo, aspo and the seq_sum_token_mean aggregation)
import reinforge.algo.preference  # noqa: F401  (registers the dpo and ipo policy losses)
import reinforge.algo.pvpo  # noqa: F401  (registers the pvpo estimator)
import reinforge.algo.spo  # noqa: F401  (registers the spo estimator)
import reinforge.algo.supervised  # noqa: F401  (registers the nll loss term)
import reinforge.algo.vineppo  # noqa: F401  (registers the vineppo estimator)
import reinforge.algo.vtrace  # noqa: F401  (registers the vtrace estimator)
from reinforge.algo.advantages import (
    ADVANTAGES,
    gae_advantages_and_returns,
    outcome_token_rewards,
    returns_to_go,
)
from reinforge.algo.kl import KL_ESTIMATORS
from reinforge.algo.kl_control import KLController
from reinforge.algo.losses import LOSS_AGG, POLICY_LOSSES, AggNorm, entropy_from_logits
from reinforge.algo.mismatch import MISMATCH_MODES, mismatch_correction
from reinforge.algo.mixing import MIXING
from reinforge.algo.shaping import REWARD_SHAPERS, soft_overlong_penalty
from reinforge.algo.value import clipped_value_loss, explained_variance

REGISTRIES = {
    "advantage": ADVANTAGES,
    "policy_loss": POLICY_LOSSES,
    "loss_agg": LOSS_AGG,
    "kl_estimator": KL_ESTIMATORS,
    "mixing": MIXING,
}

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSS_AGG",
    "MIXING",
    "MISMATCH_MODES",
    "POLICY_LOSSES",
    "REWARD_SHAPERS",
    "REGISTRIES",
    "AggNorm",
    "KLController",
    "clipped_value_loss",
    "entropy_from_logits",
    "explained_variance",
    "gae_advantages_and_returns",
    "mismatch_correction",
    "outcome_token_rewards",
    "returns_to_go",
    "soft_overlong_penalty",
]
