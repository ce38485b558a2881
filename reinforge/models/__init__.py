"""Model code shared by rollout and training."""
