"""Dataset tiers for offline RL on Pendulum-v1, collected by the package's own SAC, and behaviour cloning,
TD3+BC and CQL trained on each (docs/classic.md, "Offline RL for Box actions").

    python scripts/offline_tiers_pendulum.py [--seed 0] [--sac-steps 12000] [--steps-per-tier 10000]
        [--train-steps 3000] [--cql-hidden 256,256] [--out DIR] [--only-data | --reuse]

1. SAC (the shipped ``pendulum_sac`` settings, seed ``--seed``) trains ``--sac-steps`` steps; its actor is
   snapshotted the first time the mean of its last 5 training episodes reaches ``--medium-return`` and at the
   end (the "expert").
2. Each tier logs ``--steps-per-tier`` steps (whole 200-step episodes) with ``classic/offline.collect_box``,
   saved as ``DIR/<tier>.parquet``: random (uniform actions on the Box), medium (the medium snapshot's sampled
   actions), expert (the final actor's sampled actions): D4RL's random / medium / expert pattern.
3. Behaviour cloning (td3_bc with alpha 0), TD3+BC (alpha 2.5) and CQL (weight 5) train ``--train-steps``
   gradient steps on each tier with their defaults otherwise; each deterministic policy plays
   ``--eval-episodes`` episodes (seed ``--seed`` + 7). ``DIR/results.json`` keeps the table's numbers.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

from reinforge.classic.cql_box import CQL, CQLSettings
from reinforge.classic.envs import EnvConfig, finished_episodes, make_vec_env, obs_tensor
from reinforge.classic.offline import collect_box, load_parquet, save_parquet
from reinforge.classic.sac import SAC, SACSettings
from reinforge.classic.td3bc import TD3BC, TD3BCSettings


def pendulum(seed: int):  # noqa: ANN201
    return make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, seed)


class Uniform:
    """Uniform actions on the Box (the random tier's policy)."""

    def __init__(self, envs, seed: int) -> None:  # noqa: ANN001
        self.space = envs.single_action_space
        self.space.seed(seed)

    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        return torch.as_tensor(np.stack([self.space.sample() for _ in range(len(obs))]))


class Frozen:
    """A snapshot of a SAC actor: ``act`` as the agent's."""

    def __init__(self, sac: SAC) -> None:
        self.actor, self.generator = copy.deepcopy(sac.actor), torch.Generator().manual_seed(len(sac.replay.obs))

    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        with torch.no_grad():
            return self.actor(obs, self.generator, deterministic)[0]


def sac_snapshots(seed: int, steps: int, medium_return: float) -> tuple[dict[str, object], int]:
    sac = SAC(pendulum(seed), seed, SACSettings(learning_starts=1000))
    snaps: dict[str, object] = {"random": Uniform(sac.envs, seed)}
    recent: list[float] = []
    while sac.env_steps < steps:
        recent = (recent + [r for r, _ in sac.iterate(0.0).episodes])[-5:]
        if "medium" not in snaps and len(recent) == 5 and np.mean(recent) >= medium_return:
            snaps["medium"] = Frozen(sac)
    snaps["expert"] = Frozen(sac)
    return snaps, sac.env_steps


LEARNERS: dict[str, tuple] = {}


def play(agent, episodes: int, seed: int) -> list[float]:  # noqa: ANN001
    envs = pendulum(seed)
    obs, _ = envs.reset(seed=seed)
    returns: list[float] = []
    while len(returns) < episodes:
        obs, _, _, _, info = envs.step(np.asarray(agent.act(obs_tensor(obs), True), dtype=np.float32))
        returns += [r for r, _ in finished_episodes(info)]
    return returns


def learners(cql_hidden: list[int]) -> dict[str, tuple]:
    return {"BC": (TD3BC, TD3BCSettings, {"alpha": 0.0}), "TD3+BC": (TD3BC, TD3BCSettings, {}),
            "CQL": (CQL, CQLSettings, {"hidden": cql_hidden})}


def train_offline(agent_cls, settings_cls, options: dict, data: Path, steps: int, seed: int):  # noqa: ANN001, ANN201
    """The agent after ``steps`` gradient steps on ``data`` (one iteration)."""
    settings = settings_cls(offline_data=str(data), iteration_steps=steps, **options)
    agent = agent_cls(pendulum(seed), seed, settings)
    agent.iterate(0.0)
    return agent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sac-steps", type=int, default=12_000)
    p.add_argument("--medium-return", type=float, default=-700.0)
    p.add_argument("--steps-per-tier", type=int, default=10_000)
    p.add_argument("--train-steps", type=int, default=3_000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("runs/offline-tiers-pendulum"))
    p.add_argument("--cql-hidden", default="256,256", help="CQL's MLP widths (its log-sum-exp values 30 actions "
                   "per state: a CPU-sized run takes 64,64)")
    p.add_argument("--only-data", action="store_true", help="log the tiers, train nothing")
    p.add_argument("--reuse", action="store_true", help="train on the tiers already in --out (no SAC run)")
    args = p.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    LEARNERS.update(learners([int(w) for w in args.cql_hidden.split(",")]))
    if args.reuse:
        snaps = dict.fromkeys(("random", "medium", "expert"))
    else:
        snaps, sac_steps = sac_snapshots(args.seed, args.sac_steps, args.medium_return)
        print(f"SAC seed {args.seed}: {sac_steps} env steps ({time.time() - t0:.0f} s)", flush=True)
    print("| tier | logged episodes (steps) | logged mean return (min to max) | " + " | ".join(LEARNERS) + " |")
    print("|---|---:|---:|" + "---:|" * len(LEARNERS), flush=True)
    results: dict[str, dict] = {}
    for k, (tier, snap) in enumerate(snaps.items()):
        path = args.out / f"{tier}.parquet"
        if snap is None:
            data = load_parquet(path)
        else:
            data = collect_box(snap, pendulum(args.seed + 3 + k), args.steps_per_tier, args.seed + 3 + k)
            save_parquet(data, path)
        _, starts = np.unique(data.episode, return_index=True)
        logged = np.add.reduceat(data.reward, starts)
        results[tier] = {"logged_mean": float(logged.mean()), "episodes": len(starts)}
        cells = []
        for label, (agent_cls, settings_cls, options) in ([] if args.only_data else LEARNERS.items()):
            t1 = time.time()
            returns = play(train_offline(agent_cls, settings_cls, options, path, args.train_steps, args.seed), args.eval_episodes,
                           args.seed + 7)
            results[tier][label] = {"mean": float(np.mean(returns)), "returns": returns, "seconds": time.time() - t1}
            cells.append(f"{np.mean(returns):.1f} ({min(returns):.0f} to {max(returns):.0f})")
        print(f"| {tier} | {len(starts)} ({len(data.reward)}) | {logged.mean():.1f} ({logged.min():.0f} to "
              f"{logged.max():.0f}) | " + " | ".join(cells) + " |", flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"({time.time() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
