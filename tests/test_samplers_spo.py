"""SPO's prioritized prompt sampling (issue 18): weights, estimates, the draw, resume, the recipe.

Hand-computed values are worked out in the comments."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_samplers_curriculum import group, json_round_trip, play

from reinforge.algo.spo import SPOSettings, ValueTracker
from reinforge.config import load_config
from reinforge.data.arithmetic import arithmetic_splits
from reinforge.data.base import TaskSampler
from reinforge.data.samplers import build_task_sampler
from reinforge.data.spo_sampler import SPOSampler, SPOSamplerSettings, priority_weights, weighted_draw
from reinforge.errors import ConfigError
from reinforge.types import Task


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", prompt=f"{i}+0=", answer=str(i)) for i in range(n)]


def test_priority_weights_by_hand():
    # p = 1/2: sqrt(1/4) = 0.5; p = 1/5: sqrt(4/25) = 0.4; p = 0 and p = 1: 0; each + eps 0.05
    w = priority_weights(np.array([1.0, 1.0, 0.0, 3.0]), np.array([1.0, 4.0, 2.0, 0.0]), 0.05)
    assert w.tolist() == pytest.approx([0.55, 0.45, 0.05, 0.05])
    assert priority_weights(np.array([0.0]), np.array([1.0]), 0.0).tolist() == [0.0]


def test_estimates_follow_the_forgetting_update_by_hand():
    s = SPOSampler(tasks(3), 0, SPOSamplerSettings(rho=0.5, prior_value=0.5, prior_count=2.0))
    assert s.estimate("t0") == (1.0, 1.0)  # prior: n0 v0 = 1, n0 (1 - v0) = 1
    s.observe(group("t0", 0, [1, 1, 1, 0]))  # alpha = 0.5 * 1 + 3 = 3.5, beta = 0.5 * 1 + 1 = 1.5
    assert s.estimate("t0") == (3.5, 1.5)
    s.observe(group("t0", 0, [0, 0]))  # alpha = 1.75, beta = 0.75 + 2 = 2.75
    assert s.estimate("t0") == (1.75, 2.75)
    # its weight: p = 1.75 / 4.5 = 7/18, sqrt(7/18 * 11/18) = sqrt(77) / 18
    s.next_batch(1)
    assert s.estimate("t1") == (1.0, 1.0)
    w = priority_weights(np.array([1.75]), np.array([2.75]), 0.05)[0]
    assert w == pytest.approx(math.sqrt(77) / 18 + 0.05)


def test_estimates_equal_the_spo_advantages_tracker():
    """Same prior and rho, 0/1 rewards: the sampler's Beta estimates are algo/spo.py's ValueTracker's."""
    tracker = ValueTracker(SPOSettings(prior_value=0.3, prior_count=2.0, rho=0.8))
    s = SPOSampler(tasks(2), 0, SPOSamplerSettings(prior_value=0.3, prior_count=2.0, rho=0.8))
    steps = [{"t0": [1, 0, 1], "t1": [0, 0]}, {"t0": [1]}, {"t0": [0, 0], "t1": [1, 1, 1]}]
    for step in steps:
        s.observe([t for g, (tid, out) in enumerate(step.items()) for t in group(tid, g, out)])
        tracker.observe([int(tid[1]) for tid, out in step.items() for _ in out],
                        [float(o) for out in step.values() for o in out])
    for k in (0, 1):
        a, b = s.estimate(f"t{k}")
        assert a == pytest.approx(tracker.alpha[k]) and b == pytest.approx(tracker.beta[k])
        assert a / (a + b) == pytest.approx(tracker.values([k])[0])


def test_weighted_draw_frequencies_match_the_weights():
    w = np.array([0.55, 0.45, 0.05, 0.05])
    counts = np.bincount([weighted_draw(w, 1, np.random.default_rng([0, i]))[0] for i in range(4000)], minlength=4)
    expected = 4000 * w / w.sum()  # 2000, 1636, 182, 182
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # chi-square, 3 degrees of freedom, p = 0.001
    two = weighted_draw(w, 2, np.random.default_rng(1))
    assert len(set(two)) == 2  # without replacement
    assert sorted(weighted_draw(np.zeros(3), 3, np.random.default_rng(2))) == [0, 1, 2]  # all zero: uniform
    assert len(weighted_draw(w, 6, np.random.default_rng(3))) == 6  # more than the candidates: with replacement


