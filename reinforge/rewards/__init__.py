"""Rewards: verifiers that score a completion for a task (``code_tests`` runs code in the sandbox)."""

from reinforge.rewards import code as _code  # noqa: F401  (registers the code_tests verifier)
from reinforge.rewards.verifiers import VERIFIERS, RewardResult

__all__ = ["VERIFIERS", "RewardResult"]
