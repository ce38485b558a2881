"""OpenAI-compatible serving of the rollout engine: ``reinforge serve --model PATH``."""
