"""Rewards: verifiers that score a completion for a task."""

from reinforge.rewards.verifiers import VERIFIERS, RewardResult

__all__ = ["VERIFIERS", "RewardResult"]
