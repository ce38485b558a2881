"""MBPO and PETS (classic/mbpo.py, classic/pets.py, classic/dynamics.py, algo/model_based.py): the bounded
log-variance, the Gaussian NLL and the CEM update by hand, elite selection, the rollout schedule, model-rollout
branching (shapes and termination) with a noiseless hand-set ensemble, the model buffer's ring, MBPO's mixed
batch, trajectory sampling's returns, CEM on a toy quadratic, the settings' checks; two tiny learning runs
(the dynamics model's held-out error falls; PETS on Pendulum beats random actions); with mujoco, the
InvertedPendulum termination function against the environment's own and the inverted_pendulum_mbpo recipe
past its first model fit. MBPO against SAC on Pendulum and InvertedPendulum: tests/test_classic_learning.py
(make test-learning) and docs/classic.md."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.model_based import (
    bound_log_variance,
    cem_update,
    elite_indices,
    gaussian_nll,
    logvar_bound_penalty,
    member_mse,
    rollout_length,
)
from reinforge.classic.dynamics import (
    DynamicsSettings,
    ProbabilisticEnsemble,
    _split,
    fit,
    holdout_mse,
    transition_arrays,
)
from reinforge.classic.replay import Replay
from reinforge.errors import ConfigError


@pytest.fixture(autouse=True)
def _denormals_back():
    """The agents flush denormal floats (process-wide); the rest of the suite runs with the default."""
    yield
    torch.set_flush_denormal(False)


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_bounded_log_variance_by_hand():
    """log s^2 = min + softplus(max - softplus(max - v) - min): v = 0 with (min, max) = (-10, 0.5) gives
    0.5 - softplus(0.5) = -0.474077, then -10 + softplus(9.525923) = -0.474004; far outside, the bounds."""
    lo, hi = torch.tensor(-10.0), torch.tensor(0.5)
    inner = 0.5 - _softplus(0.5)
    expected = -10.0 + _softplus(inner + 10.0)
    assert abs(inner - (-0.474077)) < 1e-6 and abs(expected - (-0.474004)) < 1e-6
    out = bound_log_variance(torch.tensor([0.0, 50.0, -50.0]), lo, hi)
    assert_close(out[0], torch.tensor(expected))
    assert abs(out[1] - 0.5) < 1e-4 and abs(out[2] + 10.0) < 1e-4


def test_gaussian_nll_by_hand_and_against_torch():
    """Member 0: mu = (1, 2), log s^2 = (0, ln 4), y = 0: ((1 + 0) + (4 / 4 + ln 4)) / 2 = 1.693147;
    member 1: mu = 0: (0 + ln 4) / 2 = 0.693147. Twice torch's gaussian_nll_loss (full=False)."""
    mean = torch.tensor([[[1.0, 2.0]], [[0.0, 0.0]]])
    logvar = torch.tensor([[[0.0, math.log(4.0)]], [[0.0, math.log(4.0)]]])
    target = torch.zeros(1, 2)
    assert_close(gaussian_nll(mean, logvar, target), torch.tensor([1.693147, 0.693147]))
    for e in range(2):
        ref = torch.nn.functional.gaussian_nll_loss(mean[e], target, logvar[e].exp())
        assert_close(gaussian_nll(mean, logvar, target)[e], 2 * ref)
    assert_close(member_mse(mean, target), torch.tensor([2.5, 0.0]))
    assert_close(logvar_bound_penalty(torch.full((1, 3), -10.0), torch.full((1, 3), 0.5)), torch.tensor(0.315))


def test_elites_are_the_least_losses_best_first():
    assert elite_indices(torch.tensor([0.3, 0.1, 0.5, 0.2]), 2).tolist() == [1, 3]
    assert elite_indices(torch.tensor([0.3, 0.1, 0.5, 0.2]), 4).tolist() == [1, 3, 0, 2]
    with pytest.raises(ValueError, match="k=5"):
        elite_indices(torch.zeros(4), 5)


