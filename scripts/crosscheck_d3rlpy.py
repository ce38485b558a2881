"""Our discrete CQL(H) (classic/cql.py) against d3rlpy's DiscreteCQL on the same logged CartPole data, as a
sanity check (docs/classic.md, "Checks against SCOPE-RL and d3rlpy").

    cd scripts && python crosscheck_d3rlpy.py DATA.parquet [--steps 5000] [--seeds 0,1] [--eval-episodes 10]

DATA is logged data in classic/offline.py's Parquet format (e.g. a tier from offline_tiers.py). Both learn
with alpha 1, gamma 0.99, Adam 3e-4, batch 256, a 256-256 ReLU Q network, double-Q targets and a hard
target copy every 500 steps (d3rlpy's DiscreteCQL is its DoubleDQN plus the penalty; its TD loss is
Huber, ours the squared error). Each greedy policy plays ``--eval-episodes`` CartPole episodes; the mean
max_a Q over the logged first states is printed beside (a conservative method keeps it low).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from offline_cartpole import play

from reinforge.classic.config import EnvConfig
from reinforge.classic.cql import fit_cql
from reinforge.classic.envs import make_vec_env
from reinforge.classic.offline import load_parquet


class D3Policy(torch.nn.Module):
    """d3rlpy's greedy action as one-hot scores, so ``play``'s argmax takes it."""

    def __init__(self, algo, n: int) -> None:
        super().__init__()
        self.algo, self.n = algo, n

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.as_tensor(self.algo.predict(obs.numpy())), self.n).float()


def d3rlpy_cql(data, steps: int, seed: int):
    import d3rlpy

    d3rlpy.seed(seed)
    dataset = d3rlpy.dataset.MDPDataset(data.obs, data.action[:, None], data.reward[:, None],
                                        data.terminated.astype(np.float32), data.truncated.astype(np.float32))
    algo = d3rlpy.algos.DiscreteCQLConfig(alpha=1.0, gamma=0.99, learning_rate=3e-4, batch_size=256,
                                          target_update_interval=500).create(device="cpu:0")
    algo.fit(dataset, n_steps=steps, n_steps_per_epoch=steps, show_progress=False, save_interval=10**9,
             logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    return algo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", type=Path)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--eval-episodes", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = load_parquet(args.data)
    first = torch.from_numpy(data.obs[data.t == 0])
    env = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=1), 0.99, 0)
    print(f"| seed | method | greedy return mean (min-max) | mean max Q at first states | fit s |  ({args.data.name}, "
          f"{len(data.reward)} steps)\n|---:|---|---:|---:|---:|")
    for seed in (int(s) for s in args.seeds.split(",")):
        t0 = time.time()
        ours, _ = fit_cql(data, 2, alpha=1.0, steps=args.steps, seed=seed)
        t1 = time.time()
        algo = d3rlpy_cql(data, args.steps, seed)
        t2 = time.time()
        with torch.no_grad():
            q_ours = float(ours(first).max(-1).values.mean())
        q_d3 = float(np.max([algo.predict_value(first.numpy(), np.full(len(first), a)) for a in (0, 1)], 0).mean())
        for name, policy, q, secs in (("reinforge CQL", ours, q_ours, t1 - t0), ("d3rlpy DiscreteCQL", D3Policy(algo, 2),
                                                                             q_d3, t2 - t1)):
            returns = play(policy, env, args.eval_episodes, seed + 5)
            print(f"| {seed} | {name} | {np.mean(returns):.1f} ({min(returns):.0f}-{max(returns):.0f}) | {q:.2f} | "
                  f"{secs:.0f} |", flush=True)


if __name__ == "__main__":
    main()
