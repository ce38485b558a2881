"""Orchestration: the loop that connects tasks, rollout, rewards, advantages and the learner."""
