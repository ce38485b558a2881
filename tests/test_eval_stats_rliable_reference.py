"""reinforge.eval.stats against a golden file of rliable's outputs (tests/data/rliable_reference.json).

The same comparisons as the rliable parity tests at the bottom of tests/test_eval_stats.py, with the
same tolerances, but against values recorded from the real rliable 1.2.0 by
scripts/make_rliable_reference.py, so they run everywhere: rliable itself does not import next to
pandas 3 and is never imported here. Regenerate the file with that script (see its docstring).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reinforge.eval.stats import (
    aggregate_iqm,
    aggregate_mean,
    aggregate_median,
    aggregate_optimality_gap,
    iqm,
    performance_profile,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)

REFERENCE = Path(__file__).parent / "data" / "rliable_reference.json"
KEYS = ("a", "b")


@pytest.fixture(scope="module")
def ref() -> dict:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="module")
def score_dict(ref) -> dict[str, np.ndarray]:
    return {key: np.array(ref["scores"][key], dtype=float) for key in KEYS}


def _ties(x: np.ndarray) -> np.ndarray:
    return np.round(x * 2) / 2


def test_reference_records_rliable_on_the_fixture_scores(ref, score_dict) -> None:
    assert ref["versions"]["rliable"] == "1.2.0"
    assert ref["made_by"]["command"].startswith("python scripts/make_rliable_reference.py")
    rng = np.random.default_rng(10)  # the fixture of tests/test_eval_stats.py
    regenerated = {"a": rng.gamma(2.0, 0.5, size=(10, 5)), "b": rng.gamma(2.5, 0.5, size=(8, 5))}
    for key in KEYS:
        np.testing.assert_array_equal(score_dict[key], regenerated[key])  # json floats round-trip exactly
    assert ref["probability_of_improvement"]["ties_rounding"] == "np.round(x * 2) / 2"
    np.testing.assert_array_equal(ref["performance_profile"]["taus"], np.linspace(0.0, 3.0, 31))


@pytest.mark.parametrize("key", KEYS)
def test_point_estimates_match_rliable_reference(ref, score_dict, key: str) -> None:
    s, theirs = score_dict[key], ref["point_estimates"][key]
    assert aggregate_mean(s) == pytest.approx(theirs["mean"])
    assert aggregate_median(s) == pytest.approx(theirs["median"])
    assert aggregate_iqm(s) == pytest.approx(theirs["iqm"])
    assert aggregate_optimality_gap(s) == pytest.approx(theirs["optimality_gap"])
    assert iqm(s[:7]) == pytest.approx(theirs["iqm_first_7_runs"])  # 35 cells: int(8.75) = 8 cut per side


def test_probability_of_improvement_matches_rliable_reference(ref, score_dict) -> None:
    a, b = score_dict["a"], score_dict["b"]
    theirs = ref["probability_of_improvement"]
    assert probability_of_improvement(a, b) == pytest.approx(theirs["a_over_b"])
    assert probability_of_improvement(b, a) == pytest.approx(theirs["b_over_a"])
    assert probability_of_improvement(_ties(a), _ties(b)) == pytest.approx(theirs["ties_a_over_b"])


def _close_interval(ours: tuple, theirs: dict, slack: float = 0.05) -> None:
    """Endpoints agree up to Monte Carlo error: a fraction of the interval's width."""
    tol = slack * (theirs["high"] - theirs["low"])
    assert ours[1] == pytest.approx(theirs["low"], abs=tol)
    assert ours[2] == pytest.approx(theirs["high"], abs=tol)


@pytest.mark.parametrize(
    ("name", "fn"), [("iqm", aggregate_iqm), ("optimality_gap", aggregate_optimality_gap)]
)
@pytest.mark.parametrize("key", KEYS)
def test_intervals_match_rliable_reference(ref, score_dict, name: str, fn, key: str) -> None:
    theirs = ref["interval_estimates"][name][key]
    ours = stratified_bootstrap_ci(score_dict[key], fn, n_boot=4000, seed=1)
    assert ours[0] == pytest.approx(theirs["point"])
    _close_interval(ours, theirs)


def test_probability_of_improvement_interval_matches_rliable_reference(ref, score_dict) -> None:
    theirs = ref["probability_of_improvement_ci"]["a_over_b"]
    ours = probability_of_improvement_ci(score_dict["a"], score_dict["b"], n_boot=4000, seed=1)
    assert ours[0] == pytest.approx(theirs["point"])
    _close_interval(ours, theirs, slack=0.05)


@pytest.mark.parametrize("key", KEYS)
def test_performance_profile_matches_rliable_reference(ref, score_dict, key: str) -> None:
    s, theirs = score_dict[key], ref["performance_profile"][key]
    point, low, high = performance_profile(s, ref["performance_profile"]["taus"], n_boot=4000, seed=2)
    np.testing.assert_allclose(point, theirs["profile"])
    # bands: percentiles of a discrete statistic (multiples of 1/50 or 1/40), equal up to one step
    np.testing.assert_allclose(low, theirs["low"], atol=1.01 / s.size)
    np.testing.assert_allclose(high, theirs["high"], atol=1.01 / s.size)
