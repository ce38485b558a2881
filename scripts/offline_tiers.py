"""Dataset tiers for offline RL on CartPole-v1, collected by the package's own agents, and offline DQN, CQL and
IQL trained on each (docs/classic.md, "Dataset tiers").

    cd scripts && python offline_tiers.py [--seed 0] [--steps-per-tier 20000] [--train-steps 5000] [--out DIR]

1. PPO (the shipped ``cartpole_ppo`` recipe, seed ``--seed``) trains until its 20-episode training mean
   reaches 475; its network is snapshotted the first time that mean reaches ``--medium-return`` and at the
   end (the "expert").
2. Each tier logs ``--steps-per-tier`` steps (whole episodes) with ``classic/offline.collect``, an
   epsilon-soft policy of a snapshot's greedy action, saved as ``DIR/<tier>.parquet``:
   random (epsilon 1: uniform actions), medium (the medium snapshot, ``--eps-medium``), expert (the
   final snapshot, ``--eps-expert``): the D4RL pattern of random / medium / expert data.
3. Offline DQN (CQL with alpha 0), CQL(H) (alpha 1) and IQL (expectile 0.7, beta 3) train
   ``--train-steps`` steps on each tier; each greedy policy plays ``--eval-episodes`` online episodes.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import torch
from offline_cartpole import play  # scripts/: run from this directory, as offline_cartpole.py

from reinforge.classic.agents import build_agent
from reinforge.classic.config import load_classic_config
from reinforge.classic.cql import fit_cql
from reinforge.classic.envs import make_vec_env
from reinforge.classic.iql import fit_iql
from reinforge.classic.offline import collect, save_parquet


class Snapshot:
    """A frozen copy of an actor-critic: ``act`` as the agents' (the greedy action when deterministic)."""

    def __init__(self, net: torch.nn.Module) -> None:
        self.net = copy.deepcopy(net)

    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        with torch.no_grad():
            return self.net.act(obs, None, deterministic=deterministic)[0]


def ppo_snapshots(seed: int, medium_return: float, window: int = 20) -> tuple[dict[str, Snapshot], object, int]:
    """{random, medium, expert} snapshots of a PPO run on CartPole, its env config and the steps it took."""
    c = load_classic_config("cartpole_ppo", [f"seed={seed}"]).classic
    agent = build_agent(c.agent.name, make_vec_env(c.env, c.agent.settings.gamma, seed), seed, c.agent.settings)
    snaps, recent = {"random": Snapshot(agent.net)}, []
    total = c.train.total_env_steps // agent.steps_per_iteration
    for i in range(total):
        recent = (recent + [r for r, _ in agent.iterate(i / total).episodes])[-window:]
        mean = np.mean(recent) if len(recent) == window else -np.inf
        if "medium" not in snaps and mean >= medium_return:
            snaps["medium"] = Snapshot(agent.net)
        if mean >= 475:
            break
    snaps["expert"] = Snapshot(agent.net)
    return snaps, c.env, (i + 1) * agent.steps_per_iteration


def learners(args) -> dict[str, object]:
    common = {"steps": args.train_steps, "seed": args.seed}
    return {
        "offline DQN": lambda d, n: fit_cql(d, n, alpha=0.0, **common)[0],
        "CQL (alpha 1)": lambda d, n: fit_cql(d, n, alpha=1.0, **common)[0],
        "IQL (0.7, beta 3)": lambda d, n: fit_iql(d, n, expectile=0.7, beta=3.0, **common)[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--medium-return", type=float, default=150.0)
    p.add_argument("--eps-medium", type=float, default=0.3)
    p.add_argument("--eps-expert", type=float, default=0.05)
    p.add_argument("--steps-per-tier", type=int, default=20_000)
    p.add_argument("--train-steps", type=int, default=5_000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("runs/offline-tiers"))
    args = p.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    snaps, env_cfg, ppo_steps = ppo_snapshots(args.seed, args.medium_return)
    env = make_vec_env(env_cfg.model_copy(update={"num_envs": 1}), 0.99, args.seed + 1)
    n = int(env.single_action_space.n)
    eps = {"random": 1.0, "medium": args.eps_medium, "expert": args.eps_expert}
    fits = learners(args)
    print(f"PPO seed {args.seed}: {ppo_steps} env steps, tiers {sorted(snaps)} ({time.time() - t0:.0f} s)")
    print("| tier | logged episodes (steps) | logged mean return (min-max) | " + " | ".join(fits) + " |")
    print("|---|---:|---:|" + "---:|" * len(fits))
    for k, (tier, snap) in enumerate(snaps.items()):
        data = collect(snap, env, 10**9, eps[tier], args.seed + 3 + k, max_steps=args.steps_per_tier)
        save_parquet(data, args.out / f"{tier}.parquet")
        _, starts = np.unique(data.episode, return_index=True)
        logged = np.add.reduceat(data.reward, starts)
        cells = []
        for fit in fits.values():
            returns = play(fit(data, n), env, args.eval_episodes, args.seed + 5)
            cells.append(f"{np.mean(returns):.1f} ({min(returns):.0f}-{max(returns):.0f})")
        print(f"| {tier} (epsilon {eps[tier]}) | {len(starts)} ({len(data.reward)}) | {logged.mean():.1f} "
              f"({logged.min():.0f}-{logged.max():.0f}) | " + " | ".join(cells) + " |", flush=True)
    print(f"({time.time() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
