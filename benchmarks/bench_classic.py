"""reinforge's classic agents against Stable-Baselines3 and CleanRL's PPO algorithm: environment steps and
wall-clock to a return threshold, and environment steps per second.

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

TASKS = {"ppo": ("CartPole-v1", 475.0, 20, 500_000), "sac": ("Pendulum-v1", -300.0, 10, 30_000)}
THROUGHPUT = {"ppo": 20_480, "sac": 3_000}  # --throughput: a fixed budget, no threshold (steps/s only)
IMPLS = ["reinforge-ppo", "cleanrl-ppo", "sb3-ppo", "reinforge-sac", "sb3-sac"]
# reinforge-envpool-ppo: reinforge PPO on EnvPool's CartPole-v1 (classic.env.backend=envpool; needs envpool)
PAIRS = [("reinforge-ppo", "cleanrl-ppo"), ("reinforge-ppo", "sb3-ppo"), ("reinforge-envpool-ppo", "cleanrl-ppo"),
         ("reinforge-envpool-ppo", "sb3-ppo"), ("reinforge-envpool-ppo", "reinforge-ppo"), ("reinforge-sac", "sb3-sac")]

PRELUDE = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
impl, seed, threshold, window, cap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
recent, state = [], {"reached": None}
def seen(returns, steps):
    global recent
    recent = (recent + [float(r) for r in returns])[-window:]
    if state["reached"] is None and len(recent) == window and np.mean(recent) >= threshold:
        state["reached"] = (steps, time.perf_counter() - state["t0"])
    return state["reached"] is not None
def report(steps):
    wall = time.perf_counter() - state["t0"]
    reached = state["reached"]
    print("RESULT " + json.dumps({"reached": reached is not None, "steps": reached[0] if reached else cap,
          "wall_s": reached[1] if reached else wall, "steps_per_s": steps / wall}))
"""

REINFORGE = r"""
from reinforge.classic.agents import build_agent
from reinforge.classic.config import load_classic_config
from reinforge.classic.envs import make_vec_env
recipe = {"reinforge-ppo": "cartpole_ppo", "reinforge-envpool-ppo": "cartpole_ppo", "reinforge-sac": "pendulum_sac"}[impl]
backend = ["classic.env.backend=envpool"] if "envpool" in impl else []
c = load_classic_config(recipe, [f"seed={seed}", *backend]).classic
agent = build_agent(c.agent.name, make_vec_env(c.env, c.agent.settings.gamma, seed), seed, c.agent.settings)
total = c.train.total_env_steps // agent.steps_per_iteration if impl.endswith("ppo") else cap
steps, state["t0"] = 0, time.perf_counter()
for i in range(total):
    it = agent.iterate(i / total)
    steps += agent.steps_per_iteration
    if seen([r for r, _ in it.episodes], steps) or steps >= cap:
        break
report(steps)
"""

SB3 = r"""
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
class Stop(BaseCallback):
    def _on_step(self):
        returns = [i["episode"]["r"] for i in self.locals["infos"] if "episode" in i]
        return not (seen(returns, self.num_timesteps) or self.num_timesteps >= cap)
if impl == "sb3-ppo":
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=seed), n_steps=128, batch_size=128,
                n_epochs=4, learning_rate=lambda f: 2.5e-4 * f, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
                clip_range_vf=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, seed=seed, device="cpu")
    budget = 500_000
else:
    model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=seed), learning_rate=3e-4,
                buffer_size=1_000_000, learning_starts=1000, batch_size=256, tau=0.005, gamma=0.99,
                policy_kwargs={"net_arch": [256, 256]}, seed=seed, device="cpu")
    budget = cap
state["t0"] = time.perf_counter()
model.learn(budget, callback=Stop())
report(model.num_timesteps)
"""

