"""Aggregates and bootstrap intervals of reinforge.eval.stats against worked examples and rliable."""

from __future__ import annotations

import numpy as np
import pytest

from reinforge.eval.stats import (
    AGGREGATES,
    aggregate_iqm,
    aggregate_mean,
    aggregate_median,
    aggregate_optimality_gap,
    bootstrap_ci,
    iqm,
    performance_profile,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)

# ---- IQM: scipy.stats.trim_mean(x, 0.25) on the flattened array, cutting int(0.25 n) per side ----


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        (list(range(1, 9)), (3 + 4 + 5 + 6) / 4),  # n=8: cut 2 per side
        (list(range(1, 11)), (3 + 4 + 5 + 6 + 7 + 8) / 6),  # n=10: int(2.5) = 2 per side
        ([1, 2, 3, 4, 100], (2 + 3 + 4) / 3),  # n=5: int(1.25) = 1 per side
        ([100, -50, 3, 4, 5, 6, 1, 2], (2 + 3 + 4 + 5) / 4),  # unsorted, outliers on both sides
        ([1.0, 2.0, 9.0], 4.0),  # n=3: int(0.75) = 0, nothing cut
    ],
)
def test_iqm_by_hand(scores: list[float], expected: float) -> None:
    assert iqm(scores) == pytest.approx(expected)


def test_iqm_of_a_matrix_trims_the_flattened_scores() -> None:
    m = np.array([[8.0, 1.0, 6.0, 3.0], [2.0, 7.0, 4.0, 5.0]])  # 1..8 spread over 2 runs x 4 tasks
    assert iqm(m) == pytest.approx(4.5)
    assert aggregate_iqm(m) == pytest.approx(4.5)
    m[0, 0] = 1000.0  # an outlier run moves the mean, not the IQM
    assert aggregate_iqm(m) == pytest.approx(4.5)
    assert aggregate_mean(m) > 100


def test_aggregates_by_hand() -> None:
    m = np.array([[0.2, 1.5, 0.0], [0.6, 0.5, 0.4]])  # 2 runs x 3 tasks; task means 0.4, 1.0, 0.2
    assert aggregate_mean(m) == pytest.approx((0.4 + 1.0 + 0.2) / 3)
    assert aggregate_median(m) == pytest.approx(0.4)  # median over tasks of task means
    # clipped at 1: 0.2 + 1 + 0 + 0.6 + 0.5 + 0.4 = 2.7 over 6 cells
    assert aggregate_optimality_gap(m) == pytest.approx(1 - 2.7 / 6)
    assert aggregate_optimality_gap(m, gamma=0.5) == pytest.approx(0.5 - (0.2 + 0.5 + 0 + 0.5 + 0.5 + 0.4) / 6)


@pytest.mark.parametrize("name", list(AGGREGATES))
def test_aggregates_broadcast_over_resamples(name: str) -> None:
    """The vectorised call on a batch of matrices equals one call per matrix."""
    batch = np.random.default_rng(0).normal(size=(7, 5, 3))
    fn = AGGREGATES[name]
    np.testing.assert_allclose(fn(batch), [fn(m) for m in batch])


# ---- percentile bootstrap over prompts ----


def test_bootstrap_ci_covers_the_true_mean_with_normal_theory_width() -> None:
    values = np.random.default_rng(3).normal(3.0, 1.0, size=200)
    point, low, high = bootstrap_ci(values, seed=0)
    assert point == pytest.approx(values.mean())
    assert low < 3.0 < high
    normal_width = 2 * 1.96 * values.std(ddof=1) / np.sqrt(values.size)
    assert high - low == pytest.approx(normal_width, rel=0.15)


def test_bootstrap_ci_of_a_proportion() -> None:
    """70 correct of 100 prompts: the interval is about 0.7 +- 1.96 sqrt(0.21 / 100) = 0.7 +- 0.090."""
    values = np.array([1.0] * 70 + [0.0] * 30)
    point, low, high = bootstrap_ci(values, n_boot=4000, seed=1)
    assert point == pytest.approx(0.7)
    assert low == pytest.approx(0.610, abs=0.02)
    assert high == pytest.approx(0.790, abs=0.02)


def test_bootstrap_ci_shrinks_like_one_over_sqrt_n() -> None:
    rng = np.random.default_rng(4)
    widths = {}
    for n in (50, 800):
        _, low, high = bootstrap_ci(rng.exponential(size=n), seed=0)
        widths[n] = high - low
    assert 3.0 < widths[50] / widths[800] < 5.5  # sqrt(800 / 50) = 4


