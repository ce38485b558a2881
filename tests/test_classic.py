"""reinforge.classic: config errors, Gymnasium environments and wrappers, the actor-critic's distributions,
GAE with episode ends and truncation, the PPO update, `reinforge train cartpole_ppo` and `reinforge compare`
on classic runs. The learning curve is tests/test_classic_learning.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("gymnasium")

from reinforge.classic.config import (  # noqa: E402
    EnvConfig,
    classic_config_from_dict,
    classic_recipe_names,
    classic_recipe_path,
    load_classic_config,
)
from reinforge.classic.envs import finished_episodes, make_vec_env, obs_normalizers  # noqa: E402
from reinforge.classic.networks import ActionSpec, ActorCritic  # noqa: E402
from reinforge.classic.ppo import PPO, PPOSettings, gae_with_ends  # noqa: E402
from reinforge.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- config


def test_shipped_classic_recipes_load():
    assert {"cartpole_ppo", "acrobot_ppo", "pendulum_ppo", "cartpole_dqn", "pendulum_sac", "cartpole_impala",
            "inverted_pendulum_sac", "bit_flipping_dqn_her", "point_reach_sac_her",
            "goal_reacher_sac_her"} <= set(classic_recipe_names())
    for name in classic_recipe_names():
        path = classic_recipe_path(name)
        assert path is not None and path.read_text().startswith("# ")
        load_classic_config(name)
    cartpole = load_classic_config("cartpole_ppo").classic.agent
    assert cartpole == "ppo" and cartpole.settings == PPOSettings()  # the recipe spells out the defaults
    assert classic_recipe_path("default") is None  # the LLM recipes are not classic


@pytest.mark.parametrize(("override", "field"), [
    ("classic.agent.lr=-1", "classic.agent.lr"),
    ("classic.env.num_envs=0", "classic.env.num_envs"),
    ("classic.agent.gamma=1.5", "classic.agent.gamma"),
    ("classic.agent.clip_cof=0.1", "classic.agent.clip_cof"),
    ("classic.agent=sarsa", "classic.agent"),
    ("classic.env.vectorization=threads", "classic.env.vectorization"),
])
def test_config_errors_name_the_field(override, field):
    with pytest.raises(ConfigError, match=f"  {field}: "):
        load_classic_config("cartpole_ppo", [override])


def test_minibatches_must_fit_in_the_rollout():
    cfg = classic_config_from_dict({"classic": {"env": {"num_envs": 1},
                                                "agent": {"name": "ppo", "num_steps": 2, "num_minibatches": 4}}})
    envs = make_vec_env(cfg.classic.env, 0.99, 0)
    with pytest.raises(ConfigError, match="classic.agent.num_minibatches"):
        PPO(envs, 0, cfg.classic.agent.settings)


def test_an_unknown_environment_is_a_config_error():
    with pytest.raises(ConfigError, match="classic.env.id"):
        make_vec_env(EnvConfig(id="NoSuchEnv-v0"), 0.99, 0)


def test_import_reinforge_does_not_import_gymnasium():
    code = "import sys, reinforge, reinforge.classic, reinforge.classic.config; print('gymnasium' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_missing_gymnasium_names_the_extra(monkeypatch):
    from reinforge.classic import envs
    from reinforge.errors import ReinforgeError

    monkeypatch.setitem(sys.modules, "gymnasium", None)  # import gymnasium -> ImportError
    with pytest.raises(ReinforgeError, match=r"pip install 'reinforge\[classic\]'"):
        envs.require_gymnasium()


# ----------------------------------------------------------------------------- environments


def _rollout_obs(envs, steps=30):
    obs, _ = envs.reset(seed=3)
    out = [obs]
    for _ in range(steps):
        obs, *_ = envs.step(envs.action_space.sample())
        out.append(obs)
    return np.stack(out)


def test_vector_env_is_seeded_reproducibly():
    a = _rollout_obs(make_vec_env(EnvConfig(num_envs=3), 0.99, seed=3))
    b = _rollout_obs(make_vec_env(EnvConfig(num_envs=3), 0.99, seed=3))
    c = _rollout_obs(make_vec_env(EnvConfig(num_envs=3), 0.99, seed=4))
    assert a.shape == (31, 3, 4) and np.array_equal(a, b) and not np.array_equal(a, c)
    assert not np.array_equal(a[:, 0], a[:, 1])  # environment i is seeded seed + i


def test_episode_statistics_and_same_step_reset():
    envs = make_vec_env(EnvConfig(num_envs=2), 0.99, seed=0)
    envs.reset(seed=0)
    lengths = np.zeros(2, dtype=int)
    returns_seen: list[tuple[float, int]] = []
    while not returns_seen:
        obs, reward, term, trunc, info = envs.step(np.zeros(2, dtype=np.int64))  # always push left: falls fast
        lengths += 1
        returns_seen = finished_episodes(info)
        done = term | trunc
    # CartPole's reward is 1 per step: the return equals the length, the episode's own step count
    assert all(r == n for r, n in returns_seen)
    assert sorted(n for _, n in returns_seen) == sorted(lengths[done].tolist())
    assert info["_final_obs"].tolist() == done.tolist()  # the last observation is kept; obs is the new episode's
    assert not np.array_equal(info["final_obs"][int(np.flatnonzero(done)[0])], obs[int(np.flatnonzero(done)[0])])


def test_normalisation_wrappers_are_gymnasiums_and_clip():
    from gymnasium.wrappers import ClipAction, NormalizeObservation, NormalizeReward, RecordEpisodeStatistics

    envs = make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=2, normalize_obs=True, normalize_reward=True,
                                  clip_obs=0.5, clip_reward=0.1), 0.99, seed=0)
    chain, env = [], envs.envs[0]
    while env is not None:
        chain.append(type(env))
        env = getattr(env, "env", None)
    for wrapper in (RecordEpisodeStatistics, ClipAction, NormalizeObservation, NormalizeReward):
        assert wrapper in chain
    assert len(obs_normalizers(envs)) == 2
    envs.reset(seed=0)
    for _ in range(20):
        obs, reward, *_ = envs.step(np.full((2, 1), 5.0, dtype=np.float32))  # beyond the bound 2: clipped
        assert np.abs(obs).max() <= 0.5 + 1e-6 and np.abs(reward).max() <= 0.1 + 1e-6
    assert make_vec_env(EnvConfig(id="Pendulum-v1"), 0.99, 0).envs[0].env.__class__ is not NormalizeObservation


# ----------------------------------------------------------------------------- networks


def test_categorical_policy_log_probs_and_entropy():
    torch.manual_seed(0)
    net = ActorCritic(4, ActionSpec(n=3), [8])
    obs, action = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    logp, entropy, value = net.evaluate(obs, action)
    dist = torch.distributions.Categorical(logits=net.actor(obs))
    assert_close(logp, dist.log_prob(action))
    assert_close(entropy, dist.entropy())
    assert value.shape == (5,)
    a, lp, _ = net.act(obs, torch.Generator().manual_seed(1))
    assert_close(lp, dist.log_prob(a))
    assert net.act(obs, deterministic=True)[0].tolist() == dist.probs.argmax(-1).tolist()


def test_gaussian_policy_log_probs_entropy_and_state_independent_std():
    torch.manual_seed(0)
    net = ActorCritic(3, ActionSpec(dim=2), [8])
    with torch.no_grad():
        net.log_std.copy_(torch.tensor([[-0.5, 0.3]]))
    obs, action = torch.randn(6, 3), torch.randn(6, 2)
    logp, entropy, _ = net.evaluate(obs, action)
    dist = torch.distributions.Normal(net.actor(obs), torch.tensor([[-0.5, 0.3]]).exp())
    assert_close(logp, dist.log_prob(action).sum(-1))
    assert_close(entropy, dist.entropy().sum(-1))
    assert torch.allclose(entropy, entropy[0].expand(6))  # the std does not depend on the state
    # entropy of N(mu, sigma^2) per dimension: 0.5 + 0.5 log(2 pi) + log sigma
    assert entropy[0].item() == pytest.approx(2 * (0.5 + 0.5 * math.log(2 * math.pi)) - 0.5 + 0.3, abs=1e-6)
    assert_close(net.act(obs, deterministic=True)[0], net.actor(obs).detach())


def test_orthogonal_init_like_cleanrl():
    net = ActorCritic(4, ActionSpec(n=2), [64, 64])
    w = net.actor[0].weight  # [64, 4]: orthogonal columns of norm sqrt(2)
    assert_close(w.T @ w, 2.0 * torch.eye(4), atol=1e-5, rtol=0)
    head = net.actor[-1].weight  # [2, 64]: orthogonal rows of norm 0.01
    assert_close(head @ head.T, 1e-4 * torch.eye(2), atol=1e-9, rtol=0)
    assert all(float(m.bias.detach().abs().max()) == 0.0 for m in net.modules() if isinstance(m, torch.nn.Linear))


# ----------------------------------------------------------------------------- GAE with episode ends


def _cleanrl_gae(rewards, values, dones_after, next_value, gamma, lam):
    """CleanRL ppo.py's loop, with dones_after[t] = the episode ended at step t (its next_done)."""
    t_steps = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = 0.0
    for t in reversed(range(t_steps)):
        nv = next_value if t == t_steps - 1 else values[t + 1]
        nonterminal = 1.0 - dones_after[t].double()
        delta = rewards[t] + gamma * nv * nonterminal - values[t]
        adv[t] = last = delta + gamma * lam * nonterminal * last
    return adv, adv + values


