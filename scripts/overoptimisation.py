"""Reward over-optimisation on the tiny models: proxy (the reward model the policy trains on) and gold
(the exact verifier it never sees) against the KL from the start, per mitigation and seed.

    python scripts/overoptimisation.py [--variants none,kl] [--seeds 0,1,2] [--steps 150] [--out DIR]

Each run is the shipped ``rlhf_arithmetic`` recipe (GRPO against tiny-rm alone, the verifier at weight
0, ``algo.kl.measure``) with a variant's overrides. Per step the run logs ``reward/term/rm`` (proxy),
``reward/term/gold`` (gold, the mean correctness of the step's samples) and ``train/kl_ref``. Writes
``DIR/overoptimisation.json`` (every run's per-step series), ``DIR/overoptimisation.png`` (proxy and
gold against KL, one line per variant and seed, smoothed over ``--window`` steps) and prints a
Markdown table of the first and last windows. As Gao et al. 2023 ("Scaling Laws for Reward Model
Overoptimization", arXiv:2210.10760) measure it, with the KL from the start on the x axis.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

VARIANTS = {
    "none": [],  # no mitigation: the reward model alone, no KL penalty
    "kl": ["algo.kl.coef=0.1"],  # the KL penalty (k3 in the loss), the baseline mitigation
}


def run_one(variant: str, seed: int, steps: int, out: Path) -> dict[str, list[float]]:
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config("rlhf_arithmetic", [f"seed={seed}", f"train.steps={steps}", f"output_dir={out}",
                                          f"name={variant}-s{seed}", "eval.every=0", "log.report=false",
                                          "train.time_limit_s=0", *VARIANTS[variant]])
    rows = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "reward/term/rm" in m]
    return {k: [float(m.get(src, np.nan)) for m in rows]
            for k, src in (("proxy", "reward/term/rm"), ("gold", "reward/term/gold"), ("kl", "train/kl_ref"))}


def smooth(values: list[float], window: int) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return np.array([np.nanmean(x[max(0, i - window + 1) : i + 1]) for i in range(len(x))])


def plot(results: dict[str, dict[int, dict[str, list[float]]]], window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for c, (variant, seeds) in enumerate(results.items()):
        for k, series in enumerate(seeds.values()):
            kl = smooth(series["kl"], window)
            for ax, key in zip(axes, ("proxy", "gold"), strict=True):
                ax.plot(kl, smooth(series[key], window), color=f"C{c}", alpha=0.8,
                        label=variant if k == 0 else None)
    for ax, title in zip(axes, ("proxy: reward/term/rm (tiny-rm)", "gold: reward/term/gold (exact match)"), strict=True):
        ax.set_xlabel("KL from the start (train/kl_ref, smoothed)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(results: dict[str, dict[int, dict[str, list[float]]]], window: int) -> str:
    lines = ["| variant | seed | proxy first -> last | gold first -> last | KL last |", "|---|---|---|---|---|"]
    for variant, seeds in results.items():
        for seed, s in seeds.items():
            first = {k: float(np.nanmean(v[:window])) for k, v in s.items()}
            last = {k: float(np.nanmean(v[-window:])) for k, v in s.items()}
            lines.append(f"| {variant} | {seed} | {first['proxy']:.2f} -> {last['proxy']:.2f} | "
                         f"{first['gold']:.3f} -> {last['gold']:.3f} | {last['kl']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="none,kl")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--out", default="runs/overoptimisation")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, dict[str, list[float]]]] = {}
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"--variants: unknown {variant!r}; known: {', '.join(VARIANTS)}")
        for seed in (int(s) for s in args.seeds.split(",")):
            results.setdefault(variant, {})[seed] = run_one(variant, seed, args.steps, out / "runs")
            (out / "overoptimisation.json").write_text(json.dumps(results))
    plot(results, args.window, out / "overoptimisation.png")
    print(table(results, args.window))
    print(f"figure: {out / 'overoptimisation.png'}")


if __name__ == "__main__":
    main()
