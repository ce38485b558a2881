"""`reinforge compare RUN...`: aggregate a metric over runs (seeds) of several algorithms.

Each run's score is the last value of a metric in its metrics.jsonl (or the mean of its last K
values); runs are grouped into algorithms by a config key or by explicit ``name=path1,path2``
groups. Per group: mean, median, IQM and optimality gap with stratified bootstrap intervals;
per pair: the probability of improvement; and performance profiles (Agarwal et al. 2021, see
reinforge/eval/stats.py). Optionally an AdaStop-style sequential decision between two groups,
replayed over their finished seeds in seed order (reinforge/eval/sequential.py).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reinforge.errors import ConfigError
from reinforge.eval.runs import DEFAULT_METRIC, Run, group_runs
from reinforge.eval.sequential import Decision, SequentialComparison
from reinforge.eval.stats import (
    AGGREGATES,
    performance_profile,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)


@dataclass
class Interval:
    point: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.point:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass
class GroupSummary:
    runs: list[str]
    scores: list[list[float]]  # [runs x tasks]
    estimates: dict[str, Interval]  # aggregate name -> point and interval


@dataclass
class Improvement:
    x: str
    y: str
    poi: Interval  # P(X > Y)


@dataclass
class SequentialReport:
    """The replayed sequential test: the decision at each look and the final one."""

    a: str
    b: str
    n_per_batch: int
    max_batches: int
    alpha: float
    decisions: list[Decision]
    seeds_available: int  # per agent

    @property
    def final(self) -> Decision:
        return self.decisions[-1]

    def summary(self) -> str:
        d = self.final
        verdict = {
            "a_better": f"{self.a} is better than {self.b}",
            "b_better": f"{self.b} is better than {self.a}",
            "equal": f"no significant difference between {self.a} and {self.b} after all {self.max_batches} batches",
            "continue": f"not decided yet: more seeds needed (planned up to {self.max_batches * self.n_per_batch} per group)",
        }[d.decision]
        bound = "inf" if math.isinf(d.boundary) else f"{d.boundary:.4g}"
        return (
            f"sequential test (AdaStop, alpha={self.alpha:g}, {self.n_per_batch} seeds per batch): {verdict}; "
            f"decision '{d.decision}' after {d.batch} batch(es), {d.n_seeds} seeds per group "
            f"({2 * d.n_seeds} in all, {self.seeds_available} available per group); "
            f"mean difference {d.statistic:.4g}, boundary +-{bound}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a, "b": self.b, "n_per_batch": self.n_per_batch, "max_batches": self.max_batches,
            "alpha": self.alpha, "seeds_available": self.seeds_available, "decision": self.final.decision,
            "n_seeds": self.final.n_seeds, "looks": [d.as_dict() for d in self.decisions],
        }


@dataclass
class CompareResult:
    metrics: list[str]
    last_k: int
    alpha: float
    n_boot: int
    groups: dict[str, GroupSummary]
    improvements: list[Improvement]
    taus: list[float]
    profiles: dict[str, dict[str, list[float]]]  # group -> {"point", "low", "high"}
    sequential: SequentialReport | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: non-finite floats (an unreachable boundary) become strings, as in metrics.jsonl."""
        out = asdict(self)
        out["sequential"] = self.sequential.as_dict() if self.sequential else None
        return _finite(out)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def sequential_from_runs(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    n_per_batch: int,
    alpha: float = 0.05,
    max_batches: int | None = None,
    seed: int = 0,
    names: tuple[str, str] = ("a", "b"),
) -> SequentialReport:
    """Replay the sequential test over finished seeds, in the order given, batch by batch.

    ``max_batches`` is the planned number of looks K (default: as many full batches as both groups
    have); if the seeds run out before the test stops, the decision stays "continue" (more seeds
    needed). The guarantee holds when n and K were fixed before looking at the scores.
    """
    if n_per_batch < 1 or (max_batches is not None and max_batches < 1):
        raise ConfigError(f"sequential test: need n_per_batch >= 1 and max_batches >= 1, got {n_per_batch}, {max_batches}")
    available = min(len(scores_a), len(scores_b))
    batches = available // n_per_batch
    if batches < 1:
        raise ConfigError(f"sequential test: need at least {n_per_batch} seeds per group, got {available}")
    max_batches = batches if max_batches is None else max_batches
    test = SequentialComparison(n_per_batch, max_batches, alpha=alpha, seed=seed)
    for k in range(min(batches, max_batches)):
        window = slice(k * n_per_batch, (k + 1) * n_per_batch)
        if test.update(np.asarray(scores_a)[window], np.asarray(scores_b)[window]).stopped:
            break
    return SequentialReport(names[0], names[1], n_per_batch, max_batches, alpha, test.decisions, available)


def _default_taus(scores: list[np.ndarray], n: int = 101) -> np.ndarray:
    pooled = np.concatenate([s.ravel() for s in scores])
    lo, hi = float(pooled.min()), float(pooled.max())
    pad = 0.05 * (hi - lo) if hi > lo else 0.5
    return np.linspace(lo - pad, hi + pad, n)