def test_gae_with_ends_equals_cleanrls_loop_on_terminations():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(9, 3, generator=g, dtype=torch.float64), torch.randn(9, 3, generator=g, dtype=torch.float64)
    terminated = torch.rand(9, 3, generator=g) < 0.25
    next_value = torch.randn(3, generator=g, dtype=torch.float64)
    ref_adv, ref_ret = _cleanrl_gae(rewards, values, terminated, next_value, 0.99, 0.95)
    folded = rewards.clone()
    folded[-1] += 0.99 * next_value * (~terminated[-1])  # our collector's bootstrap of the rollout's end
    ends = terminated.clone()
    ends[-1] = True
    adv, ret = gae_with_ends(folded, values, ends, 0.99, 0.95)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


def test_truncation_is_bootstrapped_from_the_final_observation():
    # one environment, 3 steps, gamma 0.5, lam 1: the episode is truncated after step 1 with V(s_final) = 4,
    # the next one runs on to the rollout's end, V(s_3) = 2. Values all 1, rewards all 1.
    # episode 1: r_1' = 1 + 0.5 * 4 = 3 -> A_1 = 3 - 1 = 2, A_0 = (1 + 0.5 * 1 - 1) + 0.5 * 2 = 1.5
    # episode 2: r_2' = 1 + 0.5 * 2 = 2 -> A_2 = 1
    rewards = torch.tensor([[1.0], [1.0 + 0.5 * 4.0], [1.0 + 0.5 * 2.0]], dtype=torch.float64)
    ends = torch.tensor([[False], [True], [True]])
    adv, ret = gae_with_ends(rewards, torch.ones(3, 1, dtype=torch.float64), ends, 0.5, 1.0)
    assert_close(adv[:, 0], torch.tensor([1.5, 2.0, 1.0], dtype=torch.float64))
    assert_close(ret[:, 0], torch.tensor([2.5, 3.0, 2.0], dtype=torch.float64))


