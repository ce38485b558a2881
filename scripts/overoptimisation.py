"""Reward over-optimisation on the tiny models: proxy (the reward model the policy trains on) and gold
(the exact verifier it never sees) against the KL from the start, per mitigation and seed.

    python scripts/overoptimisation.py [--variants none,kl,...] [--seeds 0,1,2] [--steps 150] [--jobs 2] [--out DIR]

Each run is the shipped ``rlhf_arithmetic`` recipe (GRPO against tiny-rm alone, the verifier at weight
0, ``algo.kl.measure``) with a variant's overrides (``VARIANTS``): no mitigation, the KL penalty, an
ensemble of three reward models (mean, min, uncertainty-weighted), their weight average (WARM), PAR,
clipping, and a co-evolving reward model (Cooper). The ensemble is ``--ensemble`` (default
``runs/rm/ens3``), trained first when missing: ``reinforge rm arithmetic_verify ensemble=3 combine=warm``
(members of seeds 0-2; member 0 is tiny-rm's recipe and seed; ``model/`` is WARM's average).
Per step the run logs ``reward/term/rm`` (proxy), ``reward/term/gold`` (gold, the mean correctness of
the step's samples) and ``train/kl_ref``; the proxy of a transformed reward (par, clip) is on the
transform's scale. A run whose directory ``DIR/runs/<variant>-s<seed>`` holds it finished is read back,
not trained again. Writes ``DIR/overoptimisation.json`` (every run's per-step series and its held-out
accuracy before and after), ``DIR/overoptimisation.png`` (gold and proxy against KL, a panel per variant, none's gold beside)
and prints a Markdown table. As Gao et al. 2023 ("Scaling Laws for Reward Model Overoptimization",
arXiv:2210.10760) measure it, with the KL from the start on the x axis. ``--jobs`` runs that many at
once, one thread each.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

RM = "reward.terms.0.reward_model"
VARIANTS = {
    "none": [],  # no mitigation: the reward model alone, no KL penalty
    "kl": ["algo.kl.coef=0.1"],  # the KL penalty (k3 in the loss), the baseline mitigation
    "ens_mean": [f"{RM}.path={{ensemble}}", f"{RM}.aggregate=mean"],  # Coste et al. 2024
    "ens_min": [f"{RM}.path={{ensemble}}", f"{RM}.aggregate=min"],
    "ens_uwo": [f"{RM}.path={{ensemble}}", f"{RM}.aggregate={{name: uwo, coef: 0.5}}"],
    "warm": [f"{RM}.path={{ensemble}}/model"],  # Rame et al. 2024
    "par": [f"{RM}.transform=par"],  # Fu et al. 2025; reference: the task's answer
    "clip": [f"{RM}.transform={{name: clip, width: 1.0}}"],  # Fu et al. 2025's Clip baseline
    "co_evolve": [f"{RM}.co_evolve={{verifier: exact_match, lr: 1.0e-4, batch_size: 16}}"],  # Cooper
}


def build_ensemble(path: Path) -> None:
    """The three-member ensemble (and its WARM average) at ``path``, trained unless it is there."""
    if (path / "ensemble.json").is_file():
        return
    from reinforge.rm.config import load_rm_config
    from reinforge.rm.train import train_reward_model

    train_reward_model(load_rm_config("arithmetic_verify", ["ensemble=3", "combine=warm", "train.eval_every=0",
                                                            f"output_dir={path.parent}", f"name={path.name}"]))


def run_one(variant: str, seed: int, steps: int, out: Path, ensemble: Path, threads: int) -> dict[str, Any]:
    """Train one run (unless ``out/<variant>-s<seed>`` already holds it, finished) and read its series."""
    import torch

    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    run_dir = out / f"{variant}-s{seed}"
    if not run_dir.exists():
        torch.set_num_threads(threads)
        overrides = [o.replace("{ensemble}", str(ensemble)) for o in VARIANTS[variant]]
        cfg = load_config("rlhf_arithmetic", [f"seed={seed}", f"train.steps={steps}", f"output_dir={out}",
                                              f"name={variant}-s{seed}", "eval.every=0", "log.report=false",
                                              "train.time_limit_s=0", *overrides])
        run_dir = train(cfg).run_dir
    return read_run(run_dir, steps)


def read_run(run_dir: Path, steps: int) -> dict[str, Any]:
    """A finished run's per-step proxy, gold and KL, and its held-out accuracy before and after."""
    from reinforge.track.jsonl import read_jsonl

    records = list(read_jsonl(run_dir / "metrics.jsonl")) if (run_dir / "metrics.jsonl").is_file() else []
    rows = [m for m in records if "reward/term/rm" in m]
    heldout = [m["eval/heldout_acc"] for m in records if "eval/heldout_acc" in m]
    if len(rows) != steps or len(heldout) < 2:
        raise SystemExit(f"{run_dir}: not a finished run of {steps} steps; delete it to run it again")
    series: dict[str, Any] = {k: [float(m.get(src, np.nan)) for m in rows] for k, src in
                              (("proxy", "reward/term/rm"), ("gold", "reward/term/gold"), ("kl", "train/kl_ref"))}
    series["heldout"] = [float(heldout[0]), float(heldout[-1])]
    return series


