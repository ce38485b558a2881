"""AnytimeReasoner's BRPO advantage over per-budget scores and the stage that scores answers at thinking budgets,
against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.brpo import BRPOSettings, brpo_advantage, per_token, previous_value, segment_advantages
from reinforge.config import load_config
from reinforge.orchestrate.budget_scores import BudgetScores, _budget_scores, budget_score_stage
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task
from tests.budget_fixtures import _Collector, _row

HALF = torch.tensor([0.5, 0.5], dtype=torch.float64)


def test_brpo_segment_advantages_hand_values():
    """S = 2, p = (0.5, 0.5), one group: row 0 scores (0, 1), row 1 (1, 1).
    R: row 0 (0.5, 0.5), row 1 (1.0, 0.5); V2 = (0.75, 0.5); V1 at s = 1: row 0 0 * 0.5 = 0, row 1 1 * 0.5 = 0.5.
    brpo: s = 0 -> V2 = 0.75; s = 1 -> (V1 + V2) / 2 = 0.25 (row 0), 0.5 (row 1).
    A: row 0 (-0.25, 0.25), row 1 (0.25, 0)."""
    scores, groups = torch.tensor([[0.0, 1.0], [1.0, 1.0]]), torch.tensor([0, 0])
    assert segment_advantages(scores, groups, HALF, "brpo", 2.0).tolist() == [[-0.25, 0.25], [0.25, 0.0]]
    assert segment_advantages(scores, groups, HALF, "group", 2.0).tolist() == [[-0.25, 0.0], [0.25, 0.0]]
    assert segment_advantages(scores, groups, HALF, "previous", 2.0).tolist() == [[0.5, 0.5], [1.0, 0.0]]
    assert segment_advantages(scores, groups, HALF, "none", 2.0).tolist() == [[0.5, 0.5], [1.0, 0.5]]


def test_previous_value_weights_later_budgets_more():
    """Scores (1, 0, 1), p = (0.2, 0.3, 0.5), discount 2: V1 = 0 at s = 0; s = 1: (1 * 1) / 1 * (0.3 + 0.5) = 0.8;
    s = 2: (1 * 1 + 2 * 0) / (1 + 2) * 0.5 = 1/6."""
    v1 = previous_value(torch.tensor([[1.0, 0.0, 1.0]]), torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64), 2.0)
    assert v1[0].tolist() == pytest.approx([0.0, 0.8, 1 / 6])


def test_groups_are_separate():
    """Two groups of one row each, S = 1: R = r, V2 = r -> A = 0 for both."""
    out = segment_advantages(torch.tensor([[1.0], [0.0]]), torch.tensor([0, 1]), torch.ones(1, dtype=torch.float64),
                             "brpo", 2.0)
    assert out.tolist() == [[0.0], [0.0]]


def test_per_token_places_each_segment_on_its_tokens():
    """One prompt token, 4 generated, 1 pad; ends (2, 4): generated tokens 0-1 in segment 0, 2-3 in segment 1.
    A row of 3 generated tokens with ends (2, 3): its third token is in segment 1; a token past every end
    would take the last segment."""
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.float32)
    seg = torch.tensor([[-1.0, 2.0], [3.0, 5.0]], dtype=torch.float64)
    out = per_token(seg, torch.tensor([[2, 4], [2, 3]]), mask)
    assert out.tolist() == [[0, -1, -1, 2, 2, 0], [0, 3, 3, 5, 0, 0]]
    assert out.dtype == mask.dtype


def test_brpo_estimator_on_the_batch_fields_and_without_them():
    """The registered estimator with the fields of the first test: row 0's tokens (-0.25, -0.25 | 0.25), row 1's
    (0.25 | 0, 0). Without the fields every budget scores the reward: R = r, A = r - mean_g r (S = 2: s = 0 gets
    V2; s = 1 is never reached, ends at the width)."""
    cfg = BRPOSettings(budgets=[0.5, 1.0])
    mask = torch.ones(2, 3)
    out = brpo_advantage(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), mask, cfg,
                         torch.tensor([[0.0, 1.0], [1.0, 1.0]]), torch.tensor([[2, 3], [1, 3]]))
    assert out.tolist() == [[-0.25, -0.25, 0.25], [0.25, 0.0, 0.0]]
    bare = brpo_advantage(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, cfg)
    assert bare.tolist() == [[0.5] * 3, [-0.5] * 3]


def test_brpo_settings_are_checked():
    with pytest.raises(ValueError):
        BRPOSettings(budgets=[0.5, 0.25])
    with pytest.raises(ValueError):
        BRPOSettings(budgets=[0.5, 1.0], probs=[1.0])
    assert BRPOSettings(budgets=[0.5, 1.0], probs=[1, 3]).prior().tolist() == [0.25, 0.75]


# -------------------------------------------------------------------------------- the budget-score stage


def test_stage_scores_the_cut_responses():
    """max_new_tokens 3, budgets (0.34, 1.0) -> b = (1, 3). Row '1 5' (ids 5 17 9): cut after 1 token, '1' -> 0;
    whole '1 5' -> 1: scores (0, 1), ends (1, 3). Row '5' (1 token) ended within both budgets: its whole text at
    both, (1, 1), ends (1, 1). Mean score per budget: 0.5 and 1."""
    col, tasks = _Collector(), {"t": Task("t", "2+3=", "5")}
    rows = [_row([5, 17, 9], "1 5"), _row([9], "5")]
    metrics = BudgetScores(col, BRPOSettings(budgets=[0.34, 1.0]))(tasks, rows, SamplingParams(max_new_tokens=3))
    assert [r.metadata["budget_scores"] for r in rows] == [[0.0, 1.0], [1.0, 1.0]]
    assert [r.metadata["budget_ends"] for r in rows] == [[1, 3], [1, 1]]
    assert metrics["rollout/budget_scores/b1"] == 0.5 and metrics["rollout/budget_scores/b2"] == 1.0
    assert col.calls == []  # no summaries


def test_stage_samples_a_summary_after_each_cut():
    """summary_tokens 2, suffix '=' (id 16): the cut '1' becomes prompt + (5, 16), the policy's summary '5' is
    appended and '1=5' is scored -> 1."""
    col, tasks = _Collector(), {"t": Task("t", "2+3=", "5")}
    row = _row([5, 17, 9], "1 5")
    cfg = BRPOSettings(budgets=[0.34, 1.0], summary_tokens=2, summary_suffix="=")
    BudgetScores(col, cfg)(tasks, [row], SamplingParams(max_new_tokens=3))
    assert col.calls == [([[1, 6, 5, 16]], 2)]
    assert "1=5" in col.pool.seen and row.metadata["budget_scores"] == [1.0, 1.0]


def test_producer_and_stage_builder():
    """The producer stacks the rows' scores and ends; a row without them gets its reward at every budget and
    the batch width as ends. The stage exists only for a part that declares budget_scores."""
    algo = load_config(None, ["algo.advantage={name: brpo, budgets: [0.5, 1.0]}"]).algo
    a, b = _row([5], "1"), _row([9], "5")
    a.metadata |= {"budget_scores": [0.0, 1.0], "budget_ends": [1, 1]}
    b.reward = 0.5
    scores, ends = _budget_scores([a, b], 7, algo)
    assert scores.tolist() == [[0.0, 1.0], [0.5, 0.5]] and ends.tolist() == [[1, 1], [7, 7]]
    assert budget_score_stage(load_config(None, []).algo, _Collector(), SamplingParams()) is None
    assert budget_score_stage(algo, _Collector(), SamplingParams()) is not None


@pytest.mark.slow
def test_two_steps_train_with_brpo(tmp_path):
    """Two GRPO-shaped steps with BRPO's advantage and the budget-score stage on arithmetic with working."""
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, [
        f"output_dir={tmp_path}", "name=brpo", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "task.heldout_size=20", "task.verifier=numeric_match", "train.steps=2",
        "train.time_limit_s=0", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.report=false",
        "algo.advantage={name: brpo, budgets: [0.5, 1.0]}",
    ])
    result = train(cfg)
    metrics = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(metrics) == 2 and all(math.isfinite(m["train/loss"]) for m in metrics if "train/loss" in m)
    assert all("rollout/budget_scores/b1" in m for m in metrics)
