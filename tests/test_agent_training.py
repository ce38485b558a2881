"""Training a black-box OpenAI-API agent through the proxy, end to end with the shipped tiny base."""

from __future__ import annotations

import pytest

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl

pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("openai", reason="the openai package is not installed")

COMMON = ["env.name=agent", "env.agent_workers=64", "rollout.prompts_per_step=8", "rollout.group_size=8", "task.heldout_size=64",
          "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "train.time_limit_s=0", "log.report=false"]


@pytest.mark.slow
def test_agent_through_the_proxy_trains(tmp_path):
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "env.agent=agent_fixtures:arithmetic_agent",
                                      "train.steps=2", "train.lr=1e-4"]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [m["policy_version"] for m in rows] == [1, 2] and all(m["batch/sequences"] > 0 for m in rows)
    assert all(m["reward/accuracy"] == m["reward/mean"] for m in rows)  # 'correct' came from the agent's info
    assert all(0 < m["response/length_mean"] <= 8 for m in rows)
    # the greedy held-out evaluation also ran through the agent: the base model gets some right
    assert 0 < result.heldout_before < 1 and result.heldout_after is not None


@pytest.mark.slow
def test_agent_trains_in_async_mode_through_each_workers_proxy(tmp_path):
    """The rollout worker plays agent episodes through its own proxy over its own engine (the same
    collector as the synchronous loop); the learner process evaluates through its own."""
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "env.agent=agent_fixtures:arithmetic_agent",
                                      "train.steps=2", "orchestrate.mode=async", "task.heldout_size=16"]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [m["policy_version"] for m in rows] == [1, 2] and all(m["batch/sequences"] > 0 for m in rows)
    assert all(m["reward/accuracy"] == m["reward/mean"] for m in rows)
    assert all(m["async/lag_max"] <= 1 for m in rows)


def test_agent_returning_its_reward_and_remax_greedy_baseline(tmp_path):
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "env.agent=agent_fixtures:returning_agent",
                                      "train.steps=1", "algo.advantage=remax", "task.heldout_size=4"]))
    (row,) = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert 0 <= row["reward/mean"] <= 1 and row["batch/sequences"] >= 0


def test_agent_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="env.agent"):
        load_config(None, ["env.name=agent"])
    with pytest.raises(ConfigError, match="env.agent"):
        load_config(None, ["env.agent=x:y"])
    with pytest.raises(Exception, match="cannot load"):  # its run directory in tmp_path, not the checkout's runs/
        train(load_config(None, ["env.name=agent", "env.agent=no_such_module:agent", "train.steps=1",
                                 f"output_dir={tmp_path}"]))
