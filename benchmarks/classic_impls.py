"""The code each run of benchmarks/bench_classic.py executes in a fresh ``python -c`` process, one string
per family of implementations, and the tasks they run on.

A child gets ``impl seed threshold window cap success_above`` on its command line. ``PRELUDE`` gives it
``seen(returns, steps)`` (the running window of the last ``window`` episode scores, the first step and
wall-clock at which their mean reached ``threshold``) and ``report(steps)`` (the ``RESULT`` line the
parent reads). An episode's score is its return, or with ``success_above`` set 1.0 when the return is
above it and 0.0 otherwise (a success rate: bit flipping ends on success, so a return above -n is one).

Tasks (env id, threshold, window in episodes, cap in environment steps, success_above) and what runs on
each:

- ``cartpole-ppo``: CartPole-v1 to 475 over 20 episodes, cap 500k (the issue's); reinforge PPO (also on
  EnvPool), the CleanRL ppo.py loop, SB3 PPO, all with CleanRL's settings (the ``cartpole_ppo`` recipe);
- ``pendulum-sac``: Pendulum-v1 to -300 over 10 episodes, cap 30k (the issue's); reinforge SAC, SB3 SAC and
  the CleanRL sac_continuous_action.py loop (cleanrl_loops.SAC) with the ``pendulum_sac`` recipe's
  (CleanRL's) settings;
- ``cartpole-dqn``: CartPole-v1 to 195 over 20 episodes (CartPole-v0's "solved" level), cap 50k (the
  ``cartpole_dqn`` recipe's budget, RL Baselines3 Zoo's tuned SB3 settings, which reinforge DQN, SB3 DQN
  and the CleanRL dqn.py loop (cleanrl_loops.DQN, with dqn.py's 120-84 network; ``cleanrl-dqn256`` with
  the recipe's 256-256) run; its epsilon
  schedule is a share of this budget, so the cap is the budget of both). Not 475: measured once (seed 0),
  reinforge's DQN reached a 20-episode training mean of 475 at 46,336 of its 50k steps and SB3's did not
  within 50k, so most runs would score the cap;
- ``bitflip-her``: 10-bit flipping, a success rate of 0.9 over 50 training episodes, cap 8,000 (the
  ``bit_flipping_dqn_her`` recipe: DQN with HER, ``future``, k 4); reinforge's ``reinforge/BitFlipping-v0``
  for both (SB3's ``HerReplayBuffer`` takes it: a GoalEnv with a batched ``compute_reward``);
- ``pendulum-mbpo``: Pendulum-v1 to -400 over 3 episodes, cap 5,000 (docs/classic.md, "Measured: MBPO,
  SAC and PETS on Pendulum-v1"): reinforge MBPO (``pendulum_mbpo``) against reinforge SAC with MBPO's
  SAC networks and batch (``pendulum_sac`` with 128-128 networks and batch 128: ``reinforge-sac128``).
"""

from __future__ import annotations

import cleanrl_loops

TASKS = {
    "cartpole-ppo": ("CartPole-v1", 475.0, 20, 500_000, None),
    "pendulum-sac": ("Pendulum-v1", -300.0, 10, 30_000, None),
    "cartpole-dqn": ("CartPole-v1", 195.0, 20, 50_000, None),
    "bitflip-her": ("reinforge/BitFlipping-v0 (10 bits)", 0.9, 50, 8_000, -10.0),
    "pendulum-mbpo": ("Pendulum-v1", -400.0, 3, 5_000, None),
}
IMPL_TASK = {"reinforge-ppo": "cartpole-ppo", "cleanrl-ppo": "cartpole-ppo", "sb3-ppo": "cartpole-ppo",
             "reinforge-envpool-ppo": "cartpole-ppo", "reinforge-sac": "pendulum-sac", "sb3-sac": "pendulum-sac",
             "cleanrl-sac": "pendulum-sac", "reinforge-dqn": "cartpole-dqn", "sb3-dqn": "cartpole-dqn",
             "cleanrl-dqn": "cartpole-dqn", "cleanrl-dqn256": "cartpole-dqn", "reinforge-her-dqn": "bitflip-her",
             "sb3-her-dqn": "bitflip-her", "reinforge-mbpo": "pendulum-mbpo", "reinforge-sac128": "pendulum-mbpo"}
# --throughput: a fixed budget per task, no threshold (steps/s only)
THROUGHPUT = {"cartpole-ppo": 20_480, "pendulum-sac": 3_000, "cartpole-dqn": 10_240, "bitflip-her": 2_000,
              "pendulum-mbpo": 2_000}