def test_next_batch_prefers_uncertain_prompts_and_reports_metrics():
    s = SPOSampler(tasks(3), 5, SPOSamplerSettings(exploration=0.0))
    s.observe(group("t0", 0, [1] * 8) + group("t1", 1, [0] * 8))  # t0, t1: p near 1 and 0; t2 unseen: 0.5
    s.estimates["t0"], s.estimates["t1"] = (5.0, 0.0), (0.0, 5.0)  # exactly solved / unsolved: weight 0
    assert [t.id for t in s.next_batch(1)] == ["t2"]
    m = s.metrics()
    assert m["sampler/priority_mean"] == pytest.approx(0.5) and m["sampler/value_mean"] == pytest.approx(0.5)


def test_candidate_pool_comes_from_uniform_passes():
    s = SPOSampler(tasks(10), 0, SPOSamplerSettings(pool=1.0))
    uniform = TaskSampler(s.tasks, 0)
    for _ in range(3):  # pool 1 x 4: the candidates are the uniform sampler's next 4, the batch those 4
        assert sorted(t.id for t in s.next_batch(4)) == sorted(t.id for t in uniform.next_batch(4))


def test_resume_draws_exactly_what_the_uninterrupted_sampler_draws():
    split = arithmetic_splits(digits=1, heldout_size=10).train
    for settings in (SPOSamplerSettings(), SPOSamplerSettings(pool=2.0, rho=0.9)):
        straight, drawn = SPOSampler(split, 3, settings), []
        for step in range(12):
            batch = straight.next_batch(16)
            play(straight, batch)
            straight.metrics()
            if step == 4:
                state = json_round_trip(straight.state_dict())
            if step > 4:
                drawn.append([t.id for t in batch])
        resumed, again = SPOSampler(split, 3, settings), []
        resumed.load_state_dict(state)
        for _ in range(7):
            batch = resumed.next_batch(16)
            play(resumed, batch)
            resumed.metrics()
            again.append([t.id for t in batch])
        assert again == drawn
        assert json.dumps(resumed.state_dict(), sort_keys=True) == json.dumps(straight.state_dict(), sort_keys=True)


@pytest.mark.parametrize(("sampler", "field"), [
    ("{name: spo, exploration: -0.1}", "exploration"),
    ("{name: spo, rho: 0}", "rho"),
    ("{name: spo, prior_value: 1.5}", "prior_value"),
    ("{name: spo, pool: -1}", "pool"),
])
def test_a_bad_setting_is_a_config_error_naming_it(sampler, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [f"task.sampler={sampler}"])


def test_built_from_the_recipe():
    cfg = load_config(None, ["task.sampler={name: spo, exploration: 0.1, rho: 0.9}"])
    split = arithmetic_splits(digits=1, heldout_size=10).train
    sampler = build_task_sampler(cfg.task.sampler.name, split, 0, cfg.task.sampler.settings())
    assert isinstance(sampler, SPOSampler) and sampler.cfg.exploration == 0.1 and sampler.cfg.rho == 0.9


@pytest.mark.learning
def test_default_recipe_trains_and_resumes_exactly(tmp_path, monkeypatch):
    """4 steps straight == 2 steps, a kill and a resume: same metrics (sampler/... included), same weights."""
    from resume_fixtures import straight_and_resumed, untimed
    from safetensors.torch import load_file
    from test_docs_metrics import _undocumented

    torch.set_num_threads(1)

    def cfg(name):
        return load_config(None, [
            f"output_dir={tmp_path}", f"name={name}", "rollout.prompts_per_step=6", "rollout.group_size=4",
            "task.heldout_size=30", "train.time_limit_s=0", "eval.final_samples=0", "log.report=false",
            "train.steps=4", "eval.every=2", "checkpoint.every=2", "task.sampler={name: spo}"])

    straight, resumed = straight_and_resumed(monkeypatch, cfg)
    a, b = untimed(straight), untimed(resumed)
    assert a == b and [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert "sampler/priority_mean" in a[-1] and a[-1]["sampler/prompts_seen"] > 6
    assert _undocumented({k for r in a for k in r}) == set()
    wa = load_file(straight.run_dir / "checkpoints/step_4/model.safetensors")
    wb = load_file(resumed.run_dir / "checkpoints/step_4/model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
