"""CleanRL's DQN and SAC algorithms as reference loops for benchmarks/bench_classic.py, run like
``cleanrl-ppo`` (classic_impls.CLEANRL_PPO): a fresh ``python -c`` child with one torch thread, the clock
started once the networks are built, ``seen`` called with each finished episode's return and ``report``
at the end. ``cleanrl`` on PyPI pins an old gym and torch and its files are scripts, so the algorithms are
written here, after cleanrl/dqn.py and cleanrl/sac_continuous_action.py (vwxyzjn/cleanrl), with one
Gymnasium environment (both scripts assert or default to one) and a NumPy replay buffer sampled uniformly
with replacement like SB3's ``ReplayBuffer`` that CleanRL uses. A truncated episode stores its real last
observation and bootstraps from it (CleanRL's ``real_next_obs``, ``handle_timeout_termination=False``).

``cleanrl-dqn`` (Mnih et al. 2015): dqn.py's loop, i.e. at step t (from 0) epsilon-greedy with
epsilon = max(start_e + (end_e - start_e) t / (fraction * total), end_e); for t > learning_starts, every
``train_frequency`` steps a TD update on y = r + gamma (1 - terminated) max_a' Q_target(s', a'); every
``target_network_frequency`` steps Q_target <- tau Q + (1 - tau) Q_target; Adam; dqn.py's 120-84 ReLU
Q-network. The hyper-parameters are those of ``reinforge-dqn`` / ``sb3-dqn`` (the ``cartpole_dqn``
recipe, RL Baselines3 Zoo's): lr 2.3e-3, batch 64, buffer 100k, learning from step 1,000, 128 gradient
steps every 256 steps (dqn.py does one per train step: ``gradient_steps`` is the one addition), a copy
every 10 steps (tau 1), epsilon 1 -> 0.04 over 16% of 50k steps, Huber loss and a gradient clip of 10.
dqn.py's own defaults differ: lr 2.5e-4, batch 128, buffer 10k, learning from step 10k, one gradient
step every 10 steps, a copy every 500 steps, epsilon 1 -> 0.05 over half of 500k steps, MSE loss, no
clip. The network stays dqn.py's 120-84 (the recipe's is 256-256); ``cleanrl-dqn256`` is the same loop
with the recipe's 256-256 network, for a per-step cost like for like.

``cleanrl-sac`` (Haarnoja et al. 2018, with the automatic temperature of the "Algorithms and
Applications" paper): sac_continuous_action.py's loop with the ``pendulum_sac`` recipe's settings (its
defaults but learning from step 1,000 instead of 5,000): random actions before step 1,000, then for
t > 1,000 one critic step per environment step on both Q-networks with
y = r + gamma (1 - terminated) (min_i Q_target_i(s', a') - alpha log pi(a'|s')), a' ~ pi(s'); every
``policy_frequency`` = 2 steps, 2 actor steps (the delay compensated) on alpha log pi(a|s) - min_i Q_i(s, a),
each followed by a step on log alpha with loss -alpha (log pi + target_entropy), target_entropy = -|A|;
Polyak tau 0.005 every step; Adam 3e-4 for the actor, 1e-3 for the critics and alpha; batch 256, buffer
1M; 256-256 ReLU networks; a tanh-squashed Gaussian with log std squashed into [-5, 2].
"""

from __future__ import annotations

DQN = r"""
import random
import gymnasium as gym
from torch import nn
random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
total, lr, gamma, size, batch, starts = 50_000, 2.3e-3, 0.99, 100_000, 64, 1000
train_frequency, gradient_steps, target_frequency, tau = 256, 128, 10, 1.0
start_e, end_e, fraction, max_norm = 1.0, 0.04, 0.16, 10.0
env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
env.action_space.seed(seed)
h1, h2 = (256, 256) if impl == "cleanrl-dqn256" else (120, 84)  # the recipe's network, else dqn.py's
def q_network():
    return nn.Sequential(nn.Linear(4, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU(), nn.Linear(h2, 2))
q, q_target = q_network(), q_network()
q_target.load_state_dict(q.state_dict())
opt = torch.optim.Adam(q.parameters(), lr=lr)
b_obs, b_next = np.zeros((size, 4), np.float32), np.zeros((size, 4), np.float32)
b_a, b_r, b_term = np.zeros(size, np.int64), np.zeros(size, np.float32), np.zeros(size, np.float32)
def train(upper):
    i = np.random.randint(0, upper, batch)
    o, o2, a = torch.from_numpy(b_obs[i]), torch.from_numpy(b_next[i]), torch.from_numpy(b_a[i])
    with torch.no_grad():
        y = torch.from_numpy(b_r[i]) + gamma * q_target(o2).max(dim=1).values * (1 - torch.from_numpy(b_term[i]))
    loss = nn.functional.smooth_l1_loss(q(o).gather(1, a[:, None]).squeeze(1), y)
    opt.zero_grad(); loss.backward(); nn.utils.clip_grad_norm_(q.parameters(), max_norm); opt.step()
obs, _ = env.reset(seed=seed)
steps, state["t0"] = 0, time.perf_counter()
for t in range(total):
    epsilon = max(start_e + (end_e - start_e) * t / (fraction * total), end_e)
    if random.random() < epsilon:
        a = env.action_space.sample()
    else:
        with torch.no_grad():
            a = int(q(torch.as_tensor(obs, dtype=torch.float32)).argmax())
    next_obs, r, term, trunc, info = env.step(a)
    j = t % size
    b_obs[j], b_next[j], b_a[j], b_r[j], b_term[j] = obs, next_obs, a, r, float(term)
    obs, steps = next_obs, t + 1
    if term or trunc:  # the episode is seen before the step's training, as in dqn.py (and SB3's callback)
        obs, _ = env.reset()
        if seen([float(info["episode"]["r"])], steps):
            break
    if steps >= cap:
        break
    if t > starts:
        if t % train_frequency == 0:
            for _ in range(gradient_steps):
                train(min(steps, size))
        if t % target_frequency == 0:
            for p, pt in zip(q.parameters(), q_target.parameters()):
                pt.data.copy_(tau * p.data + (1.0 - tau) * pt.data)
report(steps)
"""

