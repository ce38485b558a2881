"""Rewards: verifiers that score a completion for a task. Importing this package registers them all."""

import reinforge.data.reasoning_gym  # noqa: F401  (registers the reasoning_gym verifier)
from reinforge.rewards import code as _code  # noqa: F401  (registers code_tests)
from reinforge.rewards.verifiers import VERIFIERS, RewardResult

__all__ = ["VERIFIERS", "RewardResult"]
