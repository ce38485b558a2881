"""IMPALA (classic/impala.py, classic/impala_actors.py): the learner's V-trace update on an unroll, in-process
learning, and Ray actors streaming unrolls with version accounting."""

from __future__ import annotations

import json

import pytest
import torch

gym = pytest.importorskip("gymnasium")

from reinforge.classic.config import load_classic_config  # noqa: E402
from reinforge.classic.envs import EnvConfig, make_vec_env  # noqa: E402
from reinforge.classic.impala import Impala, ImpalaSettings  # noqa: E402
from reinforge.classic.unroll import collect_unroll  # noqa: E402


def test_an_unroll_has_time_major_arrays_and_the_behaviour_log_probs():
    envs = make_vec_env(EnvConfig(num_envs=3, kwargs={"max_episode_steps": 5}), 0.99, 0)
    agent = Impala(envs, 0, ImpalaSettings(unroll_length=7))
    data, _, episodes = collect_unroll(agent.net, envs, agent.obs, 7, torch.Generator().manual_seed(0))
    assert data["obs"].shape == (7, 3, 4) and data["actions"].shape == (7, 3) and data["last_obs"].shape == (3, 4)
    assert data["truncated"][4].all() and len(episodes) == 3  # every env hit the 5-step limit at step 5
    assert (data["final_obs"][4] != 0).any() and not data["final_obs"][0].any()
    logp, _, _ = agent.net.evaluate(torch.from_numpy(data["obs"]).reshape(21, 4), torch.from_numpy(data["actions"]).reshape(21))
    assert torch.allclose(logp.reshape(7, 3), torch.from_numpy(data["behavior_logp"]), atol=1e-6)


def test_on_policy_the_learner_sees_ratios_of_one_and_updates():
    envs = make_vec_env(EnvConfig(num_envs=2), 0.99, 0)
    agent = Impala(envs, 0, ImpalaSettings(unroll_length=16))
    before = [p.clone() for p in agent.net.parameters()]
    it = agent.iterate(0.0)
    assert agent.version == 1 and it.metrics["async/lag_mean"] == 0.0
    assert it.metrics["train/rho_mean"] == pytest.approx(1.0, abs=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.net.parameters(), strict=True))


@pytest.mark.slow
def test_impala_in_process_reaches_475_on_cartpole(tmp_path):
    """actors=0 (on-policy unrolls in the learner): seed 0 reached a 20-episode mean of 475 after 120k steps
    (about 8 s on one loaded core)."""
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("cartpole_impala", [f"output_dir={tmp_path}", "name=imp", "classic.agent.actors=0",
                                                  "classic.train.log_every=10000"])
    result = train_classic(cfg)
    assert result.stopped == "return" and result.env_steps <= 250_000
    assert json.loads((result.run_dir / "eval.json").read_text())["eval/return_mean"] >= 400


@pytest.mark.slow
def test_ray_actors_stream_unrolls_and_stale_ones_are_dropped():
    """Two actors, max_staleness 0: the learner trains on an unroll only if it was made with its newest
    weights; the other actor's unroll (made with the version before) is dropped and counted. Which actor
    is faster depends on the machine's load, so the loop runs until a drop happened (at most 200 unrolls)."""
    pytest.importorskip("ray")
    cfg = load_classic_config("cartpole_impala", ["classic.agent.max_staleness=0", "classic.agent.unroll_length=8"])
    c = cfg.classic
    envs = make_vec_env(c.env, c.agent.settings.gamma, 0)
    agent = Impala(envs, 0, c.agent.settings, c.env)
    metrics = []
    try:
        while len(metrics) < 200 and not (metrics and agent.dropped and agent.version >= 2):
            metrics.append(agent.iterate(len(metrics) / 200).metrics)
    finally:
        agent.close()
    lags = [m["async/lag_max"] for m in metrics]
    assert agent.version + agent.dropped == len(metrics) and agent.dropped >= 1 and agent.version >= 2
    assert all(("train/policy_loss" in m) == (lag == 0) for m, lag in zip(metrics, lags, strict=True))