def compare_scores(
    scores: Mapping[str, np.ndarray],
    metrics: Sequence[str] = (DEFAULT_METRIC,),
    run_names: Mapping[str, list[str]] | None = None,
    last_k: int = 1,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
    taus: np.ndarray | None = None,
) -> CompareResult:
    """Aggregates, pairwise probabilities of improvement and profiles of ``[runs x tasks]`` matrices."""
    matrices = {name: np.asarray(s, dtype=float).reshape(len(s), -1) for name, s in scores.items()}
    groups = {}
    for name, m in matrices.items():
        estimates = {agg: Interval(*stratified_bootstrap_ci(m, fn, n_boot, alpha, seed)) for agg, fn in AGGREGATES.items()}
        runs = list(run_names[name]) if run_names else [str(i) for i in range(len(m))]
        groups[name] = GroupSummary(runs, m.tolist(), estimates)
    improvements = [
        Improvement(x, y, Interval(*probability_of_improvement_ci(matrices[x], matrices[y], n_boot, alpha, seed)))
        for x, y in itertools.combinations(matrices, 2)
    ]
    taus = _default_taus(list(matrices.values())) if taus is None else np.asarray(taus, dtype=float)
    profiles = {}
    for name, m in matrices.items():
        point, low, high = performance_profile(m, taus, n_boot, alpha, seed)
        profiles[name] = {"point": point.tolist(), "low": low.tolist(), "high": high.tolist()}
    return CompareResult(list(metrics), last_k, alpha, n_boot, groups, improvements, taus.tolist(), profiles)


def score_matrix(runs: Sequence[Run], metrics: Sequence[str], last_k: int = 1) -> np.ndarray:
    """``[runs x tasks]``: each metric is one task column."""
    return np.array([[run.score(m, last_k) for m in metrics] for run in runs], dtype=float)


def compare_runs(
    groups: Mapping[str, Sequence[Run]],
    metrics: Sequence[str] = (DEFAULT_METRIC,),
    last_k: int = 1,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> CompareResult:
    """:func:`compare_scores` on each group's runs scored by :meth:`Run.score`."""
    scores = {name: score_matrix(runs, metrics, last_k) for name, runs in groups.items()}
    names = {name: [str(r.path) for r in runs] for name, runs in groups.items()}
    return compare_scores(scores, metrics, names, last_k, n_boot, alpha, seed)


_COLUMNS = {"mean": "mean", "median": "median", "iqm": "IQM", "optimality_gap": "optimality gap"}


def format_table(result: CompareResult) -> str:
    """Markdown tables: aggregates per group, then P(X > Y) per pair, then the sequential decision."""
    level = f"{100 * (1 - result.alpha):g}%"
    score = "last value" if result.last_k == 1 else f"mean of the last {result.last_k} values"
    lines = [
        f"metric: {', '.join(result.metrics)} ({score} of each run); [{level} stratified bootstrap CI, "
        f"{result.n_boot} resamples]",
        "",
        "| group | runs | " + " | ".join(_COLUMNS.values()) + " |",
        "|---|---:|" + "---:|" * len(_COLUMNS),
    ]
    for name, g in result.groups.items():
        cells = " | ".join(str(g.estimates[key]) for key in _COLUMNS)
        lines.append(f"| {name} | {len(g.runs)} | {cells} |")
    notes = []
    if len(result.metrics) == 1:
        notes.append("median is over tasks of per-task means (Agarwal et al. 2021): with one metric it equals the mean")
    if any(len(g.runs) < 2 for g in result.groups.values()):
        notes.append("a group with one run has no interval (a single seed says nothing about seed variance)")
    lines += [f"note: {n}" for n in notes]
    if result.improvements:
        lines += ["", f"| X | Y | P(X > Y) [{level} CI] |", "|---|---|---:|"]
        lines += [f"| {imp.x} | {imp.y} | {imp.poi} |" for imp in result.improvements]
    if result.sequential is not None:
        lines += ["", result.sequential.summary()]
    return "\n".join(lines)


def plot_performance_profiles(result: CompareResult, path: str | Path) -> Path:
    """Fraction of runs with score > tau against tau, one curve and CI band per group (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, p in result.profiles.items():
        label = f"{name} ({len(result.groups[name].runs)} runs)"
        (line,) = ax.plot(result.taus, p["point"], drawstyle="steps-post", label=label)
        ax.fill_between(result.taus, p["low"], p["high"], step="post", color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel(f"{', '.join(result.metrics)} threshold tau")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"performance profiles ({100 * (1 - result.alpha):g}% bootstrap bands)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_compare(
    paths: list[str],
    metric: str = DEFAULT_METRIC,
    group_by: str | None = None,
    last_k: int = 1,
    out: str | None = None,
    sequential: bool = False,
    n_per_batch: int = 5,
    alpha: float = 0.05,
    max_batches: int | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> str:
    """Everything `reinforge compare RUN...` does; returns the text to print.

    ``metric`` may list several metrics separated by commas (each one a task column). With ``out``,
    writes ``out/compare.json`` and ``out/performance_profile.png``. With ``sequential``, replays
    the AdaStop test between the two groups (exactly two, one metric) over their seeds in seed order.
    """
    if not 0 < alpha < 1:
        raise ConfigError(f"--alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ConfigError(f"n_boot must be >= 1, got {n_boot}")
    metrics = [m.strip() for m in metric.split(",") if m.strip()]
    if not metrics:
        raise ConfigError("--metric: give a metric name, e.g. eval/heldout_acc")
    groups = group_runs(paths, group_by)
    result = compare_runs(groups, metrics, last_k, n_boot, alpha, seed)
    if sequential:
        if len(groups) != 2 or len(metrics) != 1:
            raise ConfigError(
                f"--sequential compares exactly two groups on one metric; got groups {list(groups)} "
                f"and metrics {metrics}"
            )
        (name_a, a), (name_b, b) = result.groups.items()
        result.sequential = sequential_from_runs(
            [s[0] for s in a.scores], [s[0] for s in b.scores], n_per_batch, alpha, max_batches, seed, (name_a, name_b)
        )
    text = format_table(result)
    if out is not None:
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "compare.json").write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n")
        png = plot_performance_profiles(result, out_dir / "performance_profile.png")
        text += f"\n\nwrote {out_dir / 'compare.json'} and {png}"
    return text