def test_bootstrap_ci_coverage() -> None:
    """About 95% of the 95% intervals of 200 samples of 40 exponential draws cover the true mean 1."""
    rng = np.random.default_rng(5)
    covered = 0
    for i in range(200):
        _, low, high = bootstrap_ci(rng.exponential(size=40), n_boot=1000, seed=i)
        covered += low <= 1.0 <= high
    assert 0.87 <= covered / 200 <= 0.99


def test_bootstrap_ci_degenerate_seeded_and_per_column() -> None:
    assert bootstrap_ci([0.5] * 10) == (0.5, 0.5, 0.5)
    values = np.random.default_rng(6).normal(size=(60, 2)) + [0.0, 10.0]
    point, low, high = bootstrap_ci(values, statistic=np.median, seed=2)
    assert point.shape == low.shape == high.shape == (2,)
    assert np.all(low < point) and np.all(point < high)
    assert 9 < low[1] < 10 < high[1]
    assert bootstrap_ci(values[:, 0], seed=2) == bootstrap_ci(values[:, 0], seed=2)
    assert bootstrap_ci(values[:, 0], seed=2) != bootstrap_ci(values[:, 0], seed=3)
    with pytest.raises(ValueError):
        bootstrap_ci([], seed=0)


# ---- stratified bootstrap over runs within tasks ----


def test_stratified_bootstrap_keeps_every_task_in_every_resample() -> None:
    """Task 0 always scores 0, task 1 always 1: resampling runs within tasks cannot move the mean;
    resampling cells of the matrix regardless of task would."""
    m = np.array([[0.0, 1.0]] * 5)
    assert stratified_bootstrap_ci(m, aggregate_mean, seed=0) == (0.5, 0.5, 0.5)


def test_stratified_bootstrap_interval_contains_point_and_shrinks_with_runs() -> None:
    rng = np.random.default_rng(7)
    widths = []
    for runs in (8, 128):  # 16x the runs: about 4x narrower (less with few runs, where bootstrap is narrow)
        m = rng.normal(0.5, 0.1, size=(runs, 3))
        point, low, high = stratified_bootstrap_ci(m, aggregate_iqm, seed=0)
        assert point == pytest.approx(iqm(m))
        assert low < point < high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2


# ---- probability of improvement ----


def test_probability_of_improvement_by_hand() -> None:
    assert probability_of_improvement([[1.0], [3.0]], [[2.0], [2.0]]) == pytest.approx(0.5)
    # pairs (3,1) (3,2) (2,1) win, (2,2) ties: (3 + 0.5) / 4
    assert probability_of_improvement([[3.0], [2.0]], [[1.0], [2.0]]) == pytest.approx(0.875)
    # unequal numbers of runs: x in {1,2,3} against y = 2: 0 + 0.5 + 1 over 3 pairs
    assert probability_of_improvement([[1.0], [2.0], [3.0]], [[2.0]]) == pytest.approx(0.5)
    # averaged over tasks: X wins task 0 always, loses task 1 always
    assert probability_of_improvement([[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0]]) == pytest.approx(0.5)


def test_probability_of_improvement_identical_and_dominating() -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(10, 3))
    assert probability_of_improvement(x, x) == pytest.approx(0.5)
    assert probability_of_improvement(x + 100, x) == 1.0
    assert probability_of_improvement(x, x + 100) == 0.0
    y = rng.normal(size=(7, 3))
    assert probability_of_improvement(x, y) + probability_of_improvement(y, x) == pytest.approx(1.0)
    assert probability_of_improvement_ci(x + 100, x) == (1.0, 1.0, 1.0)
    point, low, high = probability_of_improvement_ci(x + 0.5, y, seed=0)
    assert low < point < high
    with pytest.raises(ValueError):
        probability_of_improvement(x, y[:, :2])


# ---- performance profiles ----


def test_performance_profile_by_hand_and_monotone() -> None:
    m = np.array([[0.1, 0.5], [0.3, 0.9]])
    point, _, _ = performance_profile(m, [0.0, 0.2, 0.4, 0.6, 1.0])
    # task 0 runs above tau: 2, 1, 0, 0, 0 of 2; task 1: 2, 2, 2, 1, 0 of 2
    np.testing.assert_allclose(point, [1.0, 0.75, 0.5, 0.25, 0.0])
    scores = np.random.default_rng(9).normal(size=(12, 4))
    taus = np.linspace(-3, 3, 61)
    point, low, high = performance_profile(scores, taus, seed=0)
    assert np.all(np.diff(point) <= 0)
    assert point[0] == 1.0 and point[-1] == 0.0
    assert np.all(low <= point) and np.all(point <= high)
    assert np.all(np.diff(low) <= 0) and np.all(np.diff(high) <= 0)
    assert np.any(high - low > 0.1)


