"""MRT's progress bonus over the answers scored at episode cuts, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.mrt import MRTSettings, mrt_advantage, progress
from reinforge.config import load_config
from reinforge.orchestrate.budget_scores import BudgetScores
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task
from tests.budget_fixtures import _Collector, _row


def test_progress_is_the_change_in_the_forced_answers_score():
    """J = (0, 1, 1, 0) -> progress (0, 1, 0, -1) (J_{-1} = 0)."""
    assert progress(torch.tensor([[0.0, 1.0, 1.0, 0.0]])).tolist() == [[0.0, 1.0, 0.0, -1.0]]


def test_mrt_advantage_hand_values():
    """Rewards (1, 0) in one group, no std scaling: outcome +/- 0.5. Budgets (0, 0.5, 1); J row 0 = (0, 0, 1),
    row 1 = (0, 1, 0) -> progress (0, 0, 1), (0, 1, -1); alpha 0.5. Ends: row 0 (0, 2, 4), row 1 (0, 2, 3).
    Generated tokens 0-1 are in episode 1, 2-3 in episode 2 (episode 0, the prompt alone, has no tokens):
    row 0: 0.5, 0.5, 0.5 + 0.5, 0.5 + 0.5; row 1: -0.5 + 0.5, -0.5 + 0.5, -0.5 - 0.5, pad 0."""
    cfg = MRTSettings(budgets=[0.0, 0.5, 1.0], alpha=0.5, scale_by_std=False)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float32)
    out = mrt_advantage(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, cfg,
                        torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), torch.tensor([[0, 2, 4], [0, 2, 3]]))
    assert out.tolist() == [[0.5, 0.5, 1.0, 1.0], [0.0, 0.0, -1.0, 0.0]]


def test_mrt_without_scores_or_alpha_is_grpo():
    """Rewards (1, 0): unbiased std sqrt(0.5) -> +/- 0.5 / 0.70711 = +/- 0.70711 on every token."""
    mask = torch.ones(2, 2)
    for cfg in (MRTSettings(), MRTSettings(alpha=0.0)):
        out = mrt_advantage(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, cfg,
                            torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0]] * 2) if cfg.alpha == 0 else None,
                            torch.zeros(2, 5, dtype=torch.long) if cfg.alpha == 0 else None)
        assert out[0].tolist() == pytest.approx([1 / math.sqrt(2)] * 2, rel=1e-5)
        assert out[1].tolist() == pytest.approx([-1 / math.sqrt(2)] * 2, rel=1e-5)


def test_a_zero_budget_scores_the_prompt_alone():
    """Budgets (0, 1) of 3 tokens -> cuts after 0 and 3 tokens: the empty answer '' scores 0, the whole '1 5'
    scores 1."""
    col, tasks = _Collector(), {"t": Task("t", "2+3=", "5")}
    row = _row([5, 17, 9], "1 5")
    BudgetScores(col, MRTSettings(budgets=[0.0, 1.0]))(tasks, [row], SamplingParams(max_new_tokens=3))
    assert row.metadata["budget_scores"] == [0.0, 1.0] and row.metadata["budget_ends"] == [0, 3]
    assert "" in col.pool.seen


@pytest.mark.slow
def test_two_steps_train_with_mrt(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, [
        f"output_dir={tmp_path}", "name=mrt", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "task.heldout_size=20", "task.verifier=numeric_match", "train.steps=2",
        "train.time_limit_s=0", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.report=false",
        "algo.advantage={name: mrt, budgets: [0.0, 0.5, 1.0]}",
    ])
    metrics = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(metrics) == 2 and all("rollout/budget_scores/b1" in m for m in metrics)
    assert all(math.isfinite(m["train/loss"]) for m in metrics if "train/loss" in m)
