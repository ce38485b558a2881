"""A*-PO's stage 1 in the loop: V*(x) from reference samples, once per prompt, cached, checkpointed."""

from __future__ import annotations

import dataclasses

import pytest

from reinforge.config import load_config
from reinforge.orchestrate.collectors import Collected
from reinforge.orchestrate.value_estimates import (
    OptimalValues,
    ValueSettings,
    needs_optimal_value,
    value_settings,
)
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory


def _traj(group: int, task_id: str, reward: float = 0.0) -> Trajectory:
    return Trajectory([1, 2], [0, 1], [0.0, 0.0], 0, group, task_id, reward=reward)


class FakeCollector:
    """Scores the reference samples of each task from a fixed list of rewards; records every call."""

    def __init__(self, rewards: dict[str, list[float]]) -> None:
        self.rewards, self.calls = rewards, []

    def collect(self, tasks, params, seed, group_offset=0, independent=False):
        self.calls.append(([t.id for t in tasks], params.n, independent))
        return Collected([_traj(g, t.id, r) for g, t in enumerate(tasks) for r in self.rewards[t.id][:params.n]])


TASKS = [Task("a", "1+1=", "2"), Task("b", "2+2=", "4")]


def test_values_by_hand_once_per_prompt_then_from_the_cache():
    # a: 1 of 4 right, beta 0.5 -> 0.5 log((e^2 + 3) / 4) = 0.477229; b: none right -> 0
    collector = FakeCollector({"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]})
    values = OptimalValues(collector, ValueSettings(samples=4, beta=0.5, skip_unsolved=False))
    params = SamplingParams(n=1)
    assert values(TASKS, [], params, 1) == pytest.approx([0.4772293, 0.0])
    assert collector.calls == [(["a", "b"], 4, True)]  # N samples per prompt, drawn independently
    assert values([TASKS[1], TASKS[0], TASKS[0]], [], params, 2) == pytest.approx([0.0, 0.4772293, 0.4772293])
    assert len(collector.calls) == 1  # no new prompt: no new sample
    assert values.metrics() == {"value_estimates/prompts": 2.0, "value_estimates/unsolved_prompts": 1.0,
                                "value_estimates/reference_samples": 8.0}


def test_unsolved_prompts_get_no_loss_and_the_cache_is_state():
    collector = FakeCollector({"a": [1, 0], "b": [0, 0]})
    values = OptimalValues(collector, ValueSettings(samples=2, beta=0.5))  # skip_unsolved by default
    online = [_traj(0, "a", 1.0), _traj(1, "b", 1.0)]
    values(TASKS, online, SamplingParams(n=1), 1)
    assert [t.trainable for t in online] == [True, False]
    restored = OptimalValues(FakeCollector({}), values.settings, cache=values.state()["optimal_values"])
    assert restored(TASKS, [], SamplingParams(n=1), 5) == values(TASKS, [], SamplingParams(n=1), 5)
    assert restored.collector.calls == []  # every value came from the saved cache


def test_the_loop_asks_for_it_only_when_a_part_declares_it():
    assert needs_optimal_value(load_config(None, ["preset=astar_po"]).algo)
    assert not needs_optimal_value(load_config(None, ["preset=grpo"]).algo)
    assert dataclasses.astuple(value_settings(load_config(None, ["preset=astar_po"]).algo)) == (8, 0.5, True, False, 1.0)


def _cfg(tmp_path, steps: int):
    return load_config(None, [f"output_dir={tmp_path}", "name=astar", "preset=astar_po", f"train.steps={steps}",
                              "rollout.prompts_per_step=4", "algo.policy_loss.value_samples=2",
                              "task.heldout_size=20", "eval.every=0", "eval.final_samples=0", "log.report=false",
                              "checkpoint.every=1", "train.time_limit_s=0", "log.samples_per_step=0"])


def test_astar_po_trains_and_resumes_with_its_saved_values(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    result = train(_cfg(tmp_path, 2))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    # 4 new prompts a step, 2 reference samples each; one on-policy sample per prompt
    assert [(m["value_estimates/prompts"], m["value_estimates/reference_samples"], m["rollout/sampled"])
            for m in rows] == [(4.0, 8.0, 4.0), (8.0, 16.0, 4.0)]
    assert any("train/regression/target" in m for m in rows)  # the A*-PO loss trained
    resumed = train(None, resume=result.run_dir, overrides=["train.steps=3"])
    last = [m for m in read_jsonl(resumed.run_dir / "metrics.jsonl") if "reward/mean" in m][-1]
    # the 8 saved values came back from the checkpoint: this process sampled only the 4 new prompts
    assert (last["step"], last["value_estimates/prompts"], last["value_estimates/reference_samples"]) == (3, 12.0, 8.0)


def test_the_collapse_warning_is_off_with_one_sample_per_prompt():
    from reinforge.orchestrate.step_metrics import CollapseDetector

    flat = {"step": 1, "groups/spread_frac": 0.0, "reward/mean": 0.3}  # a group of one never has spread
    assert CollapseDetector(patience=1, active=False).update(flat) is None
    assert CollapseDetector(patience=1).update(flat) is not None


def test_an_asynchronous_run_estimates_its_values_too():
    """The prompt-values stage runs in the learner's process after collection (orchestrate/stages.py)."""
    assert load_config(None, ["preset=astar_po", "orchestrate.mode=async"]).orchestrate.mode == "async"


def test_pvpo_reference_value_is_the_mean_and_trivial_prompts_get_no_loss():
    from reinforge.config import AlgoConfig

    algo = AlgoConfig(advantage={"name": "pvpo", "value_samples": 4}, skip_equal_reward_groups=False)
    assert needs_optimal_value(algo)
    settings = value_settings(algo)  # from the estimator that declares reference_value: the mean, no beta
    assert (settings.samples, settings.beta, settings.skip_solved, settings.skip_unsolved) == (4, None, True, False)
    collector = FakeCollector({"a": [1, 0, 1, 1], "b": [1, 1, 1, 1]})
    values = OptimalValues(collector, settings)
    online = [_traj(0, "a", 0.0), _traj(1, "b", 1.0)]
    assert values(TASKS, online, SamplingParams(n=1), 1) == [0.75, 1.0]
    assert [t.trainable for t in online] == [True, False]  # b: every reference sample solved it
    assert values.state()["optimal_values"]["a"] == [0.75, 1.0, 0.0]


def test_a_run_has_one_producer_of_the_per_sequence_baseline():
    """ReMax's greedy baseline, A*-PO's V*(x) and PVPO's V_ref(x) all fill ``baseline``: two are refused,
    naming both needs; each alone loads."""
    from reinforge.errors import ConfigError

    with pytest.raises(ConfigError, match="greedy_baseline and optimal_value"):
        load_config(None, ["algo.advantage=remax", "algo.policy_loss=astar_po"])
    with pytest.raises(ConfigError, match="optimal_value and reference_value"):
        load_config(None, ["algo.advantage=pvpo", "algo.policy_loss=astar_po", "algo.skip_equal_reward_groups=false"])
    assert load_config(None, ["algo.advantage=remax"]).algo.advantage == "remax"
    assert load_config(None, ["preset=astar_po"]).algo.policy_loss == "astar_po"