# ---- parity with rliable (only where it imports: rliable 1.2.0's `arch` fails with pandas 3) ----


@pytest.fixture(scope="module")
def rliable():
    try:
        from rliable import library, metrics
    except Exception as e:  # ImportError, or arch's own errors under pandas 3
        pytest.skip(f"rliable does not import here ({type(e).__name__}: {e}); rliable 1.2.0 needs pandas<3 for its arch dependency")
    return library, metrics


@pytest.fixture(scope="module")
def score_dict() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(10)
    return {"a": rng.gamma(2.0, 0.5, size=(10, 5)), "b": rng.gamma(2.5, 0.5, size=(8, 5))}


def test_point_estimates_match_rliable(rliable, score_dict) -> None:
    _, metrics = rliable
    for s in score_dict.values():
        assert aggregate_mean(s) == pytest.approx(metrics.aggregate_mean(s))
        assert aggregate_median(s) == pytest.approx(metrics.aggregate_median(s))
        assert aggregate_iqm(s) == pytest.approx(metrics.aggregate_iqm(s))
        assert aggregate_optimality_gap(s) == pytest.approx(metrics.aggregate_optimality_gap(s))
        odd = s[:7]  # 35 cells: int(8.75) = 8 cut per side
        assert iqm(odd) == pytest.approx(metrics.aggregate_iqm(odd))
    a, b = score_dict["a"], score_dict["b"]
    assert probability_of_improvement(a, b) == pytest.approx(metrics.probability_of_improvement(a, b))
    ties = np.round(a * 2) / 2
    assert probability_of_improvement(ties, np.round(b * 2) / 2) == pytest.approx(
        metrics.probability_of_improvement(ties, np.round(b * 2) / 2)
    )


def _close_interval(ours: tuple, theirs: np.ndarray, slack: float = 0.08) -> None:
    """Endpoints agree up to Monte Carlo error: a fraction of the interval's width."""
    low, high = float(np.ravel(theirs[0])[0]), float(np.ravel(theirs[1])[0])
    tol = slack * (high - low)
    assert ours[1] == pytest.approx(low, abs=tol)
    assert ours[2] == pytest.approx(high, abs=tol)


def test_intervals_match_rliable(rliable, score_dict) -> None:
    library, metrics = rliable
    np.random.seed(0)  # rliable's StratifiedBootstrap draws from numpy's global generator
    for name, fn, theirs_fn in [
        ("iqm", aggregate_iqm, metrics.aggregate_iqm),
        ("optimality_gap", aggregate_optimality_gap, metrics.aggregate_optimality_gap),
    ]:
        points, cis = library.get_interval_estimates(
            score_dict, lambda s, f=theirs_fn: np.array([f(s)]), reps=4000
        )
        for key, s in score_dict.items():
            ours = stratified_bootstrap_ci(s, fn, n_boot=4000, seed=1)
            assert ours[0] == pytest.approx(float(points[key][0])), name
            _close_interval(ours, cis[key])
    pair = {"a,b": [score_dict["a"], score_dict["b"]]}
    points, cis = library.get_interval_estimates(pair, metrics.probability_of_improvement, reps=2000)
    ours = probability_of_improvement_ci(score_dict["a"], score_dict["b"], n_boot=4000, seed=1)
    assert ours[0] == pytest.approx(float(np.ravel(points["a,b"])[0]))
    _close_interval(ours, np.reshape(cis["a,b"], (2, 1)), slack=0.1)


def test_performance_profile_matches_rliable(rliable, score_dict) -> None:
    library, _ = rliable
    taus = np.linspace(0.0, 3.0, 31)
    np.random.seed(1)
    profiles, bands = library.create_performance_profile(score_dict, taus, reps=4000)
    for key, s in score_dict.items():
        point, low, high = performance_profile(s, taus, n_boot=4000, seed=2)
        np.testing.assert_allclose(point, profiles[key])
        # bands: percentiles of a discrete statistic (multiples of 1/50 or 1/40), equal up to one step
        np.testing.assert_allclose(low, bands[key][0], atol=1.01 / s.size)
        np.testing.assert_allclose(high, bands[key][1], atol=1.01 / s.size)
