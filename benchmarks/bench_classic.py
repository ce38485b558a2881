"""reinforge's classic agents against Stable-Baselines3 and CleanRL's PPO, DQN and SAC algorithms: environment steps
and wall-clock to a return threshold, and environment steps per second.

    python benchmarks/bench_classic.py [--seeds 0,1,2,3,4] [--impls ...] [--out runs/bench-classic]

Tasks and thresholds (the issue's): CartPole-v1 to a 20-episode training mean of 475 (cap 500k steps),
Pendulum-v1 to a 10-episode training mean of -300 (cap 30k steps). Implementations, each with the same
hyper-parameters (CleanRL ppo.py's for PPO, CleanRL sac_continuous_action.py's with learning from step
1000 for SAC, i.e. the shipped ``cartpole_ppo`` / ``pendulum_sac`` recipes):

- ``reinforge-ppo`` / ``reinforge-sac``: the recipe's agent, ``iterate`` in a loop;
- ``cleanrl-ppo``: CleanRL's ppo.py algorithm as a reference loop written here (``cleanrl`` on PyPI pins
  an old gym and torch and its ppo.py is a script, not a library): 4 Gymnasium envs x 128 steps, GAE
  with a time limit treated as a termination, 4 epochs x 4 mini-batches, clipped value loss, Adam eps
  1e-5 with a linear learning-rate decay, the same 64-64 tanh actor and critic with orthogonal init;
- ``reinforge-envpool-ppo``: ``reinforge-ppo`` with ``classic.env.backend=envpool`` (needs envpool);
- ``sb3-ppo`` / ``sb3-sac``: Stable-Baselines3 with those settings (SB3 has one learning rate for SAC's
  actor and critics: 3e-4; its actor updates every step).

Added in the fourth pass (benchmarks/classic_impls.py has the tasks, thresholds and settings):

- ``reinforge-dqn`` / ``sb3-dqn``: the ``cartpole_dqn`` recipe (RL Baselines3 Zoo's tuned SB3 DQN settings)
  on CartPole-v1 to 195 over 20 episodes within its 50k-step budget;
- ``reinforge-her-dqn`` / ``sb3-her-dqn``: the ``bit_flipping_dqn_her`` recipe (DQN with HER, ``future``,
  k 4) and SB3 DQN with its ``HerReplayBuffer`` on reinforge's 10-bit flipping, to a success rate of 0.9
  over 50 training episodes within 8,000 steps;
- ``reinforge-mbpo`` / ``reinforge-sac128``: the ``pendulum_mbpo`` recipe against ``pendulum_sac`` with
  MBPO's 128-128 networks and batch 128, Pendulum-v1 to -400 over 3 episodes within 5,000 steps.

Added after the fourth pass (benchmarks/cleanrl_loops.py): ``cleanrl-dqn`` and ``cleanrl-sac``, CleanRL's
dqn.py and sac_continuous_action.py algorithms as reference loops, with the settings of the
``reinforge-dqn`` / ``sb3-dqn`` and ``reinforge-sac`` / ``sb3-sac`` pairs (dqn.py's 120-84 Q-network kept;
``cleanrl-dqn256`` has the recipe's 256-256).

Every run is a fresh subprocess with one torch thread; the clock starts once the agent is built and
stops at the threshold. Runs are interleaved (seed 0: every implementation, then seed 1, ...); each
result records the 1-minute load average before and after it (``load1``), and ``results.json`` is
rewritten after every run, so a stopped benchmark keeps what it ran. Each run
is written as a run directory (``metrics.jsonl`` with ``bench/env_steps_to_threshold``,
``bench/wall_s_to_threshold``, ``bench/env_steps_per_s``; a run that misses the threshold is scored at
the cap) and the groups are aggregated by ``reinforge compare`` (reinforge.eval.compare.run_compare).
``--throughput`` runs a fixed budget without a threshold (steps per second only: SAC's budget of 3,000
steps includes 2,000 gradient steps after its 1,000 random ones).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from classic_impls import IMPL_TASK, PRELUDE, RECIPES, TASKS, THROUGHPUT, child

IMPLS = ["reinforge-ppo", "cleanrl-ppo", "sb3-ppo", "reinforge-sac", "sb3-sac"]
# reinforge-envpool-ppo: reinforge PPO on EnvPool's CartPole-v1 (classic.env.backend=envpool; needs envpool)
# the fourth pass: reinforge-dqn,sb3-dqn,reinforge-her-dqn,sb3-her-dqn,reinforge-mbpo,reinforge-sac128
# CleanRL's DQN and SAC loops: reinforge-dqn,cleanrl-dqn,cleanrl-dqn256 and reinforge-sac,cleanrl-sac
PAIRS = [("reinforge-ppo", "cleanrl-ppo"), ("reinforge-ppo", "sb3-ppo"), ("reinforge-envpool-ppo", "cleanrl-ppo"),
         ("reinforge-envpool-ppo", "sb3-ppo"), ("reinforge-envpool-ppo", "reinforge-ppo"), ("reinforge-sac", "sb3-sac"),
         ("reinforge-dqn", "sb3-dqn"), ("reinforge-dqn", "cleanrl-dqn"), ("reinforge-dqn", "cleanrl-dqn256"), ("reinforge-sac", "cleanrl-sac"), ("reinforge-her-dqn", "sb3-her-dqn"), ("reinforge-mbpo", "reinforge-sac128")]


def run_one(impl: str, seed: int, throughput: bool = False) -> dict:
    task = IMPL_TASK[impl]
    load_before = os.getloadavg()[0]
    env_id, threshold, window, cap, success_above = TASKS[task]
    if throughput:
        threshold, cap = float("inf"), THROUGHPUT[task]
    code = PRELUDE + f"RECIPES = {RECIPES!r}\n" + child(impl)
    argv = [impl, str(seed), str(threshold), str(window), str(cap), str(success_above).lower()]
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=7200)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{impl} seed {seed} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):]) | {"impl": impl, "seed": seed, "env": env_id, "task": task,
                                                     "load1": [load_before, os.getloadavg()[0]]}


def write_run(out: Path, r: dict) -> Path:
    """A run directory `reinforge compare` reads: config.yaml (seed, name) and one metrics record."""
    path = out / f"{r['impl']}-s{r['seed']}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(f"seed: {r['seed']}\nname: {r['impl']}-s{r['seed']}\n")
    record = {"step": 1, "bench/env_steps_to_threshold": r["steps"], "bench/wall_s_to_threshold": r["wall_s"],
              "bench/env_steps_per_s": r["steps_per_s"], "bench/reached": float(r["reached"])}
    (path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    return path


def ratios(results: list[dict], a: str, b: str, key: str) -> str:
    """Median (min-max) over seeds of a's value / b's value for the same seed."""
    by = {(r["impl"], r["seed"]): r[key] for r in results}
    vals = [by[(a, s)] / by[(b, s)] for (i, s) in by if i == a and (b, s) in by]
    return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f}, n={len(vals)})" if vals else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--out", type=Path, default=Path("runs/bench-classic"))
    p.add_argument("--throughput", action="store_true", help="no threshold: a fixed budget per run "
                   f"({THROUGHPUT}), for environment steps per second alone")
    args = p.parse_args()
    impls, results = args.impls.split(","), []
    for seed in (int(s) for s in args.seeds.split(",")):
        for impl in impls:
            results.append(run_one(impl, seed, args.throughput))
            write_run(args.out, results[-1])
            (args.out / "results.json").write_text(json.dumps(results, indent=1))  # after every run
            print(json.dumps(results[-1]), flush=True)
    from reinforge.eval.compare import run_compare

    for task in dict.fromkeys(IMPL_TASK[i] for i in impls):  # one comparison per task
        names = [i for i in impls if IMPL_TASK[i] == task]
        for metric in ("bench/wall_s_to_threshold", "bench/env_steps_to_threshold", "bench/env_steps_per_s"):
            groups = [f"{i}=" + ",".join(str(args.out / f"{i}-s{r['seed']}") for r in results if r["impl"] == i)
                      for i in names]
            print(f"\n{task}:\n{run_compare(groups, metric, n_boot=1000)}")
    for a, b in PAIRS:
        if a in impls and b in impls:
            print(f"\n{a} / {b}: wall-clock to threshold {ratios(results, a, b, 'wall_s')}, env steps "
                  f"{ratios(results, a, b, 'steps')}, steps/s {ratios(results, a, b, 'steps_per_s')}")


if __name__ == "__main__":
    main()
