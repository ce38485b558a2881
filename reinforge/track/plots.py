"""PNG plots of a run's metrics (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path

from reinforge.track.jsonl import read_jsonl

PLOTS = {
    "reward": ("reward/mean", "mean training reward"),
    "heldout_accuracy": ("eval/heldout_acc", "held-out greedy accuracy"),
    "entropy": ("train/entropy", "policy entropy (nats/token)"),
    "logprob_mismatch": ("train/logprob_mismatch", "|log p learner - log p sampler|"),
}


def plot_run(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(run_dir / "metrics.jsonl")
    written = []
    for name, (key, title) in PLOTS.items():
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = run_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