@pytest.mark.parametrize(("epoch", "k"), [(0, 1), (20, 1), (25, 1), (60, 8), (100, 15), (300, 15)])
def test_rollout_length_schedule(epoch, k):
    """[20, 100, 1, 15] (the authors' Hopper): 1 up to epoch 20, 1 + 14 (e - 20) / 80 rounded down, 15 after 100
    (epoch 25: 1.875 -> 1; 60: 8)."""
    assert rollout_length(epoch, 20, 100, 1, 15) == k


def test_cem_update_by_hand():
    """Candidates 0, 1, 2, 3 scored 0, 3, 1, 2: the top two are 1 and 3 (mean 2, variance 1); smoothing 0.5
    from mean 0, variance 4: mean 1, variance 2.5."""
    mean, var = cem_update(torch.tensor([[0.0], [1.0], [2.0], [3.0]]), torch.tensor([0.0, 3.0, 1.0, 2.0]), 2,
                           torch.zeros(1), torch.full((1,), 4.0), 0.5)
    assert_close(mean, torch.tensor([1.0]))
    assert_close(var, torch.tensor([2.5]))


def test_cem_plan_finds_the_maximum_of_a_toy_quadratic():
    """maximise -sum (a - target)^2 over a 3-step, 2-dimensional plan in [-1, 1]; the maximum (0.3, -0.6) per step
    is inside the bounds; CEM from the middle with 100 candidates and 10 elites finds it within 0.05."""
    from reinforge.classic.pets import PETSSettings, cem_plan

    cfg = PETSSettings(population=100, elites=10, iterations=15, smoothing=0.1, particles=5,
                       dynamics=DynamicsSettings(members=5, elites=5))
    target = torch.tensor([0.3, -0.6])
    score = lambda plans: -(plans - target).pow(2).sum((1, 2))  # noqa: E731
    low, high = -torch.ones(1, 2), torch.ones(1, 2)
    plan = cem_plan(score, torch.zeros(3, 2), low, high, cfg, torch.Generator().manual_seed(0))
    assert plan.shape == (3, 2)
    assert (plan - target).abs().max() < 0.05, plan


