"""Pure tensor math of RL post-training: advantage estimators, policy losses, aggregation, KL.

Every part is a plain function registered by name; see ``reinforge algos`` for the list. Importing
this package imports every module of it, so every built-in algorithm part is registered by
``import reinforge.algo`` alone (a new module of ``algo/`` needs no list to be edited). The helpers
outside the registries (value loss, KL controller, mismatch correction, reward shaping) are
exported here too.
"""

import importlib
import pkgutil

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.aggregation import LOSS_AGG, AggNorm
from reinforge.algo.entropy import entropy_from_logits
from reinforge.algo.kl import KL_ESTIMATORS, KLController
from reinforge.algo.mismatch import MISMATCH_MODES, mismatch_correction
from reinforge.algo.mixing import MIXING
from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.algo.returns import gae_advantages_and_returns, outcome_token_rewards, returns_to_go
from reinforge.algo.shaping import REWARD_SHAPERS, soft_overlong_penalty
from reinforge.algo.value import clipped_value_loss, explained_variance

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")  # registers the module's parts (in name order)
del _module

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
