"""Off-policy evaluation on CartPole-v1 against the Monte Carlo truth (docs/classic.md, "Off-policy evaluation").

    python scripts/ope_cartpole.py [--seed 0] [--episodes 100] [--truth-episodes 300] [--out DIR]

1. Train DQN with the shipped ``cartpole_dqn`` recipe (seed ``--seed``); its greedy policy defines
   the policies: target pi = epsilon-soft with ``--eps-target``, behaviour mu with ``--eps-behavior``.
2. The truth: V(pi) = mean discounted return (``--gamma``) of ``--truth-episodes`` episodes of pi.
3. ``--episodes`` logged episodes of mu (saved as Parquet), then IS, WIS, PDIS (algo/ope.py), FQE
   (classic/fqe.py) and DR (FQE as its model), each with a 95% bootstrap interval over episodes
   (FQE's: over first states), and its error against the truth.
4. Risk-return (SharpeRatio@k, Kiyohara et al. 2023, arXiv:2311.18207): the candidate policies are the
   DQN's epsilon-soft policies for each epsilon in ``--candidates`` (mu's epsilon among them, so the
   behaviour policy is a candidate, as in the paper); each estimator values every candidate on the same
   logged data, each candidate's truth is ``--candidate-truth-episodes`` Monte Carlo episodes, and the
   table gives SharpeRatio@k (best@k, std@k) of each estimator for k = 2 .. P.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from reinforge.algo.ope import ope_estimate, per_episode_terms, sharpe_ratio_at_k
from reinforge.classic.agents import build_agent
from reinforge.classic.config import load_classic_config
from reinforge.classic.envs import make_vec_env
from reinforge.classic.fqe import fit_fqe, fqe_terms
from reinforge.classic.offline import collect, save_parquet, soft_logp


def trained_dqn(seed: int):
    cfg = load_classic_config("cartpole_dqn", [f"seed={seed}"])
    c = cfg.classic
    envs = make_vec_env(c.env, c.agent.settings.gamma, seed)
    agent = build_agent(c.agent.name, envs, seed, c.agent.settings)
    total = c.train.total_env_steps // agent.steps_per_iteration
    for i in range(total):
        agent.iterate(i / total)
    return agent, c.env


def soft_policy(agent, epsilon: float, n: int):
    def probs(obs: torch.Tensor) -> torch.Tensor:
        greedy = agent.act(obs, True)
        return torch.full((obs.shape[0], n), epsilon / n).scatter_add_(
            1, greedy[:, None], torch.full((obs.shape[0], 1), 1.0 - epsilon))
    return probs


def discounted_truth(agent, env, epsilon: float, episodes: int, gamma: float, seed: int) -> dict[str, float]:
    """The Monte Carlo value of the epsilon-soft policy (and its bootstrap interval)."""
    data = collect(agent, env, episodes, epsilon, seed)
    rewards, mask = data.padded(data.reward)
    returns = (rewards * mask * gamma ** torch.arange(rewards.shape[1], dtype=torch.float64)).sum(-1)
    return ope_estimate(returns, torch.ones_like(returns))


def estimates(agent, logged, epsilon: float, n: int, gamma: float, seed: int) -> dict[str, dict[str, float]]:
    """IS, WIS, PDIS, DR and FQE's values of the epsilon-soft policy on ``logged``."""
    pi = soft_policy(agent, epsilon, n)
    greedy = agent.act(torch.from_numpy(logged.obs), True)
    target_logp = soft_logp(greedy, torch.as_tensor(logged.action), epsilon, n).numpy()
    r, m = logged.padded(logged.reward)
    mu, _ = logged.padded(logged.behavior_logp)
    tl, _ = logged.padded(target_logp)
    q = fit_fqe(logged, pi, n, gamma, seed=seed)
    q_taken, v_pi, _ = fqe_terms(q, logged, pi)
    rows = {}
    for name in ("is", "wis", "pdis", "dr"):
        model = {"q_taken": q_taken, "v_pi": v_pi} if name == "dr" else {}
        rows[name] = ope_estimate(*per_episode_terms(name, r, mu, tl, m, gamma, **model))
    rows["fqe"] = ope_estimate(v_pi[:, 0], torch.ones(v_pi.shape[0], dtype=torch.float64))
    return rows


