"""T-PPO in the training loop: a run with truncated rollouts (generations carried across steps) resumes
exactly from a checkpoint taken while generations were in flight."""

from __future__ import annotations

import pytest
from resume_fixtures import straight_and_resumed, untimed

from reinforge.config import load_config

SMALL = ("task.digits=1", "task.heldout_size=20", "rollout.prompts_per_step=8", "rollout.group_size=2",
         "rollout.max_new_tokens=6", "train.time_limit_s=0", "eval.final_samples=0", "log.report=false",
         "eval.every=0", "train.steps=6", "checkpoint.every=3", "algo.advantage=egae",
         "algo.skip_equal_reward_groups=false", "rollout.group_sampler={name: tppo, window: 2}")


@pytest.mark.learning
def test_tppo_resumes_exactly_with_generations_in_flight(tmp_path, monkeypatch):
    def cfg(name):
        return load_config(None, [f"output_dir={tmp_path}", f"name={name}", *SMALL])

    straight, resumed = straight_and_resumed(monkeypatch, cfg, kill_at=3)
    a, b = untimed(straight), untimed(resumed)
    assert a == b
    steps = [r for r in a if "rollout/tppo/continuing" in r]
    assert any(r["rollout/tppo/resumed"] > 0 for r in steps)  # windows continued across steps
    assert any(r["rollout/tppo/continuing"] > 0 for r in steps[2:3])  # in flight at the step-3 checkpoint