SAC = r"""
import random
import gymnasium as gym
from torch import nn
random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
gamma, tau, size, batch, starts = 0.99, 0.005, 1_000_000, 256, 1000
policy_lr, q_lr, policy_frequency, target_frequency = 3e-4, 1e-3, 2, 1
env = gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1"))
env.action_space.seed(seed)
O, A = env.observation_space.shape[0], env.action_space.shape[0]
scale = torch.tensor((env.action_space.high - env.action_space.low) / 2.0, dtype=torch.float32)
bias = torch.tensor((env.action_space.high + env.action_space.low) / 2.0, dtype=torch.float32)
def mlp(i, o):
    return nn.Sequential(nn.Linear(i, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, o))
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(O, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.mean, self.log_std = nn.Linear(256, A), nn.Linear(256, A)
    def forward(self, x):
        h = self.body(x)
        log_std = -5.0 + 0.5 * (2.0 - -5.0) * (torch.tanh(self.log_std(h)) + 1)
        normal = torch.distributions.Normal(self.mean(h), log_std.exp())
        x_t = normal.rsample()
        y = torch.tanh(x_t)
        log_pi = (normal.log_prob(x_t) - torch.log(scale * (1 - y.pow(2)) + 1e-6)).sum(-1)
        return y * scale + bias, log_pi
actor, qs, q_targets = Actor(), [mlp(O + A, 1), mlp(O + A, 1)], [mlp(O + A, 1), mlp(O + A, 1)]
for qt, qn in zip(q_targets, qs):
    qt.load_state_dict(qn.state_dict())
q_params = [p for qn in qs for p in qn.parameters()]
q_opt, actor_opt = torch.optim.Adam(q_params, lr=q_lr), torch.optim.Adam(actor.parameters(), lr=policy_lr)
target_entropy, log_alpha = -float(A), torch.zeros(1, requires_grad=True)
alpha, alpha_opt = log_alpha.exp().item(), torch.optim.Adam([log_alpha], lr=q_lr)
def q_min(nets, o, a):
    return torch.min(*[n(torch.cat([o, a], 1)).squeeze(1) for n in nets])
b_obs, b_next = np.zeros((size, O), np.float32), np.zeros((size, O), np.float32)
b_a, b_r, b_term = np.zeros((size, A), np.float32), np.zeros(size, np.float32), np.zeros(size, np.float32)
def update(t, upper):
    global alpha
    i = np.random.randint(0, upper, batch)
    o, o2, a = torch.from_numpy(b_obs[i]), torch.from_numpy(b_next[i]), torch.from_numpy(b_a[i])
    with torch.no_grad():
        a2, log_pi2 = actor(o2)
        y = torch.from_numpy(b_r[i]) + (1 - torch.from_numpy(b_term[i])) * gamma * (q_min(q_targets, o2, a2) - alpha * log_pi2)
    sa = torch.cat([o, a], 1)
    q_loss = sum(nn.functional.mse_loss(qn(sa).squeeze(1), y) for qn in qs)
    q_opt.zero_grad(); q_loss.backward(); q_opt.step()
    if t % policy_frequency == 0:
        for _ in range(policy_frequency):  # the delay compensated
            pi, log_pi = actor(o)
            actor_loss = (alpha * log_pi - q_min(qs, o, pi)).mean()
            actor_opt.zero_grad(); actor_loss.backward(); actor_opt.step()
            with torch.no_grad():
                _, log_pi = actor(o)
            alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()
            alpha_opt.zero_grad(); alpha_loss.backward(); alpha_opt.step()
            alpha = log_alpha.exp().item()
    if t % target_frequency == 0:
        for qn, qt in zip(qs, q_targets):
            for p, pt in zip(qn.parameters(), qt.parameters()):
                pt.data.copy_(tau * p.data + (1 - tau) * pt.data)
obs, _ = env.reset(seed=seed)
steps, state["t0"] = 0, time.perf_counter()
for t in range(cap):
    if t < starts:
        a = env.action_space.sample()
    else:
        with torch.no_grad():
            a = actor(torch.as_tensor(obs, dtype=torch.float32)[None])[0][0].numpy()
    next_obs, r, term, trunc, info = env.step(a)
    j = t % size
    b_obs[j], b_next[j], b_a[j], b_r[j], b_term[j] = obs, next_obs, a, r, float(term)
    obs, steps = next_obs, t + 1
    if term or trunc:  # the episode is seen before the step's update, as in sac_continuous_action.py
        obs, _ = env.reset()
        if seen([float(info["episode"]["r"])], steps):
            break
    if t > starts:
        update(t, min(steps, size))
report(steps)
"""
