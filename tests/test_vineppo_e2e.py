"""VinePPO end to end (docs/strategies.md, "VinePPO"): the shipped recipe runs with its re-rollouts
counted, and learns the one-digit task. Marked ``learning``: not in the default run."""

from __future__ import annotations

import pytest

from reinforge.config import load_config
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl

QUIET = ["eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0"]


def _rows(run_dir):
    return [m for m in read_jsonl(run_dir / "metrics.jsonl") if "reward/mean" in m]


@pytest.mark.learning
def test_the_recipe_estimates_every_state_and_whitens(tmp_path):
    cfg = load_config("vineppo_arithmetic", [
        f"output_dir={tmp_path}", "train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "algo.advantage.rollouts=3", "task.heldout_size=8", "eval.every=0", *QUIET])
    rows = _rows(train(cfg).run_dir)
    assert len(rows) == 2
    for row in rows:
        states = row["rollout/state_values/states"]
        # at least each prompt's state, at most one per generated token (every token a step) plus the prompt's
        assert 4 <= states <= 16 * (1 + 8)
        assert row["rollout/state_values/continuations"] == 3 * states
        assert row["rollout/state_values/tokens_generated"] >= row["rollout/state_values/continuations"]
        assert row["batch/sequences"] == 16  # no group dropped (ungrouped)
        assert abs(row["adv/mean"]) < 1e-5 and row["adv/std"] == pytest.approx(1.0, abs=0.05)


@pytest.mark.learning
def test_vineppo_learns_one_digit_addition(tmp_path):
    """40 steps of 8 prompts x 4 samples, K = 4: the held-out greedy accuracy rises."""
    cfg = load_config("vineppo_arithmetic", [
        f"output_dir={tmp_path}", "train.steps=40", "task.digits=1", "task.heldout_size=40",
        "rollout.prompts_per_step=8", "rollout.group_size=4", "algo.advantage.rollouts=4", "eval.every=0", *QUIET])
    result = train(cfg)
    assert result.heldout_before is not None and result.heldout_after > result.heldout_before + 0.1