def _noiseless_ensemble(obs_dim: int, act_dim: int, reward: list[float], delta: float | list[float]
                        ) -> ProbabilisticEnsemble:
    """Member e predicts r = reward[e] and s' - s = delta (or delta[e]) in every dimension, with log-variance -30
    (sd 3e-7)."""
    cfg = DynamicsSettings(members=len(reward), elites=len(reward), hidden=[8])
    model = ProbabilisticEnsemble(obs_dim, act_dim, cfg)
    last = model.body[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        last.bias[:, 0, 0] = torch.tensor(reward)
        last.bias[:, 0, 1:1 + obs_dim] = torch.as_tensor(delta).reshape(-1, 1)
        last.bias[:, 0, 1 + obs_dim:] = -100.0
        model.min_logvar.fill_(-30.0)
    return model


def test_model_rollouts_branch_from_real_states_and_stop_rows_that_terminate():
    """Start states with s[0] = 0, 1, 2, 10, each step adds 1, a row ends when s'[0] >= 3, k = 3: rows run 3, 2, 1
    and 1 steps -> 7 transitions, 4 of them terminal; without termination 4 x 3 = 12, the last at s + 3."""
    from reinforge.classic.mbpo import _never, model_rollout

    model = _noiseless_ensemble(2, 1, [1.0, 1.0, 1.0], 1.0)
    start = torch.tensor([[0.0, 5.0], [1.0, 5.0], [2.0, 5.0], [10.0, 5.0]])
    policy = lambda obs: torch.zeros(len(obs), 1)  # noqa: E731
    gen = torch.Generator().manual_seed(0)
    out = model_rollout(model, policy, start, 3, lambda s: s[:, 0] >= 3, gen)
    assert out["obs"].shape == (7, 2) and out["actions"].shape == (7, 1) and out["rewards"].shape == (7,)
    assert out["terminated"].sum() == 4 and np.allclose(out["rewards"], 1.0, atol=1e-4)
    assert np.allclose(out["next_obs"] - out["obs"], 1.0, atol=1e-4)
    assert np.allclose(sorted(out["obs"][:, 0]), [0, 1, 1, 2, 2, 2, 10], atol=1e-4)
    out = model_rollout(model, policy, start, 3, _never, gen)
    assert out["obs"].shape == (12, 2) and out["terminated"].sum() == 0
    assert np.allclose(out["next_obs"][-4:], start.numpy() + [3.0, 3.0], atol=1e-4)


def test_termination_functions_are_the_authors_and_unknown_ids_are_errors():
    from reinforge.classic.mbpo import termination_fn

    fn = termination_fn("InvertedPendulum-v5", "auto")
    assert fn(torch.tensor([[0.0, 0.1, 0, 0], [0.0, 0.3, 0, 0], [0.0, float("nan"), 0, 0]])).tolist() == [
        False, True, True]
    assert not termination_fn("Pendulum-v1", "auto")(torch.ones(2, 3)).any()
    assert not termination_fn("CartPole-v1", "none")(torch.ones(2, 3)).any()
    with pytest.raises(ConfigError, match="classic.agent.termination: no termination function for 'Acrobot-v1'"):
        termination_fn("Acrobot-v1", "auto")


def test_replay_add_batch_wraps_around_the_ring():
    r = Replay(5, 1, 0, action_dim=1)
    for n, first in ((3, 0), (4, 3)):
        vals = np.arange(first, first + n, dtype=np.float32)
        r.add_batch(vals[:, None], vals[:, None], vals, vals[:, None], np.zeros(n), 0.9)
    assert r.size == 5 and r.pos == 2
    assert r.obs[:, 0].tolist() == [5, 6, 2, 3, 4] and np.allclose(r.discounts, 0.9)
    r.add_batch(np.arange(7, dtype=np.float32)[:, None], np.zeros((7, 1)), np.zeros(7), np.zeros((7, 1)),
                np.zeros(7), 0.9)
    assert sorted(r.obs[:, 0].tolist()) == [2, 3, 4, 5, 6]  # only the newest 5 of 7


def test_elites_are_the_members_of_least_held_out_mse_after_a_fit():
    """fit's split is the first draw of its generator: the same split by hand, each member's held-out MSE after
    the fit, and the model's elites are their argsort's first k."""
    rng = np.random.default_rng(0)
    obs, act = rng.normal(size=(300, 3)).astype(np.float32), rng.normal(size=(300, 1)).astype(np.float32)
    x, y = transition_arrays(obs, act, obs.sum(1), obs + 0.1 * act)
    cfg = DynamicsSettings(members=4, elites=2, hidden=[16], max_epochs=3)
    torch.manual_seed(0)
    model = ProbabilisticEnsemble(3, 1, cfg)
    fit(model, torch.optim.Adam(model.parameters(), lr=1e-3), x, y, cfg, np.random.default_rng(7))
    _, hold = _split(300, cfg, np.random.default_rng(7))
    losses = holdout_mse(model, x[hold], y[hold])
    assert model.elite_idx.tolist() == elite_indices(losses, 2).tolist()
    assert len(set(losses.tolist())) == 4  # members differ (independent init, own bootstrap)


def _pendulum_envs(seed: int = 0):
    from reinforge.classic.envs import EnvConfig, make_vec_env

    return make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, seed)


