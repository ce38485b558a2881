"""The learner: model loading, optimizer, micro-batched policy updates, checkpoints."""