class _FixedEnvs:
    """A stand-in vector env: 1 environment, observation [t], truncated after every 2nd step, final obs [9]."""

    num_envs = 1

    def __init__(self):
        import gymnasium as gym

        self.single_action_space = gym.spaces.Discrete(2)
        self.single_observation_space = gym.spaces.Box(-10, 10, (1,))
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        return np.zeros((1, 1), np.float32), {}

    def step(self, action):
        self.t += 1
        trunc = np.array([self.t % 2 == 0])
        info = {"final_obs": np.array([np.array([9.0], np.float32)], dtype=object), "_final_obs": trunc} if trunc[0] else {}
        return np.full((1, 1), self.t, np.float32), np.ones(1), np.array([False]), trunc, info


def test_collect_folds_the_truncation_and_rollout_end_bootstraps():
    agent = PPO(_FixedEnvs(), 0, PPOSettings(num_steps=3, num_minibatches=1, gamma=0.5))
    ro = agent.collect()
    with torch.no_grad():
        v_final, v_next = agent.net.value(torch.tensor([[9.0], [3.0]]))
    expected = torch.tensor([1.0, 1.0 + 0.5 * v_final, 1.0 + 0.5 * v_next])
    assert_close(ro.rewards[:, 0], expected)
    assert ro.ends[:, 0].tolist() == [False, True, True]
    assert ro.obs[:, 0, 0].tolist() == [0.0, 1.0, 2.0]


