"""Multi-agent classic RL (classic/marl_envs.py, marl_nets.py, mappo.py, vdn.py): the PettingZoo vector
environment, the agent-id one-hot and the critics' inputs, VDN's joint value and target, per-agent GAE
of IPPO/MAPPO's rollout, configuration errors, and tiny learning runs on MPE2 simple_spread."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.qlearning import vdn_q_total, vdn_targets
from reinforge.classic.marl_nets import actor_inputs, agent_one_hot, critic_inputs

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

FAKE = "reinforge_test_fake_marl"


class _FakeParallel:
    """Two agents, Discrete(2) actions, observation widths 1 and 2; agent i's reward is (i + 1) * its action;
    every episode is truncated after 3 steps; the state is [t, 10]."""

    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        from gymnasium.spaces import Box, Discrete

        self._obs = {"a": Box(-1, 1, (1,)), "b": Box(-1, 1, (2,))}
        self._act = Discrete(2)
        self.state_space = Box(-100, 100, (2,))
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str):
        return self._obs[agent]

    def action_space(self, agent: str):
        return self._act

    def _observe(self) -> dict[str, np.ndarray]:
        return {"a": np.array([self.t], np.float32), "b": np.array([self.t, -self.t], np.float32)}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float((i + 1) * actions[a]) for i, a in enumerate(self.possible_agents)}
        done = self.t >= 3
        obs = self._observe()
        trunc = {a: done for a in self.agents}
        term = {a: False for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, term, trunc, {}

    def state(self) -> np.ndarray:
        return np.array([self.t, 10.0], np.float32)

    def close(self) -> None:
        pass


@pytest.fixture
def fake_module(monkeypatch):
    module = types.ModuleType(FAKE)
    module.parallel_env = lambda **kw: _FakeParallel()
    monkeypatch.setitem(sys.modules, FAKE, module)
    return FAKE


def _env_cfg(env_id: str, num_envs: int = 1, **extra):
    from reinforge.classic.envs import EnvConfig

    return EnvConfig(id=env_id, num_envs=num_envs, **{"backend": "pettingzoo", **extra})


# ----------------------------------------------------------------------------- inputs (pure math)


def test_agent_one_hot_and_the_critics_inputs_by_hand():
    assert agent_one_hot(2, 3).tolist() == [[[1, 0, 0], [0, 1, 0], [0, 0, 1]]] * 2
    obs = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # one environment, agents 0 and 1
    state = torch.tensor([[5.0, 6.0, 7.0]])
    assert actor_inputs(obs).tolist() == [[[1, 2, 1, 0], [3, 4, 0, 1]]]
    assert critic_inputs(obs, state).tolist() == [[[5, 6, 7, 1, 0], [5, 6, 7, 0, 1]]]  # MAPPO: [s, onehot(i)]
    assert critic_inputs(obs, None).tolist() == actor_inputs(obs).tolist()  # IPPO: the agent's own input


def test_vdn_joint_value_and_target_by_hand():
    q = torch.tensor([[[1.0, 2.0], [3.0, 0.0]]])  # one sample, two agents, two actions
    assert_close(vdn_q_total(q, torch.tensor([[1, 0]])), torch.tensor([2.0 + 3.0]))
    next_target = torch.tensor([[[1.0, 4.0], [2.0, 0.5]], [[9.0, 9.0], [9.0, 9.0]]])
    rewards, discounts, terminated = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0])
    # sum_i max_a Q'_i = 4 + 2 = 6 -> y0 = 1 + 0.5 * 6 = 4; sample 1 terminated: y1 = 2
    assert_close(vdn_targets(rewards, discounts, terminated, next_target), torch.tensor([4.0, 2.0]))
    online = torch.tensor([[[5.0, 0.0], [0.0, 5.0]], [[0.0, 0.0], [0.0, 0.0]]])  # picks a*_0 = 0, a*_1 = 1
    assert_close(vdn_targets(rewards, discounts, terminated, next_target, online), torch.tensor([1 + 0.5 * 1.5, 2.0]))


# ----------------------------------------------------------------------------- the vector environment


def test_the_vector_environment_pads_sums_and_autoresets(fake_module):
    from reinforge.classic.envs import finished_episodes, make_vec_env

    envs = make_vec_env(_env_cfg(fake_module, num_envs=2), 0.99, seed=0)
    obs, info = envs.reset(seed=0)
    assert obs.shape == (2, 2, 2) and info["state"].tolist() == [[0, 10], [0, 10]]
    for t in (1, 2):
        obs, reward, terminated, truncated, info = envs.step(np.array([[1, 1], [0, 1]]))
        assert obs[0].tolist() == [[t, 0], [t, -t]]  # agent a's one-wide observation zero-padded
        assert reward.tolist() == [[1, 2], [0, 2]] and not truncated.any() and "final_info" not in info
    obs, reward, terminated, truncated, info = envs.step(np.array([[1, 1], [0, 1]]))
    assert truncated.tolist() == [True, True] and terminated.tolist() == [False, False]
    assert obs[0].tolist() == [[0, 0], [0, 0]]  # the next episode's first observation (same-step reset)
    assert info["final_obs"][0].tolist() == [[3, 0], [3, -3]] and info["final_state"][0].tolist() == [3, 10]
    # the episode return is the mean over agents of their returns: env 0 (3 + 6) / 2, env 1 (0 + 6) / 2
    assert finished_episodes(info) == [(4.5, 3), (3.0, 3)]
    assert info["final_info"]["episode"]["agent_r"].tolist() == [[3, 6], [0, 6]]


def test_aec_environments_go_through_aec_to_parallel():
    from reinforge.classic.envs import make_vec_env

    kwargs = {"N": 3, "max_cycles": 5, "continuous_actions": False}
    envs = make_vec_env(_env_cfg("mpe2.simple_spread_v3", kwargs=kwargs, backend="pettingzoo_aec"), 0.99, 0)
    obs, info = envs.reset(seed=0)
    assert obs.shape == (1, 3, 18) and info["state"].shape == (1, 54) and envs.n_actions == 5
    for _ in range(5):
        obs, reward, terminated, truncated, info = envs.step(np.zeros((1, 3), dtype=np.int64))
    assert truncated.tolist() == [True] and len(info["final_info"]["episode"]["r"]) == 1


# ----------------------------------------------------------------------------- IPPO / MAPPO


def _constant_policy(agent, action: int, value: float) -> None:
    """Every agent takes ``action``; the critic answers ``value`` everywhere."""
    def act(x, generator=None, deterministic=False):
        n = x.shape[0]
        return torch.full((n,), action), torch.zeros(n), torch.full((n,), value)
    agent.net.act = act
    agent.net.value = lambda x: torch.full((x.shape[0],), value)


def test_per_agent_gae_over_the_rollout_by_hand(fake_module):
    from reinforge.classic.envs import make_vec_env
    from reinforge.classic.mappo import MAPPO, MAPPOSettings
    from reinforge.classic.ppo import gae_with_ends

    envs = make_vec_env(_env_cfg(fake_module), 0.5, seed=0)
    agent = MAPPO(envs, 0, MAPPOSettings(num_steps=4, gamma=0.5, gae_lambda=1.0))
    _constant_policy(agent, action=1, value=1.0)
    ro = agent.collect()
    # rows (env 0, agent a), (env 0, agent b): rewards 1 and 2 per step; step 2 truncates the episode
    # (+ gamma V = 0.5), step 3 ends the rollout with the episode open (+ 0.5)
    assert ro.rewards.tolist() == [[1, 2], [1, 2], [1.5, 2.5], [1.5, 2.5]]
    assert ro.ends.tolist() == [[False, False], [False, False], [True, True], [True, True]]
    adv, ret = gae_with_ends(ro.rewards, ro.values, ro.ends, 0.5, 1.0)
    # agent a: returns 1 + 0.5 (1 + 0.5 * 1.5) = 1.875, 1.75, 1.5 | 1.5; agent b: 3.625, 3.25, 2.5 | 2.5
    assert_close(ret, torch.tensor([[1.875, 3.625], [1.75, 3.25], [1.5, 2.5], [1.5, 2.5]]))
    assert_close(adv, ret - 1.0)
    assert ro.episodes == [(4.5, 3)]  # (3 + 6) / 2


def test_the_centralised_critic_sees_the_state_and_the_decentralised_one_the_observation(fake_module):
    from reinforge.classic.envs import make_vec_env
    from reinforge.classic.mappo import IPPO, MAPPO, MAPPOSettings

    envs = make_vec_env(_env_cfg(fake_module), 0.99, seed=0)
    obs = torch.tensor([[[1.0, 0.0], [2.0, 3.0]]])
    state = torch.tensor([[7.0, 8.0]])
    mappo, ippo = MAPPO(envs, 0, MAPPOSettings()), IPPO(envs, 0, MAPPOSettings())
    # rows [o_i, onehot(i) | critic input]: MAPPO's critic [s, onehot(i)], IPPO's [o_i, onehot(i)]
    assert mappo.rows(obs, state).tolist() == [[1, 0, 1, 0, 7, 8, 1, 0], [2, 3, 0, 1, 7, 8, 0, 1]]
    assert ippo.rows(obs, state).tolist() == [[1, 0, 1, 0, 1, 0, 1, 0], [2, 3, 0, 1, 2, 3, 0, 1]]
    assert mappo.act(obs.reshape(1, -1), True).shape == (1, 2)


@pytest.mark.slow  # about 10 s on a loaded core
def test_mappo_on_a_mixed_task_with_different_observation_widths():
    """simple_adversary: the adversary sees 8 numbers, the agents 10 (padded); each agent's rows carry its own
    reward (the adversary's is minus its distance to the goal, the agents' a shared difference)."""
    from reinforge.classic.envs import make_vec_env
    from reinforge.classic.mappo import MAPPO, MAPPOSettings

    kwargs = {"N": 2, "max_cycles": 25, "continuous_actions": False}
    envs = make_vec_env(_env_cfg("mpe2.simple_adversary_v3", num_envs=2, kwargs=kwargs), 0.99, 0)
    assert envs.agent_names == ["adversary_0", "agent_0", "agent_1"] and envs.obs_dim == 10
    agent = MAPPO(envs, 0, MAPPOSettings(num_steps=5))
    ro = agent.collect()
    assert ro.obs.shape == (5, 2 * 3, (10 + 3) + (envs.state_dim + 3)) and ro.rewards.shape == (5, 6)
    assert (ro.obs[:, 0, 8:10] == 0).all()  # the adversary's observation is 8 wide: zero-padded
    assert (ro.rewards[:, 0] <= 0).all() and torch.equal(ro.rewards[:4, 1], ro.rewards[:4, 2])
    assert np.isfinite(agent.update(ro)["train/policy_loss"])


def test_vdn_stores_the_joint_transition_with_the_team_reward(fake_module):
    from reinforge.classic.envs import make_vec_env
    from reinforge.classic.vdn import VDN, VDNSettings

    envs = make_vec_env(_env_cfg(fake_module), 0.99, seed=0)
    agent = VDN(envs, 0, VDNSettings(batch_size=2, learning_starts=0))
    agent.act = lambda obs, deterministic, epsilon=0.0: torch.tensor([[1, 1]])
    for _ in range(3):
        agent._env_step(0.0)
    assert agent.replay.size == 3 and agent.replay.rewards[:3].tolist() == [3.0, 3.0, 3.0]  # 1 + 2
    assert agent.replay.actions[0].tolist() == [1, 1] and agent.replay.terminated[:3].tolist() == [0, 0, 0]
    assert agent.replay.next_obs[2].tolist() == [3, 0, 3, -3]  # the truncated episode's last observation
    metrics = agent.gradient_step(agent.replay.sample(2))
    assert np.isfinite(metrics["train/td_loss"])


# ----------------------------------------------------------------------------- configuration


def test_configuration_errors_name_the_field():
    from reinforge.classic.config import classic_config_from_dict
    from reinforge.classic.envs import EnvConfig, make_vec_env
    from reinforge.classic.run import build_agent
    from reinforge.errors import ConfigError

    spread = {"id": "mpe2.simple_spread_v3", "backend": "pettingzoo"}
    with pytest.raises(ConfigError, match="classic.agent.update_epoch"):
        classic_config_from_dict({"classic": {"env": spread, "agent": {"name": "mappo", "update_epoch": 3}}})
    with pytest.raises(ConfigError, match="classic.env: .*backend pettingzoo steps its environments"):
        classic_config_from_dict({"classic": {"env": {**spread, "normalize_obs": True}}})
    cfg = classic_config_from_dict({"classic": {"agent": {"name": "vdn"}}})  # CartPole: not multi-agent
    envs = make_vec_env(EnvConfig(), 0.99, 0)
    with pytest.raises(ConfigError, match="set classic.env.backend: pettingzoo"):
        build_agent("vdn", envs, 0, cfg.classic.agent.settings)
    with pytest.raises(ConfigError, match="classic.env.id: cannot import"):
        make_vec_env(EnvConfig(id="mpe2.no_such_task_v0", backend="pettingzoo"), 0.99, 0)


def test_missing_pettingzoo_names_the_marl_extra(monkeypatch):
    from reinforge.classic.envs import EnvConfig, make_vec_env
    from reinforge.errors import ReinforgeError

    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(ReinforgeError, match=r"reinforge\[marl\]"):
        make_vec_env(EnvConfig(id="mpe2.simple_spread_v3", backend="pettingzoo"), 0.99, 0)


def test_a_short_run_writes_a_directory_reinforge_compare_reads(tmp_path):
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic
    from reinforge.eval.compare import run_compare

    for name in ("mappo", "vdn"):
        cfg = load_classic_config(f"simple_spread_{name}", [f"output_dir={tmp_path / name}", "name=s0",
                                  "classic.train.total_env_steps=800", "classic.env.num_envs=4",
                                  "classic.agent.learning_starts=100" if name == "vdn" else "classic.agent.num_steps=25",
                                  "classic.eval.episodes=2"])
        result = train_classic(cfg)
        evaluation = json.loads((result.run_dir / "eval.json").read_text())
        assert evaluation["eval/episodes"] == 2 and evaluation["env_steps"] == 800
    text = run_compare([str(tmp_path / "mappo"), str(tmp_path / "vdn")], "episode/return_mean", None, 1, None,
                       False, 5, 0.05, n_boot=50)
    assert "| mappo/mpe2.simple_spread_v3 | 1 |" in text and "| vdn/mpe2.simple_spread_v3 | 1 |" in text


# ----------------------------------------------------------------------------- learning (MPE2 simple_spread)

RANDOM_RETURN = -26.8  # a uniformly random joint policy's mean return on simple_spread (400 episodes, std 8.1)


def _learn(tmp_path, recipe: str, steps: int, seed: int = 0, eval_episodes: int = 50, extra: tuple[str, ...] = ()):
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    cfg = load_classic_config(recipe, [f"output_dir={tmp_path}", f"name={recipe}-{seed}", f"seed={seed}",
                                       f"classic.train.total_env_steps={steps}", "classic.train.log_every=1000",
                                       f"classic.eval.episodes={eval_episodes}", *extra])
    result = train_classic(cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    returns = [r["episode/return_mean"] for r in records if "episode/return_mean" in r]
    return json.loads((result.run_dir / "eval.json").read_text())["eval/return_mean"], returns


@pytest.mark.slow
def test_mappo_beats_a_random_policy_on_simple_spread(tmp_path):
    """The shipped simple_spread_mappo recipe for 15k environment steps (600 episodes, about 20 s on an idle
    core): its greedy policy's mean return over 50 episodes is well above a random policy's (-26.8; the standard
    error of a 50-episode mean is about 1.1), and its training return rose."""
    evaluation, returns = _learn(tmp_path, "simple_spread_mappo", 15_000)
    assert evaluation > RANDOM_RETURN + 3.0, evaluation
    assert sum(returns[-5:]) / 5 > sum(returns[:5]) / 5 + 1.5, (returns[:5], returns[-5:])


@pytest.mark.learning  # about 3-4 min each on one loaded core: make test-learning
@pytest.mark.parametrize("recipe", ["simple_spread_ippo", "simple_spread_mappo", "simple_spread_vdn"])
def test_the_shipped_recipes_learn_simple_spread(tmp_path, recipe):
    """The docs' comparison budget (60k environment steps, docs/classic.md "Multi-agent"): seed 0's greedy policy
    over 50 episodes and its last 10 updates' training return are well above a random policy's -26.8 (measured
    there: final training means about -21, greedy evaluations -17.7 to -19.3 on seed 0)."""
    evaluation, returns = _learn(tmp_path, recipe, 60_000)
    assert evaluation > RANDOM_RETURN + 4.0, evaluation
    assert sum(returns[-10:]) / 10 > RANDOM_RETURN + 4.0, returns[-10:]
    assert sum(returns[-10:]) / 10 > sum(returns[:10]) / 10 + 1.5, (returns[:10], returns[-10:])
