"""Evaluation: held-out accuracy, pass@k."""