def smooth(values: list[float], window: int) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return np.array([np.nanmean(x[max(0, i - window + 1) : i + 1]) for i in range(len(x))])


def plot(results: dict[str, dict[int, dict[str, Any]]], window: int, path: Path) -> None:
    """A panel per variant against the KL from the start: its gold (solid, left axis; the unmitigated
    runs' in grey) and its proxy (dashed, right axis: each variant's reward on its own scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in results if v != "none"] or list(results)
    cols = min(4, len(variants))
    rows = -(-len(variants) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.9 * cols, 3.1 * rows), sharey=True, squeeze=False)
    for ax, variant in zip(axes.flat, variants, strict=False):
        proxy_ax = ax.twinx()
        for series in results.get("none", {}).values():
            ax.plot(smooth(series["kl"], window), smooth(series["gold"], window), color="0.65", lw=1)
        for k, series in enumerate(results[variant].values()):
            kl = smooth(series["kl"], window)
            ax.plot(kl, smooth(series["gold"], window), color=f"C{k}", lw=1.6)
            proxy_ax.plot(kl, smooth(series["proxy"], window), color=f"C{k}", lw=1, ls="--", alpha=0.7)
        ax.set_title(f"{variant} (grey: none)", fontsize=10)
        ax.set_xlabel("KL from the start", fontsize=8)
        proxy_ax.tick_params(labelsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("gold: exact match (solid)", fontsize=8)
    for ax in list(axes.flat)[len(variants):]:
        ax.axis("off")
    fig.suptitle("gold (solid, left) and proxy (dashed, right: the reward the policy sees) per seed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(results: dict[str, dict[int, dict[str, Any]]], window: int) -> str:
    """Per variant, means over its seeds of the first and last ``window`` steps; held-out accuracy per seed."""
    lines = ["| variant | proxy first -> last | gold first -> last | KL at the end | held-out accuracy (seeds) | mean |",
             "|---|---|---|---|---|---|"]
    for variant, seeds in results.items():
        def mean(key: str, part: slice, runs: dict = seeds) -> float:
            return float(np.mean([np.nanmean(s[key][part]) for s in runs.values()]))

        first, last = slice(0, window), slice(-window, None)
        after = [s["heldout"][-1] for s in seeds.values()]
        lines.append(f"| {variant} | {mean('proxy', first):.2f} -> {mean('proxy', last):.2f} | "
                     f"{mean('gold', first):.3f} -> {mean('gold', last):.3f} | {mean('kl', last):.2f} | "
                     f"{', '.join(f'{a:.3f}' for a in after)} | {np.mean(after):.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each with --threads threads)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ensemble", default="runs/rm/ens3")
    parser.add_argument("--out", default="runs/overoptimisation")
    args = parser.parse_args()
    out, ensemble = Path(args.out), Path(args.ensemble).resolve()
    out.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    for variant in variants:
        if variant not in VARIANTS:
            raise SystemExit(f"--variants: unknown {variant!r}; known: {', '.join(VARIANTS)}")
    if any("{ensemble}" in o for v in variants for o in VARIANTS[v]):
        build_ensemble(ensemble)
    results: dict[str, dict[int, dict[str, Any]]] = {}
    todo = [(v, int(seed)) for v in variants for seed in args.seeds.split(",")]
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:  # a finished run is read back
        futures = {pool.submit(run_one, v, seed, args.steps, out / "runs", ensemble, args.threads): (v, seed)
                   for v, seed in todo}
        for future in as_completed(futures):
            variant, seed = futures[future]
            results.setdefault(variant, {})[seed] = future.result()
            print(f"done: {variant} seed {seed}", flush=True)
    chosen = {v: dict(sorted(results[v].items())) for v in variants if v in results}
    (out / "overoptimisation.json").write_text(json.dumps(chosen))
    plot(chosen, args.window, out / "overoptimisation.png")
    print(table(chosen, args.window))
    print(f"figure: {out / 'overoptimisation.png'}")


if __name__ == "__main__":
    main()
