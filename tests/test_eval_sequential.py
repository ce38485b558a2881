"""The AdaStop-style sequential test: worked examples, error rate under H0, power under H1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reinforge.eval.sequential import SequentialComparison, spent_alpha


def test_one_look_is_the_exact_permutation_test() -> None:
    """a = 5..8, b = 1..4: of the C(8, 4) = 70 relabellings, |mean difference| is 4 for 2 (the
    observed one and its mirror) and 3.5 for 2 more; alpha = 0.05 allows floor(0.05 * 70) = 3 above
    the boundary, so the boundary is the 4th largest, 3.5, and 4 > 3.5 rejects."""
    test = SequentialComparison(n_per_batch=4, max_batches=1, alpha=0.05)
    d = test.update([5, 6, 7, 8], [1, 2, 3, 4])
    assert (d.decision, d.batch, d.n_seeds) == ("a_better", 1, 4)
    assert d.statistic == pytest.approx(4.0)
    assert d.boundary == pytest.approx(3.5)
    assert d.alpha_spent == pytest.approx(0.05)
    d = SequentialComparison(4, 1, alpha=0.05).update([1, 2, 3, 4], [5, 6, 7, 8])
    assert d.decision == "b_better" and d.statistic == pytest.approx(-4.0)
    # one swap (5 <-> 4) gives |D| = 2: below the boundary, and the last look says "equal"
    assert SequentialComparison(4, 1, alpha=0.05).update([4, 6, 7, 8], [1, 2, 3, 5]).decision == "equal"


def test_too_few_relabellings_can_never_reject() -> None:
    """2 seeds each: only C(4, 2) = 6 relabellings, so a level of 0.05 admits none: the test must
    say "equal" however large the difference, and report an unreachable boundary."""
    d = SequentialComparison(2, 1, alpha=0.05).update([100.0, 101.0], [0.0, 1.0])
    assert d.decision == "equal"
    assert math.isinf(d.boundary)


def test_continues_then_stops_and_refuses_more() -> None:
    test = SequentialComparison(5, 3, alpha=0.05, seed=0)
    rng = np.random.default_rng(0)
    d = test.update(rng.normal(size=5), rng.normal(size=5))
    assert d.decision == "continue" and d.n_seeds == 5
    assert d.alpha_spent == pytest.approx(0.05 / 3)
    while not d.stopped:
        d = test.update(rng.normal(size=5), rng.normal(size=5))
    assert test.finished and d.batch <= 3
    with pytest.raises(RuntimeError):
        test.update(rng.normal(size=5), rng.normal(size=5))
    with pytest.raises(ValueError):
        SequentialComparison(5, 3).update([1.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError):
        SequentialComparison(5, 3, spending="pocock-ish")


def test_spending_functions() -> None:
    linear = [spent_alpha(k, 4, 0.05, "linear") for k in range(1, 5)]
    obf = [spent_alpha(k, 4, 0.05, "obrien_fleming") for k in range(1, 5)]
    np.testing.assert_allclose(linear, [0.0125, 0.025, 0.0375, 0.05])
    assert obf[-1] == pytest.approx(0.05)
    assert np.all(np.diff(obf) > 0) and obf[0] < 1e-3  # spends almost nothing at the first look


def _simulate(delta: float, n: int, max_batches: int, sims: int, seed: int, data: str = "normal",
              spending: str = "linear", n_permutations: int = 2000) -> tuple[list[str], np.ndarray]:
    """``sims`` sequential comparisons of N(delta, 1) against N(0, 1) (or Bernoulli(0.5) pairs)."""
    rng = np.random.default_rng(seed)
    outcomes, seeds_used = [], []
    for i in range(sims):
        test = SequentialComparison(n, max_batches, alpha=0.05, seed=i, spending=spending,
                                    n_permutations=n_permutations)
        for _ in range(max_batches):
            if data == "bernoulli":  # ties everywhere, as with accuracies of small eval sets
                a, b = rng.binomial(1, 0.5, size=(2, n)).astype(float)
            else:
                a, b = rng.normal(delta, 1.0, size=n), rng.normal(0.0, 1.0, size=n)
            d = test.update(a, b)
            if d.stopped:
                break
        outcomes.append(d.decision)
        seeds_used.append(d.n_seeds)
    return outcomes, np.array(seeds_used)


@pytest.mark.parametrize(
    ("data", "spending", "n_permutations"),
    [
        ("normal", "linear", 2000),  # batch 1 enumerated exactly (252 relabellings), then random
        ("normal", "obrien_fleming", 2000),
        ("bernoulli", "linear", 2000),
        ("normal", "linear", 200),  # random relabellings from the first batch on
    ],
)
def test_family_wise_error_under_the_null(data: str, spending: str, n_permutations: int) -> None:
    """No true difference: over 200 comparisons of up to 4 looks, "better" at most about alpha = 0.05
    of the time (binomial sd 0.015; 0.10 is 3 sd above). Four unadjusted looks at level 0.05
    would reject about 0.13 of the time (Armitage et al. 1969)."""
    outcomes, seeds = _simulate(0.0, 5, 4, 200, seed=11, data=data, spending=spending, n_permutations=n_permutations)
    rejected = sum(o in ("a_better", "b_better") for o in outcomes) / len(outcomes)
    assert rejected <= 0.10
    assert set(outcomes) <= {"a_better", "b_better", "equal"}
    if data == "normal":
        assert rejected >= 0.01  # the level is used, not wasted: an exact test rejects about alpha
    assert np.all(seeds[np.array(outcomes) == "equal"] == 20)  # "equal" only after all looks


@pytest.mark.parametrize("delta", [1.5, -1.5])
def test_power_and_early_stopping_under_a_clear_difference(delta: float) -> None:
    """Means 1.5 apart (sd 1): the right winner in nearly every comparison, mostly well before 20 seeds."""
    outcomes, seeds = _simulate(delta, 5, 4, 200, seed=12)
    right, wrong = ("a_better", "b_better") if delta > 0 else ("b_better", "a_better")
    assert outcomes.count(right) / len(outcomes) >= 0.9
    assert outcomes.count(wrong) == 0
    assert seeds.mean() <= 15  # of at most 20 per agent
    assert np.mean(seeds <= 10) >= 0.5  # half the comparisons stop at the first or second look