CLEANRL = r"""
import gymnasium as gym
from gymnasium.vector import AutoresetMode
from torch import nn
def layer(i, o, std=2 ** 0.5):
    lin = nn.Linear(i, o); nn.init.orthogonal_(lin.weight, std); nn.init.constant_(lin.bias, 0.0); return lin
torch.manual_seed(seed); np.random.seed(seed)
E, T, lr, updates = 4, 128, 2.5e-4, 500_000 // 512
envs = gym.make_vec("CartPole-v1", num_envs=E, vectorization_mode="sync",
                    vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                    wrappers=[gym.wrappers.RecordEpisodeStatistics])
critic = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
actor = nn.Sequential(layer(4, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 2, 0.01))
params = [*actor.parameters(), *critic.parameters()]
opt = torch.optim.Adam(params, lr=lr, eps=1e-5)
obs = torch.tensor(envs.reset(seed=seed)[0], dtype=torch.float32)
done = torch.zeros(E)
buf = {k: torch.zeros(T, E) for k in ("a", "logp", "r", "d", "v")}
buf_obs = torch.zeros(T, E, 4)
steps, state["t0"] = 0, time.perf_counter()
for u in range(updates):
    opt.param_groups[0]["lr"] = lr * (1 - u / updates)
    for t in range(T):
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=actor(obs))
            a = dist.sample()
            buf["v"][t] = critic(obs).squeeze(-1)
        buf_obs[t], buf["d"][t], buf["a"][t], buf["logp"][t] = obs, done, a, dist.log_prob(a)
        o, r, term, trunc, info = envs.step(a.numpy())
        buf["r"][t] = torch.tensor(r, dtype=torch.float32)
        obs, done = torch.tensor(o, dtype=torch.float32), torch.tensor(term | trunc, dtype=torch.float32)
        steps += E
        final = info.get("final_info") or {}
        if "episode" in final:
            seen(final["episode"]["r"][final["_episode"]], steps)
    with torch.no_grad():
        next_v, adv, last = critic(obs).squeeze(-1), torch.zeros(T, E), torch.zeros(E)
        for t in reversed(range(T)):
            nonterminal = 1.0 - (done if t == T - 1 else buf["d"][t + 1])
            nv = next_v if t == T - 1 else buf["v"][t + 1]
            delta = buf["r"][t] + 0.99 * nv * nonterminal - buf["v"][t]
            adv[t] = last = delta + 0.99 * 0.95 * nonterminal * last
        ret = adv + buf["v"]
    b_obs, b_a, b_logp = buf_obs.reshape(-1, 4), buf["a"].reshape(-1), buf["logp"].reshape(-1)
    b_adv, b_ret, b_v = adv.reshape(-1), ret.reshape(-1), buf["v"].reshape(-1)
    for epoch in range(4):
        for mb in torch.randperm(T * E).split(T * E // 4):
            dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
            ratio = (dist.log_prob(b_a[mb]) - b_logp[mb]).exp()
            a_mb = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
            pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(0.8, 1.2)).mean()
            v = critic(b_obs[mb]).squeeze(-1)
            v_clip = b_v[mb] + (v - b_v[mb]).clamp(-0.2, 0.2)
            v_loss = 0.5 * torch.max((v - b_ret[mb]) ** 2, (v_clip - b_ret[mb]) ** 2).mean()
            loss = pg - 0.01 * dist.entropy().mean() + 0.5 * v_loss
            opt.zero_grad(); loss.backward(); nn.utils.clip_grad_norm_(params, 0.5); opt.step()
    if state["reached"] is not None or steps >= cap:
        break
report(steps)
"""

CHILDREN = {"reinforge": REINFORGE, "sb3": SB3, "cleanrl": CLEANRL}


def run_one(impl: str, seed: int, throughput: bool = False) -> dict:
    algo = impl.rsplit("-", 1)[1]
    load_before = os.getloadavg()[0]
    env_id, threshold, window, cap = TASKS[algo]
    if throughput:
        threshold, cap = float("inf"), THROUGHPUT[algo]
    code = PRELUDE + CHILDREN[impl.split("-")[0]]
    out = subprocess.run([sys.executable, "-c", code, impl, str(seed), str(threshold), str(window), str(cap)],
                         capture_output=True, text=True, timeout=7200)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{impl} seed {seed} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):]) | {"impl": impl, "seed": seed, "env": env_id,
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

    for metric in ("bench/wall_s_to_threshold", "bench/env_steps_to_threshold", "bench/env_steps_per_s"):
        groups = [f"{i}=" + ",".join(str(args.out / f"{i}-s{r['seed']}") for r in results if r["impl"] == i)
                  for i in impls]
        print(f"\n{run_compare(groups, metric, n_boot=1000)}")
    for a, b in PAIRS:
        if a in impls and b in impls:
            print(f"\n{a} / {b}: wall-clock to threshold {ratios(results, a, b, 'wall_s')}, env steps "
                  f"{ratios(results, a, b, 'steps')}, steps/s {ratios(results, a, b, 'steps_per_s')}")


if __name__ == "__main__":
    main()
