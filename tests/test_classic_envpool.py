"""``classic.env.backend``: the EnvPool adapter keeps the Gymnasium path's contract (same-step autoreset,
RecordEpisodeStatistics' returns and lengths, ClipAction), checked on a scripted pool with EnvPool's
next-step autoreset (no envpool needed) and on EnvPool itself (skipped without ``envpool``)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from gymnasium.spaces import Box, Discrete  # noqa: E402

from reinforge.classic.agents import build_agent  # noqa: E402
from reinforge.classic.config import load_classic_config  # noqa: E402
from reinforge.classic.envpool_env import EnvPoolVectorEnv  # noqa: E402
from reinforge.classic.envs import EnvConfig, final_observations, finished_episodes, make_vec_env  # noqa: E402
from reinforge.classic.ppo import PPOSettings  # noqa: E402
from reinforge.errors import ConfigError  # noqa: E402

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_envpool = pytest.mark.skipif(not HAS_ENVPOOL, reason="EnvPool is not installed (make install-envpool, "
                                   "as docs/classic.md says)")


class ScriptedPool:
    """EnvPool's sync API and next-step autoreset: environment i's episodes last ``2 + i`` steps (ending
    terminated for even i, truncated for odd), reward ``1 + i`` per step; the observation is
    [episode number, step in episode]. The step after an end ignores the action and returns the next
    episode's first observation with reward 0; ``reset(ids)`` restarts those at once. Rows come back
    in reverse environment order, as a pool may return them in any order with ``env_id``."""

    def __init__(self, n: int, action_space: object = None) -> None:
        self.config = {"num_envs": n}
        self.single_observation_space = Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = action_space or Discrete(2)
        self.episode, self.t, self.pending = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
        self.actions: list[np.ndarray] = []

    def _rows(self, ids: np.ndarray, *arrays: np.ndarray) -> tuple:
        ids = ids[::-1]
        obs = np.stack([self.episode[ids], self.t[ids]], 1).astype(np.float32)
        return (obs, *(a[ids] for a in arrays)), {"env_id": ids.astype(np.int32)}

    def reset(self, env_id: np.ndarray | None = None) -> tuple:
        ids = np.arange(len(self.t)) if env_id is None else np.asarray(env_id)
        self.episode[ids] += env_id is not None
        self.t[ids], self.pending[ids] = 0, False
        (obs,), info = self._rows(ids)
        return obs, info

    def step(self, action: np.ndarray) -> tuple:
        self.actions.append(np.asarray(action))
        n, ids = len(self.t), np.arange(len(self.t))
        restart = self.pending.copy()
        self.episode[restart] += 1
        self.t[restart] = 0
        self.t[~restart] += 1
        reward = np.where(restart, 0.0, 1.0 + ids)
        end = ~restart & (self.t == 2 + ids)
        self.pending = end
        (obs, r, te, tr), info = self._rows(ids, reward, end & (ids % 2 == 0), end & (ids % 2 == 1))
        assert len(obs) == n
        return obs, r, te, tr, info

    def close(self) -> None:
        pass


def test_the_adapter_resets_in_the_same_step_and_records_the_episodes():
    envs = EnvPoolVectorEnv(ScriptedPool(2), seed=0)
    obs, _ = envs.reset(seed=0)
    assert obs.tolist() == [[0, 0], [0, 0]]  # environment order, not the pool's
    seen, rewards = [], []
    for _ in range(6):
        obs, reward, terminated, truncated, info = envs.step(np.zeros(2, dtype=np.int64))
        rewards.append(reward.tolist())
        index, final = final_observations(info)
        seen.append((obs.tolist(), terminated.tolist(), truncated.tolist(), index.tolist(),
                     final.tolist(), finished_episodes(info)))
    # env 0: episodes of 2 steps (terminated), reward 1; env 1: 3 steps (truncated), reward 2. No step is
    # a dummy (reward 0): the step that ends an episode already returns the next one's first observation.
    assert rewards == [[1, 2]] * 6
    assert seen[0] == ([[0, 1], [0, 1]], [False, False], [False, False], [], [], [])
    assert seen[1] == ([[1, 0], [0, 2]], [True, False], [False, False], [0], [[0, 2]], [(2.0, 2)])
    assert seen[2] == ([[1, 1], [1, 0]], [False, False], [False, True], [1], [[0, 3]], [(6.0, 3)])
    assert seen[3] == ([[2, 0], [1, 1]], [True, False], [False, False], [0], [[1, 2]], [(2.0, 2)])
    assert seen[5][5] == [(2.0, 2), (6.0, 3)]  # both end in step 6: one record each, in env order


def test_the_adapter_clips_box_actions_to_the_bounds():
    pool = ScriptedPool(2, Box(-2.0, 2.0, (1,), np.float32))
    envs = EnvPoolVectorEnv(pool, seed=0)
    envs.reset()
    envs.step(np.array([[5.0], [-0.5]], dtype=np.float32))
    assert pool.actions[-1].tolist() == [[2.0], [-0.5]]
    assert envs.bounded_action_space == pool.single_action_space and envs.action_space.shape == (2, 1)


def test_the_adapter_takes_only_its_construction_seed():
    envs = EnvPoolVectorEnv(ScriptedPool(1), seed=3)
    envs.reset(seed=3)
    with pytest.raises(ValueError, match="seeded when it is made"):
        envs.reset(seed=4)


def test_ppo_iterates_on_the_adapter():
    envs = EnvPoolVectorEnv(ScriptedPool(2, Discrete(2)), seed=0)
    agent = build_agent("ppo", envs, 0, PPOSettings(num_steps=8, num_minibatches=2, update_epochs=1))
    it = agent.iterate(0.0)
    assert sorted(it.episodes) == [(2.0, 2)] * 4 + [(6.0, 3)] * 2  # 8 steps: 4 episodes of env 0, 2 of env 1
    assert np.isfinite(it.metrics["train/policy_loss"])


@pytest.mark.parametrize("field", ["classic.env.normalize_obs=true", "classic.env.frame_stack=2",
                                   "classic.env.normalize_reward=true"])
def test_envpool_rejects_gymnasium_only_wrappers_by_field(field):
    with pytest.raises(ConfigError, match=f"classic.env: .*backend envpool has no {field.split('.')[2].split('=')[0]}"):
        load_classic_config("cartpole_ppo", ["classic.env.backend=envpool", field])


def test_auto_takes_gymnasium_where_envpool_cannot_serve():
    assert EnvConfig(backend="auto", normalize_obs=True).resolved_backend() == "gymnasium"
    assert EnvConfig(backend="auto", id="NoSuchEnvAnywhere-v0").resolved_backend() == "gymnasium"
    assert EnvConfig(backend="auto").resolved_backend() == ("envpool" if HAS_ENVPOOL else "gymnasium")


def test_envpool_asked_for_but_missing_names_the_field():
    if HAS_ENVPOOL:
        pytest.skip("envpool is installed here: the missing-package error cannot be raised")
    with pytest.raises(ConfigError, match="classic.env.backend: envpool is not installed"):
        make_vec_env(EnvConfig(backend="envpool"), 0.99, seed=0)


@needs_envpool
def test_envpool_cartpole_keeps_the_contract():
    envs = make_vec_env(EnvConfig(backend="envpool", num_envs=3, kwargs={"max_episode_steps": 4}), 0.99, seed=0)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 4) and np.abs(obs).max() <= 0.05  # CartPole's initial state: U(-0.05, 0.05)
    for step in range(1, 9):
        obs, reward, terminated, truncated, info = envs.step(np.ones(3, dtype=np.int64))
        assert reward.tolist() == [1.0] * 3  # never a dummy step
        if step % 4 == 0:  # the time limit: every episode ends here, truncated, and restarts in this step
            assert truncated.all() and finished_episodes(info) == [(4.0, 4)] * 3
            index, final = final_observations(info)
            assert index.tolist() == [0, 1, 2] and np.abs(obs).max() <= 0.05 < np.abs(final).max()
        else:
            assert not (terminated | truncated).any() and finished_episodes(info) == []
    envs.close()


@needs_envpool
def test_ppo_iterates_on_envpool_pendulum_with_clipped_actions():
    c = load_classic_config("pendulum_sac", ["classic.env.backend=envpool"]).classic
    envs = make_vec_env(c.env, 0.99, seed=0)
    assert envs.bounded_action_space.high.tolist() == [2.0]
    agent = build_agent("ppo", envs, 0, PPOSettings(num_steps=8, num_minibatches=2, update_epochs=1))
    assert np.isfinite(agent.iterate(0.0).metrics["train/policy_loss"])
