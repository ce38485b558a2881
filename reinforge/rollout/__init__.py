"""Rollout engines: generate tokens for many episodes at once, with sampling log-probabilities."""

from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams

__all__ = ["Generation", "GenerationRequest", "SamplingParams"]
