"""The unbiased pass@k estimator (Chen et al. 2021, Evaluating LLMs Trained on Code, arXiv:2107.03374)."""

from __future__ import annotations

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k = 1 - C(n - c, k) / C(n, k) for n samples of which c are correct (k <= n).

    Computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), which is numerically stable.
    """
    if not 0 < k <= n:
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(correct_counts: list[int], n: int, k: int) -> float:
    """pass@k averaged over prompts, each with ``n`` samples and ``correct_counts[i]`` correct."""
    return float(np.mean([pass_at_k(n, c, k) for c in correct_counts]))
