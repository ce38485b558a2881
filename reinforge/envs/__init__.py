"""Environments: turn a task into an episode (single-turn verifier tasks are the one-step case)."""

from reinforge.envs.base import Environment, StepResult
from reinforge.envs.single_turn import SingleTurnEnv

__all__ = ["Environment", "SingleTurnEnv", "StepResult"]