def risk_return(agent, env, logged, args, n: int) -> list[str]:
    """SharpeRatio@k of each estimator over the candidate policies (markdown table lines)."""
    eps = [float(e) for e in args.candidates.split(",")]
    truth = torch.tensor([discounted_truth(agent, env, e, args.candidate_truth_episodes, args.gamma,
                                           args.seed + 20 + i)["value"] for i, e in enumerate(eps)])
    est = [estimates(agent, logged, e, n, args.gamma, args.seed) for e in eps]
    behavior = float(truth[eps.index(args.eps_behavior)])
    lines = ["| candidate epsilon | truth | " + " | ".join(est[0]) + " |", "|---:" * (len(est[0]) + 2) + "|"]
    lines += [f"| {e} | {truth[i]:.2f} | " + " | ".join(f"{v['value']:.2f}" for v in est[i].values()) + " |"
              for i, e in enumerate(eps)]
    ks = range(2, len(eps) + 1)
    lines += ["", "| estimator | " + " | ".join(f"SR@{k} (best, std)" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for name in est[0]:
        values = torch.tensor([row[name]["value"] for row in est])
        cells = [sharpe_ratio_at_k(values, truth, behavior, k) for k in ks]
        lines.append(f"| {name} | " + " | ".join(f"{c['sharpe']:.2f} ({c['best']:.1f}, {c['std']:.1f})"
                                                 for c in cells) + " |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--truth-episodes", type=int, default=300)
    p.add_argument("--eps-target", type=float, default=0.1)
    p.add_argument("--eps-behavior", type=float, default=0.3)
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--candidates", default="0.05,0.1,0.3,0.6,1.0", help="epsilons of the candidate policies")
    p.add_argument("--candidate-truth-episodes", type=int, default=50)
    p.add_argument("--out", type=Path, default=Path("runs/ope-cartpole"))
    args = p.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    agent, env_cfg = trained_dqn(args.seed)
    env = make_vec_env(env_cfg.model_copy(update={"num_envs": 1}), args.gamma, args.seed + 1)
    truth = discounted_truth(agent, env, args.eps_target, args.truth_episodes, args.gamma, args.seed + 2)
    logged = collect(agent, env, args.episodes, args.eps_behavior, args.seed + 3)
    save_parquet(logged, args.out / "logged.parquet")
    n = int(env.single_action_space.n)
    rows = {"truth (Monte Carlo of pi)": truth} | estimates(agent, logged, args.eps_target, n, args.gamma, args.seed)
    r, m = logged.padded(logged.reward)
    behavior = (r * m * args.gamma ** torch.arange(r.shape[1], dtype=torch.float64)).sum(-1)
    rows["on-policy mean of mu's returns (for scale)"] = ope_estimate(behavior, torch.ones_like(behavior))
    print(f"| estimator | value | 95% interval | error vs truth |  (seed {args.seed}, {args.episodes} logged "
          f"episodes, {int(m.sum())} steps, {time.time() - t0:.0f} s)\n|---|---:|---|---:|")
    for name, est in rows.items():
        err = est["value"] - truth["value"]
        print(f"| {name} | {est['value']:.2f} | [{est['ci_low']:.2f}, {est['ci_high']:.2f}] | {err:+.2f} |")
    lines = risk_return(agent, env, logged, args, n) if args.candidates else []
    print("\n".join(["", *lines, f"({time.time() - t0:.0f} s in all)"]))
    (args.out / "ope.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows,
                                                   "risk_return": lines}, indent=2))


if __name__ == "__main__":
    main()