# ----------------------------------------------------------------------------- the PPO update


def test_first_minibatch_step_hand_values_and_direction():
    """On-policy first step: ratio 1, so clip_frac 0, approx_kl 0, the surrogate -mean(A_norm) = 0 and the
    value loss 0.5 mean((V - R)^2); the step raises pi(a) where the advantage is positive."""
    torch.manual_seed(0)
    agent = PPO(_FixedEnvs(), 0, PPOSettings(num_steps=4, num_minibatches=1, ent_coef=0.0, lr=1e-2))
    obs = torch.zeros(4, 1)
    actions = torch.tensor([0, 1, 0, 1])
    with torch.no_grad():
        logp, _, values = agent.net.evaluate(obs, actions)
    returns = values + torch.tensor([1.0, -1.0, 2.0, 0.0])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    m = agent.minibatch_step({"obs": obs, "actions": actions, "logp": logp, "values": values, "adv": adv,
                              "returns": returns})
    assert m["train/clip_frac"] == 0.0 and m["train/approx_kl"] == pytest.approx(0.0, abs=1e-12)
    assert m["train/policy_loss"] == pytest.approx(0.0, abs=1e-6)
    assert m["train/value_loss"] == pytest.approx(0.5 * (1 + 1 + 4 + 0) / 4)
    with torch.no_grad():
        p0 = torch.softmax(agent.net.actor(obs[:1]), -1)[0, 0].item()
    assert p0 > math.exp(logp[0].item())  # action 0 had A > 0 in the same state: its probability rose


def test_update_runs_epochs_and_reports_metrics():
    envs = make_vec_env(EnvConfig(num_envs=2), 0.99, seed=0)
    agent = PPO(envs, 0, PPOSettings(num_steps=16, num_minibatches=2, update_epochs=3))
    before = [p.detach().clone() for p in agent.net.parameters()]
    metrics = agent.update(agent.collect())
    for key in ("train/policy_loss", "train/value_loss", "train/entropy", "train/approx_kl", "train/clip_frac",
                "train/explained_variance", "train/grad_norm"):
        assert math.isfinite(metrics[key]), key
    assert metrics["train/entropy"] == pytest.approx(math.log(2), abs=0.01)  # near-uniform at init
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.net.parameters(), strict=True))


# ----------------------------------------------------------------------------- CLI, run directory, compare


def _train(tmp_path, name, seed, steps=1024):
    from typer.testing import CliRunner

    from reinforge.cli import app

    args = ["train", "cartpole_ppo", f"seed={seed}", f"name={name}", f"output_dir={tmp_path}",
            f"classic.train.total_env_steps={steps}", "classic.train.log_every=1", "classic.eval.episodes=2",
            "classic.checkpoint.every=1", "classic.checkpoint.keep=1"]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    return tmp_path / name, result.output


def test_train_cartpole_ppo_writes_a_run_directory(tmp_path):
    run, output = _train(tmp_path, "a", 0)
    assert "update     2/2" in output and "run directory" in output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and [r["env_steps"] for r in records] == [512, 1024]
    for key in ("episode/return_mean", "episode/length_mean", "train/policy_loss", "train/value_loss",
                "time/elapsed_s", "perf/env_steps_per_s"):
        assert key in records[0], key
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_2"]  # keep=1; written to a hidden directory and renamed (learn/checkpoint.py)
    from reinforge.learn.checkpoint import verify_checkpoint

    assert verify_checkpoint(run / "checkpoints" / "step_2") is None
    assert (run / "checkpoints" / "step_2" / "model.safetensors").is_file()
    ev = json.loads((run / "eval.json").read_text())
    assert ev["eval/episodes"] == 2 and len(ev["returns"]) == 2
    config = load_classic_config(run / "config.yaml")
    assert config.seed == 0 and config.classic.train.total_env_steps == 1024