def test_mbpo_mixes_real_and_model_transitions_by_the_real_ratio():
    """real_ratio 0.25 of 8: int(2.0) = 2 real transitions (first), 6 from the model buffer (rewards 1000 there);
    all 8 real while the model buffer is empty."""
    from reinforge.classic.mbpo import MBPO, MBPOSettings

    envs = _pendulum_envs()
    cfg = MBPOSettings(batch_size=8, real_ratio=0.25, learning_starts=1000, hidden=[16],
                       dynamics=DynamicsSettings(members=2, elites=1, hidden=[8]))
    agent = MBPO(envs, 0, cfg, envs_cfg_stub())
    for _ in range(20):
        agent._env_step()
    assert (agent.mixed_batch()["rewards"] < 100).all()
    agent._resize_model_replay(50)
    agent.model_replay.add_batch(np.zeros((10, 3)), np.zeros((10, 1)), np.full(10, 1000.0), np.zeros((10, 3)),
                                 np.zeros(10), 0.99)
    rewards = agent.mixed_batch()["rewards"]
    assert rewards.shape == (8,) and (rewards[:2] < 100).all() and (rewards[2:] == 1000).all()
    envs.close()


def envs_cfg_stub():
    from reinforge.classic.envs import EnvConfig

    return EnvConfig(id="Pendulum-v1")


def test_settings_are_checked_and_name_the_field():
    from reinforge.classic.config import classic_config_from_dict

    for agent, match in (({"name": "mbpo", "dynamics": {"members": 3, "elites": 4}}, "elites \\(4\\) must be at most"),
                         ({"name": "mbpo", "n_step": 3}, "n_step must be 1"),
                         ({"name": "pets", "particles": 7}, "particles \\(7\\) must be a multiple"),
                         ({"name": "pets", "elites": 600}, "elites \\(600\\) must be at most population")):
        with pytest.raises(ConfigError, match=f"classic.agent: .*{match}"):
            classic_config_from_dict({"classic": {"agent": agent}})


def test_the_agents_share_sacs_core():
    """RLPD and MBPO act, step the environment and tune alpha with SAC's code (classic/sac.py's SoftActorCore)."""
    from reinforge.classic.mbpo import MBPO
    from reinforge.classic.rlpd import RLPD
    from reinforge.classic.sac import SAC, SoftActorCore

    for cls in (SAC, RLPD, MBPO):
        assert issubclass(cls, SoftActorCore)
        assert all(name not in vars(cls) for name in ("act", "_env_step", "_alpha_step", "alpha"))


@pytest.mark.parametrize("propagation", ["ts_inf", "ts1"])
def test_particle_returns_average_the_members_sums(propagation):
    """Members predict rewards 1, 2, 3, 4 (noiseless); 8 particles over 4 members, horizon 5: each particle's sum
    is 5 r_e, the mean over particles 5 x 2.5 = 12.5 for every plan, whatever the assignment."""
    from reinforge.classic.pets import particle_returns

    model = _noiseless_ensemble(3, 1, [1.0, 2.0, 3.0, 4.0], 0.0)
    plans = torch.rand(6, 5, 1)
    out = particle_returns(model, torch.zeros(3), plans, 8, propagation == "ts1", torch.Generator().manual_seed(0))
    assert_close(out, torch.full((6,), 12.5), atol=1e-3, rtol=0)


def test_ts_inf_keeps_each_particles_member_and_ts1_mixes_them():
    """Two members moving the state by 0 and 1 per step (noiseless), 2 particles per plan, horizon 3: under
    TS-inf particle r stays with member r mod 2, so the last states are 0 and 3 for every plan; TS-1 reassigns
    the members every step, so some particles end in between (1 or 2)."""
    from reinforge.classic.pets import propagate

    model = _noiseless_ensemble(1, 1, [0.0, 0.0], [0.0, 1.0])
    plans = torch.zeros(6, 3, 1)
    _, last = propagate(model, torch.zeros(1), plans, 2, False, torch.Generator().manual_seed(0))
    assert_close(last.reshape(6, 2), torch.tensor([[0.0, 3.0]] * 6), atol=1e-3, rtol=0)
    _, last = propagate(model, torch.zeros(1), plans, 2, True, torch.Generator().manual_seed(0))
    assert ((last > 0.5) & (last < 2.5)).any() and torch.allclose(last.sum(), torch.tensor(18.0), atol=1e-2)


