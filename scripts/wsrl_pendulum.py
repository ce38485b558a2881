"""WSRL against online SAC from scratch on Pendulum-v1 at equal online steps (docs/classic.md, "WSRL").

Per seed: WSRL pretrains ``--pretrain-steps`` Cal-QL steps on a logged tier (``--data``, e.g. the medium tier
of scripts/offline_tiers_pendulum.py), drops the data, plays ``--warmup`` steps of the pretrained policy, then
learns online (UTD ``--utd``) to ``--steps`` online steps in all (the warmup counted); SAC (the shipped
``pendulum_sac`` settings: learning after 1000 uniform random steps) runs the same ``--steps``. Both use the
``--hidden`` networks. Prints each run's training episode returns (200 steps each), the mean of its last 5
and its deterministic policy's mean return over ``--eval-episodes`` episodes at the end.

    python scripts/wsrl_pendulum.py --data DIR/medium.parquet --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from offline_tiers_pendulum import pendulum, play  # scripts/ is on the path when this runs as a script

from reinforge.classic.sac import SAC, SACSettings
from reinforge.classic.wsrl import WSRL, WSRLSettings


def online(agent, steps: int) -> list[float]:  # noqa: ANN001
    returns: list[float] = []
    for _ in range(steps // agent.steps_per_iteration):
        returns += [r for r, _ in agent.iterate(0.0).episodes]
    return returns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--pretrain-steps", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--utd", type=int, default=4)
    p.add_argument("--hidden", default="64,64")
    p.add_argument("--eval-episodes", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    hidden = [int(w) for w in args.hidden.split(",")]
    print("| seed | method | training episode returns | last 5 | eval (deterministic) | time |")
    print("|---|---|---|---:|---:|---:|", flush=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        runs = {
            "WSRL": lambda s=seed: WSRL(pendulum(s), s, WSRLSettings(
                offline_data=str(args.data), pretrain_steps=args.pretrain_steps, warmup_steps=args.warmup,
                utd=args.utd, hidden=hidden)),
            "SAC": lambda s=seed: SAC(pendulum(s), s, SACSettings(learning_starts=1000, hidden=hidden)),
        }
        for name, build in runs.items():
            t0 = time.time()
            agent = build()
            returns = online(agent, args.steps)
            score = float(np.mean(play(agent, args.eval_episodes, seed + 10_000)))
            print(f"| {seed} | {name} | {', '.join(f'{r:.0f}' for r in returns)} | {np.mean(returns[-5:]):.1f} | "
                  f"{score:.1f} | {time.time() - t0:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
