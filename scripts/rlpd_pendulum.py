"""RLPD against online learning from scratch on Pendulum-v1 at equal online steps (docs/classic.md, "RLPD").

A short SAC run (the pendulum_sac recipe's settings) trains for ``--sac-steps`` steps and logs
``--data-steps`` steps of its sampled policy (classic/offline.py ``collect_box``, Parquet); then, per seed,
RLPD with that data, the same RLPD with offline_ratio 0 (no data: online from scratch, same networks and
UTD) and the shipped SAC (from scratch) each run ``--steps`` online steps. Prints each run's training
episode returns and the first online step whose episode return reaches ``--threshold``.

    python scripts/rlpd_pendulum.py --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from reinforge.classic.envs import EnvConfig, make_vec_env
from reinforge.classic.offline import collect_box, save_parquet
from reinforge.classic.rlpd import RLPD, RLPDSettings
from reinforge.classic.sac import SAC, SACSettings

SMALL = {"utd": 2, "hidden": [128, 128], "batch_size": 128}  # the CPU-sized RLPD (docs/classic.md)


def pendulum(seed: int):  # noqa: ANN201
    return make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, seed)


def log_dataset(path: Path, sac_steps: int, data_steps: int, seed: int) -> float:
    """Train SAC for ``sac_steps`` and log ``data_steps`` of its policy to ``path``; the data's mean return."""
    sac = SAC(pendulum(seed), seed, SACSettings(learning_starts=1000))
    while sac.env_steps < sac_steps:
        sac.iterate(0.0)
    data = collect_box(sac, pendulum(seed + 500), data_steps, seed + 500)
    save_parquet(data, path)
    return float(data.reward.sum() / max(int((data.terminated | data.truncated).sum()), 1))


def run(agent, steps: int) -> list[tuple[int, float]]:  # noqa: ANN001
    """(online step at the episode's end, return) of every training episode in ``steps`` steps."""
    curve: list[tuple[int, float]] = []
    while agent.env_steps < steps:
        for ret, _ in agent.iterate(agent.env_steps / steps).episodes:
            curve.append((agent.env_steps, ret))
    return curve


def first_at(curve: list[tuple[int, float]], threshold: float) -> int | None:
    return next((step for step, ret in curve if ret >= threshold), None)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--sac-steps", type=int, default=4000)
    p.add_argument("--data-steps", type=int, default=2000)
    p.add_argument("--threshold", type=float, default=-300.0)
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--out", default="/tmp/rlpd_pendulum")
    a = p.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "pendulum_sac_data.parquet"
    print(json.dumps({"dataset_mean_return": log_dataset(data, a.sac_steps, a.data_steps, 100)}), flush=True)
    for seed in (int(s) for s in a.seeds.split(",")):
        makers = {
            "rlpd": lambda s: RLPD(pendulum(s), s, RLPDSettings(offline_data=str(data), learning_starts=a.learning_starts, **SMALL)),
            "rlpd_no_data": lambda s: RLPD(pendulum(s), s, RLPDSettings(offline_data=str(data), offline_ratio=0.0,
                                                                        learning_starts=a.learning_starts, **SMALL)),
            "sac": lambda s: SAC(pendulum(s), s, SACSettings(learning_starts=a.learning_starts)),
        }
        for name, make in makers.items():
            t0 = time.perf_counter()
            curve = run(make(seed), a.steps)
            rets = [round(r, 1) for _, r in curve]
            print(json.dumps({"seed": seed, "agent": name, "first_step_at_threshold": first_at(curve, a.threshold),
                              "last3_mean": round(float(np.mean(rets[-3:])), 1), "returns": rets,
                              "wall_s": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
