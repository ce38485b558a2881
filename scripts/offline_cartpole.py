"""Offline RL on CartPole-v1 from logged data: CQL and IQL against offline DQN (alpha 0) and the behaviour
policy (docs/classic.md, "Offline RL").

    python scripts/offline_cartpole.py [--seed 0] [--episodes 50] [--eps-behavior 0.5] [--steps 10000]

A DQN trained by the shipped ``cartpole_dqn`` recipe (seed ``--seed``) logs ``--episodes`` episodes of
its ``--eps-behavior``-soft policy (a "medium" dataset: worse than the greedy policy, better than
random); CQL(H) with ``--alpha``, plain offline DQN (alpha 0) and IQL (``--expectile``, ``--beta``) each
train ``--steps`` steps on it alone; each greedy policy then plays ``--eval-episodes`` online episodes
(undiscounted return).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from reinforge.classic.cql import fit_cql
from reinforge.classic.envs import finished_episodes, make_vec_env, obs_tensor
from reinforge.classic.iql import fit_iql
from reinforge.classic.offline import collect


def play(q: torch.nn.Module, envs, episodes: int, seed: int) -> list[float]:
    obs, _ = envs.reset(seed=seed)
    returns: list[float] = []
    while len(returns) < episodes:
        with torch.no_grad():
            action = q(obs_tensor(obs)).argmax(-1).numpy()
        obs, _, _, _, info = envs.step(action)
        returns += [r for r, _ in finished_episodes(info)]
    return returns


def main() -> None:
    from ope_cartpole import trained_dqn

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--eps-behavior", type=float, default=0.5)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--expectile", type=float, default=0.7)
    p.add_argument("--beta", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--eval-episodes", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    agent, env_cfg = trained_dqn(args.seed)
    env = make_vec_env(env_cfg.model_copy(update={"num_envs": 1}), 0.99, args.seed + 1)
    data = collect(agent, env, args.episodes, args.eps_behavior, args.seed + 3)
    _, starts = np.unique(data.episode, return_index=True)
    behavior = np.add.reduceat(data.reward, starts)
    rows = [("behaviour policy (the logged episodes)", behavior.tolist())]
    for name, alpha in (("offline DQN (alpha 0)", 0.0), (f"CQL (alpha {args.alpha})", args.alpha)):
        q, _ = fit_cql(data, int(env.single_action_space.n), alpha=alpha, steps=args.steps, seed=args.seed)
        rows.append((name, play(q, env, args.eval_episodes, args.seed + 5)))
    pi, _, _ = fit_iql(data, int(env.single_action_space.n), expectile=args.expectile, beta=args.beta,
                       steps=args.steps, seed=args.seed)
    rows.append((f"IQL (expectile {args.expectile}, beta {args.beta})", play(pi, env, args.eval_episodes, args.seed + 5)))
    print(f"| policy | mean return | min-max |  (seed {args.seed}, {args.episodes} logged episodes, {len(data.reward)} "
          f"steps, {time.time() - t0:.0f} s)\n|---|---:|---|")
    for name, returns in rows:
        print(f"| {name} | {np.mean(returns):.1f} | {min(returns):.0f}-{max(returns):.0f} |")


if __name__ == "__main__":
    main()