@pytest.mark.slow  # about 10 s on one loaded core: 2,000 random Pendulum transitions, a 2 x 64 ensemble
def test_the_dynamics_models_held_out_error_falls():
    """Fit on 2,000 transitions of uniform random actions: the elites' held-out MSE of (r, s' - s) falls at least
    tenfold from the untrained ensemble's, and on 200 transitions it never saw it is below a fifth of the targets'
    variance."""
    envs = _pendulum_envs()
    replay = Replay(3000, 3, 0, action_dim=1)
    from reinforge.classic.envs import next_observations
    from reinforge.classic.replay import NStep, store_vector_step

    acc = [NStep(1, 0.99, replay)]
    obs, _ = envs.reset(seed=0)
    for _ in range(2000):
        a = np.asarray(envs.action_space.sample(), dtype=np.float32)
        nxt, r, term, trunc, info = envs.step(a)
        store_vector_step(acc, obs, a, r, next_observations(nxt, info), term, trunc)
        obs = nxt
    n = replay.size
    x, y = transition_arrays(replay.obs[:n], replay.actions[:n], replay.rewards[:n], replay.next_obs[:n])
    cfg = DynamicsSettings(members=3, elites=2, hidden=[64, 64], max_epochs=40)
    torch.manual_seed(0)
    torch.set_flush_denormal(True)  # as the agents do
    model = ProbabilisticEnsemble(3, 1, cfg)
    metrics = fit(model, torch.optim.Adam(model.parameters(), lr=1e-3), x[:1800], y[:1800], cfg,
                  np.random.default_rng(0))
    assert metrics["model/holdout_mse"] < 0.1 * metrics["model/holdout_mse_before"], metrics
    fresh = holdout_mse(model, x[1800:], y[1800:])[model.elite_idx].mean()
    assert fresh < 0.2 * y[1800:].var(0).mean(), (fresh, y[1800:].var(0))
    envs.close()


@pytest.mark.slow  # about 50 s on one loaded core (15 s idle): 1,000 random steps, a fit, one planned episode
def test_pets_on_pendulum_beats_random_actions(tmp_path):
    """The pendulum_pets recipe made smaller (2 x 64 ensemble, 5 particles): after 1,000 random steps and one fit
    (40 epochs), its greedy evaluation episode beats uniform random actions (about -1200 on Pendulum-v1; the
    same evaluation seed's random episodes are the baseline) by at least 300 (a hand run of the same planner
    on its own 1,000 random steps: -118)."""
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("pendulum_pets", [
        f"output_dir={tmp_path}", "name=p", "classic.agent.dynamics.hidden=[64,64]", "classic.agent.dynamics.max_epochs=40",
        "classic.agent.particles=5", "classic.agent.learning_starts=1000", "classic.agent.train_every=1000",
        "classic.train.total_env_steps=1000", "classic.eval.episodes=1"])
    result = train_classic(cfg)
    envs = _pendulum_envs(10_000)
    envs.reset(seed=10_000)
    random_returns: list[float] = []
    from reinforge.classic.envs import finished_episodes

    while len(random_returns) < 4:
        *_, info = envs.step(np.asarray(envs.action_space.sample(), dtype=np.float32))
        random_returns += [r for r, _ in finished_episodes(info)]
    evaluation = json.loads((result.run_dir / "eval.json").read_text())
    assert evaluation["eval/return_mean"] > np.mean(random_returns) + 300, (evaluation["returns"], random_returns)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("model/holdout_mse" in r for r in records)
    envs.close()


