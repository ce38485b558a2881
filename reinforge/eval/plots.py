"""Evaluation plots: pass@k curves of several models on one log-k axis."""

from __future__ import annotations

from pathlib import Path


def plot_pass_curves(curves: dict[str, dict[int, float]], path: Path | str, title: str = "pass@k") -> Path:
    """One line per model: pass@k for k = 1..n (log axis). Shows whether training moved pass@1 only
    (curves meet at large k) or the whole curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        ks = sorted(curve)
        ax.plot(ks, [curve[k] for k in ks], marker="o", markersize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