def test_same_seed_same_run(tmp_path):
    a, _ = _train(tmp_path, "a", 5)
    b, _ = _train(tmp_path, "b", 5)

    def losses(run):
        return [(r["train/policy_loss"], r.get("episode/return_mean")) for r in
                map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]

    assert losses(a) == losses(b)


def test_compare_aggregates_classic_runs(tmp_path):
    from reinforge.eval.compare import run_compare

    for seed in (0, 1):
        _train(tmp_path / "ppo", f"s{seed}", seed)
    _train(tmp_path / "other", "s0", 2)
    text = run_compare([str(tmp_path / "ppo"), str(tmp_path / "other")], "episode/return_mean",
                       "classic.env.id", 1, None, False, 5, 0.05, n_boot=200)
    assert "| CartPole-v1 | 3 |" in text and "IQM" in text  # grouped by a config key of the classic runs
    text = run_compare([str(tmp_path / "ppo"), str(tmp_path / "other")], "episode/return_mean",
                       None, 1, None, False, 5, 0.05, n_boot=200)
    assert "| ppo/CartPole-v1 | 3 |" in text  # by default: agent/environment
    text = run_compare([f"ppo={tmp_path / 'ppo' / 's0'},{tmp_path / 'ppo' / 's1'}", f"other={tmp_path / 'other'}"],
                       "episode/return_mean", None, 1, None, False, 5, 0.05, n_boot=200)
    assert "| ppo | 2 |" in text and "| other | 1 |" in text and "| ppo | other |" in text  # P(ppo > other)


def test_target_kl_stops_the_epochs_early():
    envs = make_vec_env(EnvConfig(num_envs=2), 0.99, seed=0)
    agent = PPO(envs, 0, PPOSettings(num_steps=16, num_minibatches=2, update_epochs=10, lr=0.05, target_kl=1e-9))
    calls = []
    step = agent.minibatch_step
    agent.minibatch_step = lambda mb: calls.append(1) or step(mb)
    agent.update(agent.collect())
    assert len(calls) == 2  # the first epoch's two mini-batches move the policy past the tiny target: stop


def test_async_vectorisation_and_its_limit():
    envs = make_vec_env(EnvConfig(num_envs=2, vectorization="async"), 0.99, seed=0)
    try:
        obs, _ = envs.reset(seed=0)
        obs, reward, *_ = envs.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 4) and reward.tolist() == [1.0, 1.0]
    finally:
        envs.close()
    with pytest.raises(ConfigError, match="classic.env: .*normalize_obs needs vectorization: sync"):
        classic_config_from_dict({"classic": {"env": {"vectorization": "async", "normalize_obs": True}}})


@pytest.mark.parametrize(("recipe", "overrides"), [
    ("cartpole_ppo", []),
    ("cartpole_dqn", ["classic.agent.learning_starts=100", "classic.agent.train_frequency=50",
                      "classic.agent.gradient_steps=2", "classic.train.total_env_steps=400"]),
    ("pendulum_sac", ["classic.agent.learning_starts=100", "classic.agent.batch_size=32",
                      "classic.train.total_env_steps=300"]),
    ("cartpole_impala", ["classic.agent.actors=0", "classic.train.total_env_steps=1024"]),
])
def test_every_logged_classic_metric_is_documented(tmp_path, recipe, overrides):
    from test_docs_metrics import _undocumented

    from reinforge.classic.run import train_classic

    if recipe == "cartpole_ppo":
        run, _ = _train(tmp_path, "m", 0)
    else:
        cfg = load_classic_config(recipe, [f"output_dir={tmp_path}", "name=m", "classic.eval.episodes=1",
                                           "classic.train.log_every=100000", *overrides])
        run = train_classic(cfg).run_dir
    keys = {k for line in (run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert len(keys) > 10 and _undocumented(keys) == set(), _undocumented(keys)


def test_time_limit_stops_the_run(tmp_path):
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("cartpole_ppo", [f"output_dir={tmp_path}", "name=t", "classic.train.time_limit_s=1e-6",
                                               "classic.eval.episodes=0"])
    result = train_classic(cfg)
    assert (result.stopped, result.updates, result.eval_return) == ("time", 1, None)
    assert not (result.run_dir / "eval.json").exists() and (result.run_dir / "checkpoints" / "step_1").is_dir()