def test_the_mbpo_recipe_runs_end_to_end(tmp_path):
    """A tiny MBPO run: a model fit and a round of rollouts at step 20, SAC updates on mixed batches after; the
    run directory has the model metrics and eval.json."""
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("pendulum_mbpo", [
        f"output_dir={tmp_path}", "name=m", "classic.agent.learning_starts=20", "classic.agent.hidden=[16]",
        "classic.agent.dynamics.hidden=[16]", "classic.agent.dynamics.max_epochs=2", "classic.agent.batch_size=16",
        "classic.agent.rollout_batch_size=32", "classic.agent.model_train_freq=10", "classic.agent.gradient_steps=2",
        "classic.train.total_env_steps=40", "classic.eval.episodes=1"])
    assert cfg.classic.agent == "mbpo"
    result = train_classic(cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    fits = [r for r in records if "model/holdout_mse" in r]
    assert [r["env_steps"] for r in fits] == [20, 30, 40]
    assert fits[-1]["model/buffer_size"] > 0 and "train/q_loss" in records[-1]
    assert (result.run_dir / "eval.json").is_file()


def _needs_mujoco() -> None:
    import importlib.util

    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("MuJoCo tasks need the mujoco package: pip install 'reinforge[classic]'")


def test_inverted_pendulum_termination_matches_the_environments_own():
    """On 400 real InvertedPendulum-v5 transitions under uniform random actions (the pole falls within tens of
    steps: many episodes), the termination function of next_obs equals the environment's ``terminated`` at every
    step; the non-terminal |theta| reach past 0.15 and the terminal ones just over 0.2, so the boundary is hit."""
    _needs_mujoco()
    import gymnasium as gym

    from reinforge.classic.mbpo import termination_fn

    fn = termination_fn("InvertedPendulum-v5", "auto")
    env = gym.make("InvertedPendulum-v5")
    env.action_space.seed(0)
    obs, _ = env.reset(seed=0)
    mine, theirs, thetas = [], [], []
    for _ in range(400):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        mine.append(bool(fn(torch.as_tensor(obs, dtype=torch.float32).reshape(1, -1))[0]))
        theirs.append(bool(terminated))
        thetas.append(abs(float(obs[1])))
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    assert mine == theirs
    assert sum(theirs) >= 10
    thetas_np, ended = np.array(thetas), np.array(theirs)
    assert thetas_np[~ended].max() > 0.15 and 0.2 < thetas_np[ended].min() < 0.3


def test_the_inverted_pendulum_mbpo_recipe_iterates_past_its_first_model_fit():
    """The shipped recipe on InvertedPendulum-v5 (its learning start moved to 30 and its networks, model and
    rollouts made tiny): the agent ends model rollouts by |theta| > 0.2, fits at step 30, rolls out k = 1 and
    takes its G = 10 SAC updates on mixed batches."""
    _needs_mujoco()
    from reinforge.classic.agents import build_agent
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.envs import make_vec_env
    from reinforge.classic.mbpo import _inverted_pendulum

    c = load_classic_config("inverted_pendulum_mbpo", [
        "classic.agent.learning_starts=30", "classic.agent.hidden=[16]", "classic.agent.batch_size=16",
        "classic.agent.dynamics.hidden=[16]", "classic.agent.dynamics.max_epochs=2",
        "classic.agent.rollout_batch_size=32"]).classic
    assert (c.agent.settings.gradient_steps, c.agent.settings.rollout_schedule) == (10, [1, 15, 1, 1])
    envs = make_vec_env(c.env, c.agent.settings.gamma, 0)
    agent = build_agent(c.agent.name, envs, 0, c.agent.settings, c.env)
    assert agent.done_fn is _inverted_pendulum
    records = [agent.iterate(i / 40).metrics for i in range(40)]
    envs.close()
    fits = [i + 1 for i, m in enumerate(records) if "model/holdout_mse" in m]
    assert fits == [30] and records[29]["model/rollout_length"] == 1.0 and agent.model_replay.size > 0
    assert np.isfinite(records[-1]["train/q_loss"]) and np.isfinite(records[-1]["train/actor_loss"])
