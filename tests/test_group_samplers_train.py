"""Group samplers in the training loop: SPEC-RL's cache resumes exactly from a checkpoint, and TreePO
(tree sampling with its tree-based advantage) trains end to end."""

from __future__ import annotations

import pytest
from resume_fixtures import straight_and_resumed, untimed

from reinforge.config import load_config
from reinforge.orchestrate.run import train

# one-digit sums: 80 training prompts, 16 a step, so every prompt comes back after 5 steps
SMALL = ("task.digits=1", "task.heldout_size=20", "rollout.prompts_per_step=16", "rollout.group_size=4",
         "rollout.max_new_tokens=4", "train.time_limit_s=0", "eval.final_samples=0", "log.report=false")


def _cfg(tmp_path, name, *overrides):
    return load_config(None, [f"output_dir={tmp_path}", f"name={name}", *SMALL, *overrides])


@pytest.mark.slow
def test_spec_rl_resumes_exactly_with_its_cache(tmp_path, monkeypatch):
    common = ("rollout.group_sampler={name: spec_rl}", "train.steps=6", "eval.every=0", "checkpoint.every=3",
              "train.lr=1e-3")
    straight, resumed = straight_and_resumed(monkeypatch, lambda name: _cfg(tmp_path, name, *common), kill_at=3)
    a, b = untimed(straight), untimed(resumed)
    assert a == b
    steps = [r for r in a if "rollout/tokens_reused" in r]
    assert steps[0]["rollout/tokens_reused"] == 0 and steps[5]["rollout/tokens_reused"] > 0


@pytest.mark.slow
def test_treepo_trains_with_its_tree_advantage(tmp_path):
    result = train(_cfg(tmp_path, "tree", "rollout.group_sampler={name: treepo, segment_len: 2}",
                        "algo.advantage=treepo", "train.steps=3", "eval.every=0"))
    steps = [r for r in result.metrics() if "rollout/tokens_generated" in r]
    assert len(steps) == 3
    assert all(r["rollout/tokens_reused"] > 0 for r in steps)  # shared prefixes decoded once
    assert all(r["rollout/tokens_generated"] < 16 * 4 * 4 for r in steps)


@pytest.mark.slow
def test_eptree_trains_with_treerl_process_supervision(tmp_path):
    result = train(_cfg(tmp_path, "eptree", "rollout.group_sampler={name: eptree}", "algo.advantage=treerl",
                        "train.steps=2", "eval.every=0"))
    steps = [r for r in result.metrics() if "rollout/tokens_generated" in r]
    assert len(steps) == 2
    assert all(r["rollout/tokens_reused"] > 0 for r in steps)  # the branches reuse their chain's prefix
    assert all(r["rollout/eptree/nodes"] > 0 for r in steps)