# reinforge's recipe and overrides per implementation (the budget is the recipe's; the run stops at the cap)
RECIPES = {
    "reinforge-ppo": ("cartpole_ppo", []),
    "reinforge-envpool-ppo": ("cartpole_ppo", ["classic.env.backend=envpool"]),
    "reinforge-sac": ("pendulum_sac", ["classic.train.total_env_steps=30000"]),
    "reinforge-dqn": ("cartpole_dqn", []),
    "reinforge-her-dqn": ("bit_flipping_dqn_her", []),
    "reinforge-mbpo": ("pendulum_mbpo", ["classic.train.total_env_steps=5000"]),
    "reinforge-sac128": ("pendulum_sac", ["classic.train.total_env_steps=5000", "classic.agent.hidden=[128,128]",
                                          "classic.agent.batch_size=128"]),
}

PRELUDE = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
impl, seed, threshold, window, cap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
success_above = None if sys.argv[6] == "none" else float(sys.argv[6])
recent, state = [], {"reached": None}
def seen(returns, steps):
    global recent
    scores = [float(r) if success_above is None else float(float(r) > success_above) for r in returns]
    recent = (recent + scores)[-window:]
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
recipe, overrides = RECIPES[impl]
c = load_classic_config(recipe, [f"seed={seed}", *overrides]).classic
agent = build_agent(c.agent.name, make_vec_env(c.env, c.agent.settings.gamma, seed), seed, c.agent.settings, c.env)
total = max(1, c.train.total_env_steps // agent.steps_per_iteration)  # schedules run over the recipe's budget
steps, state["t0"] = 0, time.perf_counter()
for i in range(total):
    it = agent.iterate(i / total)
    steps += agent.steps_per_iteration
    if seen([r for r, _ in it.episodes], steps) or steps >= cap:
        break
report(steps)
"""

SB3 = r"""
from stable_baselines3 import DQN, PPO, SAC, HerReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
class Stop(BaseCallback):
    def _on_step(self):
        returns = [i["episode"]["r"] for i in self.locals["infos"] if "episode" in i]
        return not (seen(returns, self.num_timesteps) or self.num_timesteps >= cap)
budget = cap
if impl == "sb3-ppo":
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=seed), n_steps=128, batch_size=128,
                n_epochs=4, learning_rate=lambda f: 2.5e-4 * f, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
                clip_range_vf=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, seed=seed, device="cpu")
    budget = 500_000
elif impl == "sb3-sac":
    model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=seed), learning_rate=3e-4,
                buffer_size=1_000_000, learning_starts=1000, batch_size=256, tau=0.005, gamma=0.99,
                policy_kwargs={"net_arch": [256, 256]}, seed=seed, device="cpu")
elif impl == "sb3-dqn":  # the cartpole_dqn recipe: RL Baselines3 Zoo's hyperparams/dqn.yml for CartPole-v1
    model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=seed), learning_rate=2.3e-3,
                buffer_size=100_000, learning_starts=1000, batch_size=64, tau=1.0, gamma=0.99, train_freq=256,
                gradient_steps=128, target_update_interval=10, exploration_fraction=0.16,
                exploration_initial_eps=1.0, exploration_final_eps=0.04, max_grad_norm=10.0,
                policy_kwargs={"net_arch": [256, 256]}, seed=seed, device="cpu")
else:  # sb3-her-dqn: the bit_flipping_dqn_her recipe on reinforge's environment
    from reinforge.classic.goal_envs import register_goal_envs
    register_goal_envs()
    env = make_vec_env("reinforge/BitFlipping-v0", n_envs=1, seed=seed, env_kwargs={"n_bits": 10})
    model = DQN("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer,
                replay_buffer_kwargs={"n_sampled_goal": 4, "goal_selection_strategy": "future"},
                learning_rate=1e-3, buffer_size=100_000, learning_starts=256, batch_size=128, tau=0.05,
                gamma=0.98, train_freq=16, gradient_steps=8, target_update_interval=16,
                exploration_fraction=0.5, exploration_initial_eps=0.5, exploration_final_eps=0.05,
                max_grad_norm=float("inf"), policy_kwargs={"net_arch": [256]}, seed=seed, device="cpu")
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

CHILDREN = {"reinforge": REINFORGE, "sb3": SB3, "cleanrl": CLEANRL, "cleanrl-dqn": cleanrl_loops.DQN,
            "cleanrl-dqn256": cleanrl_loops.DQN,
            "cleanrl-sac": cleanrl_loops.SAC}


def child(impl: str) -> str:
    """The code a run of ``impl`` executes: its own entry, else its family's (``reinforge-*``, ``sb3-*``)."""
    return CHILDREN.get(impl) or CHILDREN[impl.split("-")[0]]
