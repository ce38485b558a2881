"""Record the outputs of the real `rliable` on fixed scores, as a golden file for reinforge's tests.

Why: ``reinforge/eval/stats.py`` re-implements rliable's estimators (Agarwal et al. 2021, "Deep RL
at the Edge of the Statistical Precipice"). The parity tests at the bottom of
tests/test_eval_stats.py call rliable directly, but rliable 1.2.0 does not import next to pandas 3
(its ``arch`` dependency breaks), so in reinforge's own environment they are always skipped. This
script runs rliable once, in a throwaway environment where it does import, and writes what it
returns to ``tests/data/rliable_reference.json``; tests/test_eval_stats_rliable_reference.py then
checks reinforge against that file on every run, with no rliable needed.

The script is standalone: it imports only numpy and rliable (never reinforge, never torch). Run it
from the repository root in its own venv:

    python3 -m venv /tmp/rliable-venv
    /tmp/rliable-venv/bin/pip install "rliable==1.2.0" "pandas<3" numpy scipy
    /tmp/rliable-venv/bin/python scripts/make_rliable_reference.py [--out tests/data/rliable_reference.json]

What it records, for the score matrices of the fixture in tests/test_eval_stats.py
(``rng = np.random.default_rng(10)``; ``a`` = gamma(2.0, 0.5) of 10 runs x 5 tasks, then
``b`` = gamma(2.5, 0.5) of 8 runs x 5 tasks), in the order and with the global numpy seeds that
test uses (rliable's bootstrap draws from ``np.random``):

* the score arrays themselves, and the versions of rliable / numpy / scipy / pandas / arch used;
* point estimates per key: ``metrics.aggregate_mean``, ``aggregate_median``, ``aggregate_iqm``,
  ``aggregate_optimality_gap``, and ``aggregate_iqm`` of the first 7 runs (35 cells, an odd size);
* ``metrics.probability_of_improvement`` of a over b, of b over a, and of the scores rounded to
  halves (``np.round(x * 2) / 2``, which makes ties);
* after ``np.random.seed(0)``: ``library.get_interval_estimates`` 95% percentile intervals of the
  IQM, then the optimality gap (reps=4000 each, keys a then b), then of probability of improvement
  of a over b (reps=2000), all drawing from the one seeded stream in that order;
* after ``np.random.seed(1)``: ``library.create_performance_profile`` (score distributions, reps=4000)
  over ``taus = np.linspace(0, 3, 31)``: the profiles and their 95% bands.

Monte Carlo intervals depend on the random stream, so the tests compare them only up to a fraction
of their width; the point estimates and profiles are deterministic and compared tightly.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
from rliable import library, metrics

SEED = 10
ENVIRONMENT = 'python3 -m venv /tmp/rliable-venv && /tmp/rliable-venv/bin/pip install "rliable==1.2.0" "pandas<3" numpy scipy'
TAUS = np.linspace(0.0, 3.0, 31)
ODD_RUNS = 7  # s[:7]: 35 cells, int(0.25 * 35) = 8 cut per side
INTERVAL_SEED, INTERVAL_REPS, POI_REPS = 0, 4000, 2000
PROFILE_SEED, PROFILE_REPS = 1, 4000


def score_dict() -> dict[str, np.ndarray]:
    """The fixture of tests/test_eval_stats.py."""
    rng = np.random.default_rng(SEED)
    return {"a": rng.gamma(2.0, 0.5, size=(10, 5)), "b": rng.gamma(2.5, 0.5, size=(8, 5))}


def to_ties(x: np.ndarray) -> np.ndarray:
    return np.round(x * 2) / 2


def _f(x) -> float:
    """A one-element array or scalar as a Python float (json writes its repr, which round-trips)."""
    x = np.ravel(np.asarray(x, dtype=float))
    assert x.size == 1, x.shape
    return float(x[0])


def _interval(point, ci) -> dict[str, float]:
    ci = np.reshape(np.asarray(ci, dtype=float), (2, -1))
    return {"point": _f(point), "low": _f(ci[0]), "high": _f(ci[1])}


def build() -> dict:
    scores = score_dict()
    a, b = scores["a"], scores["b"]

    points = {
        key: {
            "mean": _f(metrics.aggregate_mean(s)),
            "median": _f(metrics.aggregate_median(s)),
            "iqm": _f(metrics.aggregate_iqm(s)),
            "optimality_gap": _f(metrics.aggregate_optimality_gap(s)),
            f"iqm_first_{ODD_RUNS}_runs": _f(metrics.aggregate_iqm(s[:ODD_RUNS])),
        }
        for key, s in scores.items()
    }
    poi = {
        "a_over_b": _f(metrics.probability_of_improvement(a, b)),
        "b_over_a": _f(metrics.probability_of_improvement(b, a)),
        "ties_a_over_b": _f(metrics.probability_of_improvement(to_ties(a), to_ties(b))),
    }

    np.random.seed(INTERVAL_SEED)  # one stream for all of the calls below, in this order
    intervals: dict[str, dict] = {}
    for name, fn in [("iqm", metrics.aggregate_iqm), ("optimality_gap", metrics.aggregate_optimality_gap)]:
        pts, cis = library.get_interval_estimates(
            scores, lambda s, f=fn: np.array([f(s)]), reps=INTERVAL_REPS
        )
        intervals[name] = {key: _interval(pts[key], cis[key]) for key in scores}
    pts, cis = library.get_interval_estimates(
        {"a,b": [a, b]}, metrics.probability_of_improvement, reps=POI_REPS
    )
    poi_ci = _interval(pts["a,b"], cis["a,b"])

    np.random.seed(PROFILE_SEED)
    profiles, bands = library.create_performance_profile(scores, TAUS, reps=PROFILE_REPS)
    profile = {
        key: {
            "profile": np.asarray(profiles[key], dtype=float).tolist(),
            "low": np.asarray(bands[key][0], dtype=float).tolist(),
            "high": np.asarray(bands[key][1], dtype=float).tolist(),
        }
        for key in scores
    }

    return {
        "description": (
            "Outputs of rliable on fixed scores, the golden file of tests/test_eval_stats_rliable_reference.py. "
            "Generated by scripts/make_rliable_reference.py (see its docstring); do not edit by hand."
        ),
        "made_by": {"environment": ENVIRONMENT, "command": " ".join(["python", *sys.argv])},
        "versions": {
            "python": platform.python_version(),
            **{pkg: version(pkg) for pkg in ("rliable", "numpy", "scipy", "pandas", "arch")},
        },
        "scores": {
            "generator": f"rng = np.random.default_rng({SEED}); "
            "a = rng.gamma(2.0, 0.5, size=(10, 5)); b = rng.gamma(2.5, 0.5, size=(8, 5))",
            **{key: s.tolist() for key, s in scores.items()},
        },
        "point_estimates": points,
        "probability_of_improvement": {"ties_rounding": "np.round(x * 2) / 2", **poi},
        "interval_estimates": {
            "method": "percentile",
            "confidence": 0.95,
            "np_random_seed": INTERVAL_SEED,
            "reps": INTERVAL_REPS,
            **intervals,
        },
        "probability_of_improvement_ci": {"reps": POI_REPS, "a_over_b": poi_ci},
        "performance_profile": {
            "np_random_seed": PROFILE_SEED,
            "reps": PROFILE_REPS,
            "confidence": 0.95,
            "taus": TAUS.tolist(),
            **profile,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/rliable_reference.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
