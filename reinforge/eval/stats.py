"""Aggregate metrics with bootstrap confidence intervals, after Agarwal et al. 2021,
"Deep RL at the Edge of the Statistical Precipice" (arXiv:2108.13264), the paper behind `rliable`.

Scores of several runs (seeds) of one algorithm on several tasks form a ``[runs x tasks]`` matrix.
The aggregates reduce its last two axes and broadcast over any leading axes, so that all the
bootstrap resamples are reduced in one vectorised call. Numpy only; the estimators reproduce
``rliable.metrics`` and ``rliable.library`` (percentile intervals), checked in tests/test_eval_stats.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

Aggregate = Callable[[np.ndarray], np.ndarray]
"""``[..., runs, tasks] -> [...]`` (or ``[..., k]`` for vector-valued aggregates such as a profile)."""

_CHUNK_ELEMENTS = 1 << 22  # resampled values held in memory at once (~32 MB of float64)


def _chunks(n_boot: int, per_sample: int) -> Iterator[int]:
    """Split ``n_boot`` resamples into chunks of at most ``_CHUNK_ELEMENTS`` resampled values."""
    size = max(1, _CHUNK_ELEMENTS // max(per_sample, 1))
    for start in range(0, n_boot, size):
        yield min(size, n_boot - start)


def _percentile_interval(samples: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval [q_{alpha/2}, q_{1-alpha/2}] of bootstrap statistics along axis 0."""
    low, high = np.percentile(samples, [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
    return low, high


def _out(x: np.ndarray) -> Any:
    """A scalar as a Python float, an array as is."""
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


def _check(n_boot: int, alpha: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def bootstrap_ci(
    values: np.ndarray | list[float],
    statistic: Callable[..., Any] = np.mean,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[Any, Any, Any]:
    """Percentile bootstrap: ``(statistic(values), low, high)``, resampling the first axis (prompts).

    Each of ``n_boot`` resamples draws n rows of ``values`` with replacement; the interval is the
    [alpha/2, 1 - alpha/2] percentiles of the resampled statistic (Efron & Tibshirani 1993, ch. 13).
    ``statistic`` must reduce an ``axis`` keyword like numpy's reductions (np.mean, np.median, ...).
    A 2-D ``values`` (prompts x columns) gives one interval per column.
    """
    _check(n_boot, alpha)
    values = np.asarray(values, dtype=float)
    if values.ndim == 0 or values.shape[0] == 0:
        raise ValueError("bootstrap_ci needs at least one value along the first axis")
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    stats = []
    for b in _chunks(n_boot, values.size):
        idx = rng.integers(0, n, size=(b, n))
        stats.append(np.asarray(statistic(values[idx], axis=1), dtype=float))
    low, high = _percentile_interval(np.concatenate(stats), alpha)
    return _out(statistic(values, axis=0)), _out(low), _out(high)


def _trimmed_mean_last(x: np.ndarray, proportion: float) -> np.ndarray:
    """scipy.stats.trim_mean's rule on the last axis: sort, cut int(proportion * n) from each end."""
    n = x.shape[-1]
    cut = int(proportion * n)
    return np.sort(x, axis=-1)[..., cut : n - cut].mean(axis=-1)


def iqm(scores: np.ndarray | list[float]) -> float:
    """Interquartile mean of all scores: the mean of the middle 50% after sorting.

    IQM = mean(sorted(x)[g : n - g]) with g = int(0.25 n), exactly scipy.stats.trim_mean(x, 0.25)
    on the flattened array (rliable's ``aggregate_iqm``). Robust to outlier runs like the median,
    but uses half of the data, so its intervals are narrower (Agarwal et al. 2021, sec. 4.3).
    """
    x = np.asarray(scores, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("iqm of an empty array")
    return float(_trimmed_mean_last(x, 0.25))


def _as_matrix_batch(scores: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores, dtype=float)
    if scores.ndim < 2:
        raise ValueError(f"expected a [runs x tasks] score matrix (or a batch of them), got shape {scores.shape}")
    return scores


def aggregate_mean(scores: np.ndarray) -> np.ndarray:
    """Mean over tasks of the per-task mean over runs: (1/M) sum_m (1/N) sum_n x_{n,m}."""
    return _as_matrix_batch(scores).mean(axis=-2).mean(axis=-1)


def aggregate_median(scores: np.ndarray) -> np.ndarray:
    """Median over tasks of the per-task mean over runs (rliable's definition).

    With a single task this equals the mean over runs: the median is an aggregate across tasks.
    """
    return np.median(_as_matrix_batch(scores).mean(axis=-2), axis=-1)


def aggregate_iqm(scores: np.ndarray) -> np.ndarray:
    """IQM over all runs and tasks together (see :func:`iqm`), per matrix of a batch."""
    scores = _as_matrix_batch(scores)
    return _trimmed_mean_last(scores.reshape(*scores.shape[:-2], -1), 0.25)


def aggregate_optimality_gap(scores: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """Optimality gap: gamma - mean(min(x, gamma)), how far runs fall short of the target gamma."""
    return gamma - np.minimum(_as_matrix_batch(scores), gamma).mean(axis=(-2, -1))


AGGREGATES: dict[str, Aggregate] = {
    "mean": aggregate_mean,
    "median": aggregate_median,
    "iqm": aggregate_iqm,
    "optimality_gap": aggregate_optimality_gap,
}


def _stratified_resample(scores: np.ndarray, b: int, rng: np.random.Generator) -> np.ndarray:
    """``b`` resamples ``[b, runs, tasks]``: runs drawn with replacement independently within each task."""
    n_runs, n_tasks = scores.shape[:2]
    idx = rng.integers(0, n_runs, size=(b, n_runs, n_tasks))
    return scores[idx, np.arange(n_tasks)]


def _matrix(scores: np.ndarray | list[list[float]], name: str = "score_matrix") -> np.ndarray:
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or 0 in scores.shape:
        raise ValueError(f"{name} must be a non-empty [runs x tasks] matrix, got shape {scores.shape}")
    return scores


def stratified_bootstrap_ci(
    score_matrix: np.ndarray | list[list[float]],
    aggregate: Aggregate,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[Any, Any, Any]:
    """Stratified bootstrap percentile interval of ``aggregate(score_matrix)``: ``(point, low, high)``.

    Each resample redraws the N runs of every task with replacement, independently per task (the
    task is the stratum), so each task keeps N runs; the interval is the [alpha/2, 1 - alpha/2]
    percentiles of the aggregate over resamples (Agarwal et al. 2021, sec. 4.1; rliable's default).
    It expresses the uncertainty from the finite number of runs, with the task set held fixed.
    ``aggregate`` reduces the last two axes and broadcasts over leading ones (see :data:`AGGREGATES`).
    """
    _check(n_boot, alpha)
    scores = _matrix(score_matrix)
    rng = np.random.default_rng(seed)
    stats = [np.asarray(aggregate(_stratified_resample(scores, b, rng))) for b in _chunks(n_boot, scores.size)]
    low, high = _percentile_interval(np.concatenate(stats), alpha)
    return _out(aggregate(scores)), _out(low), _out(high)


def _poi(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) per task over all run pairs, averaged over tasks; broadcasts leading axes."""
    xs, ys = x[..., :, None, :], y[..., None, :, :]
    per_task = (xs > ys).mean(axis=(-3, -2)) + 0.5 * (xs == ys).mean(axis=(-3, -2))
    return per_task.mean(axis=-1)


def probability_of_improvement(x: np.ndarray | list[list[float]], y: np.ndarray | list[list[float]]) -> float:
    """Average probability of improvement of X over Y (Agarwal et al. 2021, sec. 4.3).

    P(X > Y) = (1/M) sum_m P(X_m > Y_m), with P(X_m > Y_m) = U_m / (N_x N_y), the Mann-Whitney U
    statistic: (1/(N_x N_y)) sum_{i,j} [1{x_im > y_jm} + 0.5 * 1{x_im = y_jm}]. 0.5 means neither
    algorithm tends to beat the other; it says how often, not by how much.
    """
    x, y = _matrix(x, "x"), _matrix(y, "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must have the same tasks, got {x.shape[1]} and {y.shape[1]} columns")
    return float(_poi(x, y))


def probability_of_improvement_ci(
    x: np.ndarray | list[list[float]],
    y: np.ndarray | list[list[float]],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(P(X > Y), low, high)``: X and Y are resampled independently, each stratified by task."""
    _check(n_boot, alpha)
    point = probability_of_improvement(x, y)
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rng = np.random.default_rng(seed)
    per_sample = x.shape[0] * y.shape[0] * x.shape[1]
    stats = [
        _poi(_stratified_resample(x, b, rng), _stratified_resample(y, b, rng)) for b in _chunks(n_boot, per_sample)
    ]
    low, high = _percentile_interval(np.concatenate(stats), alpha)
    return point, float(low), float(high)


def performance_profile(
    score_matrix: np.ndarray | list[list[float]],
    taus: np.ndarray | list[float],
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run-score distribution F(tau) = (1/M) sum_m (1/N) sum_n 1{x_{n,m} > tau}, for each tau.

    The fraction of runs scoring above tau, averaged over tasks (Agarwal et al. 2021, sec. 4.2;
    rliable's ``create_performance_profile`` with score distributions). Returns the profile and its
    stratified-bootstrap percentile band, three arrays of len(taus). A curve lying above another
    everywhere is stochastically dominant.
    """
    taus = np.asarray(taus, dtype=float).ravel()

    def profile(scores: np.ndarray) -> np.ndarray:  # one pass per tau keeps memory at one resample batch
        return np.stack([(scores > tau).mean(axis=(-2, -1)) for tau in taus], axis=-1)

    point, low, high = stratified_bootstrap_ci(score_matrix, profile, n_boot, alpha, seed)
    return np.atleast_1d(point), np.atleast_1d(low), np.atleast_1d(high)
