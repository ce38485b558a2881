"""A reward model on held-out pairs: pair accuracy with a bootstrap interval, and calibration.

Pair accuracy: the share of pairs with ``r_w > r_l`` (a tie counts half), with a 95% percentile
bootstrap interval over pairs (``eval.stats.bootstrap_ci``). Calibration (Bradley-Terry reads
``sigmoid(r_a - r_b)`` as the probability that ``a`` is preferred): each pair is shown once in a
random order (seeded), its predicted probability that the first answer is the chosen one is binned
into ``bins`` equal-width bins, and each bin's mean prediction is set against how often the first
answer was in fact chosen; the expected calibration error is the pair-weighted mean of
``|mean prediction - frequency|`` over bins (Guo et al. 2017, "On Calibration of Modern Neural Networks").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from reinforge.algo.reward_losses import pair_accuracy
from reinforge.eval.stats import bootstrap_ci


@dataclass
class PairEval:
    pairs: int
    accuracy: float
    low: float
    high: float
    ece: float
    bins: list[dict[str, float]]

    def to_dict(self) -> dict:
        return asdict(self)


def calibration(chosen: torch.Tensor, rejected: torch.Tensor, bins: int = 10, seed: int = 0
                ) -> tuple[float, list[dict[str, float]]]:
    """(expected calibration error, per-bin {low, high, mean_pred, freq, count}); see the module docstring."""
    rng = np.random.default_rng(seed)
    flip = torch.from_numpy(rng.random(len(chosen)) < 0.5)
    first = torch.where(flip, rejected, chosen).to(torch.float64)
    second = torch.where(flip, chosen, rejected).to(torch.float64)
    pred = torch.sigmoid(first - second).numpy()
    truth = (~flip).numpy().astype(float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.clip(np.digitize(pred, edges[1:-1]), 0, bins - 1)
    out, ece = [], 0.0
    for b in range(bins):
        sel = index == b
        if not sel.any():
            continue
        mean_pred, freq = float(pred[sel].mean()), float(truth[sel].mean())
        ece += sel.sum() / len(pred) * abs(mean_pred - freq)
        out.append({"low": float(edges[b]), "high": float(edges[b + 1]), "mean_pred": mean_pred, "freq": freq,
                    "count": int(sel.sum())})
    return float(ece), out


def evaluate_pairs(chosen: torch.Tensor, rejected: torch.Tensor, seed: int = 0, n_boot: int = 2000) -> PairEval:
    """Held-out scores of one head (or the aggregate of several), ``[pairs]`` each."""
    acc = pair_accuracy(chosen, rejected).numpy()
    mean, low, high = bootstrap_ci(acc, n_boot=n_boot, seed=seed)
    ece, bins = calibration(chosen, rejected, seed=seed)
    return PairEval(len(acc), float(mean), float(low), float(high), ece, bins)


def plot_calibration(result: PairEval, path: Path, title: str = "reward model calibration") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", label="perfect calibration")
    xs = [b["mean_pred"] for b in result.bins]
    ys = [b["freq"] for b in result.bins]
    sizes = [20 + 200 * b["count"] / max(result.pairs, 1) for b in result.bins]
    ax.plot(xs, ys, color="C0")
    ax.scatter(xs, ys, s=sizes, color="C0", label=f"held-out pairs (ECE {result.ece:.3f})")
    ax.set_xlabel("predicted P(first answer preferred) = sigmoid(r_a - r_b)")
    ax.set_ylabel("observed frequency")
    ax.set_title(f"{title}\npair accuracy {result.accuracy:.3f} [{result.low:.3f}, {result.high:.3f}]")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
