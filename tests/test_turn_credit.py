"""Turn-level credit for multi-turn agents: IGPO's information-gain turn rewards (algo/igpo.py, its need
``answer_probs`` served by orchestrate/answer_probs.py) and StepSearch's step rewards (algo/stepsearch.py,
its need ``search_steps`` served by orchestrate/search_steps.py). Hand-computed values for every formula,
the need/stage wiring, and one tiny end-to-end run per method (marked slow)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.igpo import (
    IGPOSettings,
    discounted_turn_sums,
    igpo_advantage,
    igpo_turn_rewards,
    turn_table,
)
from reinforge.algo.objective import read_fields, required_inputs
from reinforge.algo.stepsearch import StepSearchSettings, search_step_scores, stepsearch_advantage
from reinforge.config import load_config
from reinforge.data.search_corpus import search_splits
from reinforge.orchestrate.answer_probs import (
    AnswerProbs,
    answer_prob_stage,
    answer_probabilities,
    per_turn_tensor,
)
from reinforge.orchestrate.batch_fields import produce_fields
from reinforge.orchestrate.search_steps import SearchStepStage, search_step_stage, tfidf_cosines
from reinforge.types import Batch, Task, Trajectory

# two episodes of one group: row 0 has 3 turns (tokens 1-2, 4-5, 7-8), row 1 has 2 (tokens 1-2, 4-5)
TURNS = torch.tensor([[-1, 0, 0, -1, 1, 1, -1, 2, 2, -1], [-1, 0, 0, -1, 1, 1, -1, -1, -1, -1]])
MASK = (TURNS >= 0).float()
P = [[0.1, 0.3, 0.2], [0.1, 0.5]]  # p_k before each turn
R = torch.tensor([1.0, 0.0])


def close(got: torch.Tensor, want: list) -> None:
    torch.testing.assert_close(got.to(torch.float64), torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)


def _probs_field() -> torch.Tensor:
    out = torch.zeros(TURNS.shape, dtype=torch.float64)
    for i, ps in enumerate(P):
        for k, p in enumerate(ps):
            out[i][TURNS[i] == k] = p
    return out


# ------------------------------------------------------------------------------------------------ IGPO


def test_igpo_turn_rewards_are_the_gains_then_the_outcome():
    probs, present = turn_table(_probs_field(), TURNS, MASK != 0)
    assert present.tolist() == [[True, True, True], [True, True, False]]
    r, last = igpo_turn_rewards(probs, present, R)
    close(r, [[0.2, -0.1, 1.0], [0.4, 0.0, 0.0]])  # p1 - p0, p2 - p1, R
    assert last.tolist() == [[False, False, True], [False, True, False]]


def test_discounting_over_turns():
    r = torch.tensor([[1.0, 2.0, 4.0]], dtype=torch.float64)
    close(discounted_turn_sums(r, 0.5), [[1 + 1 + 1, 2 + 2, 4]])


def test_igpo_normalises_all_turns_of_the_group_together_then_discounts():
    adv = igpo_advantage(R, torch.tensor([0, 0]), MASK, IGPOSettings(gamma=0.5, adv_eps=1e-12),
                         answer_probs=_probs_field(), turn_index=TURNS)
    rewards = [0.2, -0.1, 1.0, 0.4, 0.0]
    mean, std = 0.3, math.sqrt(sum((x - 0.3) ** 2 for x in rewards) / 5)  # population std: sqrt(0.152)
    z = [(x - mean) / std for x in rewards]
    a02 = z[2]
    a01 = z[1] + 0.5 * a02
    a00 = z[0] + 0.5 * a01
    a11 = z[4]
    a10 = z[3] + 0.5 * a11
    want = [[0, a00, a00, 0, a01, a01, 0, a02, a02, 0], [0, a10, a10, 0, a11, a11, 0, 0, 0, 0]]
    close(adv, want)
    assert a02 == pytest.approx(0.7 / math.sqrt(0.152))


def test_igpo_separate_normalisation_and_single_turn_rows():
    adv = igpo_advantage(R, torch.tensor([0, 0]), MASK, IGPOSettings(gamma=1.0, adv_eps=1e-12, normalize="separate"),
                         answer_probs=_probs_field(), turn_index=TURNS)
    gains = [0.2, -0.1, 0.4]
    gz = [(x - 0.5 / 3) / math.sqrt(sum((y - 0.5 / 3) ** 2 for y in gains) / 3) for x in gains]
    oz = [1.0, -1.0]  # (1 - 0.5) / 0.5, (0 - 0.5) / 0.5
    assert adv[0, 1].item() == pytest.approx(gz[0] + gz[1] + oz[0], abs=1e-6)
    assert adv[1, 1].item() == pytest.approx(gz[2] + oz[1], abs=1e-6)
    # no turns recorded: one turn per row, the group-normalised outcome (population std)
    single = igpo_advantage(R, torch.tensor([0, 0]), torch.ones(2, 3), IGPOSettings(adv_eps=1e-12))
    close(single, [[1.0] * 3, [-1.0] * 3])


class _Bigram(nn.Module):
    """logits of the next token = a row of a table indexed by the current token."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table[input_ids])


def test_answer_probability_is_the_geometric_mean_over_the_answer_tokens():
    table = torch.tensor([[0.0, 1.0, 2.0], [2.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    model = _Bigram(table)
    # state [0]; appended [1, 2] whose answer is both tokens; then [0, 2] + [2, 1] scoring only the last
    got = answer_probabilities(model, 0, [[0], [0, 2]], [[1, 2], [2, 1]], [[0, 2], [1, 2]], 1.0, batch_size=1)
    logp = torch.log_softmax(table, dim=-1)
    assert got[0] == pytest.approx(math.exp((logp[0, 1] + logp[1, 2]).item() / 2))
    assert got[1] == pytest.approx(math.exp(logp[2, 1].item()))


def _episode(ids: list[int], spans: list[tuple[int, int]], task: str = "t", **meta) -> Trajectory:
    mask = [0] * len(ids)
    for a, b in spans:
        mask[a:b] = [1] * (b - a)
    return Trajectory(token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), version=0, group_id=0, task_id=task,
                      turn_spans=spans, turn_rewards=[0.0] * len(spans), metadata=dict(meta))


def test_the_answer_prob_stage_scores_each_distinct_state_once_and_fills_the_field():
    tok = SimpleNamespace(encode=lambda s, add_special_tokens=False: [int(c) for c in s])
    engine = SimpleNamespace(model=_Bigram(torch.zeros(3, 3)), tokenizer=tok, pad_id=0)  # uniform: p = 1/3
    rows = [_episode([1, 2, 2, 0, 1], [(1, 3), (4, 5)]), _episode([1, 2, 1, 0, 2], [(1, 3), (4, 5)])]
    metrics = AnswerProbs(engine, "{answer}0")(
        {"t": Task("t", "q", "12")}, rows, SimpleNamespace(temperature=1.0))
    assert metrics["rollout/answer_probs/states"] == 3  # the shared first state [1] once
    assert rows[0].metadata["answer_probs"] == pytest.approx([1 / 3, 1 / 3])
    field = per_turn_tensor(rows, 6, "answer_probs")
    assert field[0].tolist() == pytest.approx([0, 1 / 3, 1 / 3, 0, 1 / 3, 0])


def test_the_igpo_need_is_served_by_its_stage_and_producer():
    cfg = load_config("agent_guessing", ["algo.advantage=igpo", "algo.kl.coef=0"])
    assert "answer_probs" in required_inputs(cfg.algo) and {"answer_probs", "turn_index"} <= read_fields(cfg.algo)
    with pytest.raises(Exception, match="rollout.engine: torch"):
        answer_prob_stage(cfg.algo, SimpleNamespace(model=None), None)
    assert answer_prob_stage(load_config("agent_guessing", []).algo, None, None) is None
    rows = [_episode([1, 2, 2, 0, 1], [(1, 3), (4, 5)], answer_probs=[0.25, 0.5])]
    batch = Batch.from_trajectories(rows, pad_id=0)
    produce_fields(batch, rows, cfg.algo)
    assert batch.extra["answer_probs"][0].tolist() == pytest.approx([0, 0.25, 0.25, 0, 0.5])
    assert batch.turn_index[0].tolist() == [-1, 0, 0, -1, 1]


# ---------------------------------------------------------------------------------------------- StepSearch


def test_tfidf_cosine_matches_the_smoothed_idf_formula():
    idf_b = math.log(3 / 2) + 1  # 2 documents; "aa" in both (idf 1), "bb" and "cc" in one
    assert tfidf_cosines("aa bb", ["aa cc"]) == pytest.approx([1 / (1 + idf_b**2)])
    assert tfidf_cosines("", ["aa"]) == [0.0] and tfidf_cosines("aa", ["aa"]) == pytest.approx([1.0])


def test_search_step_gain_uses_the_memory_of_the_best_match_and_redundancy_counts_repeats():
    gain, penalty = search_step_scores(torch.tensor([[0.5], [0.8], [0.3]]), torch.tensor([0, 1, 2]),
                                       torch.tensor([2, 2, 2]))
    assert gain.tolist() == pytest.approx([0.5, 0.3, 0.0]) and penalty.tolist() == pytest.approx([0, 0.5, 1.0])
    gain, _ = search_step_scores(torch.tensor([[0.5, 0.0], [0.2, 0.6]]), torch.zeros(2), torch.zeros(2))
    assert gain.tolist() == pytest.approx([0.25, 0.3])  # mean over the two gold documents
    assert search_step_scores(torch.zeros(2, 0), torch.zeros(2), torch.zeros(2))[0].tolist() == [0, 0]


def test_the_search_step_stage_puts_the_step_reward_on_the_last_token_of_each_turn():
    t = _episode(list(range(8)), [(1, 3), (4, 6), (7, 8)],
                 observations=[["aa bb\nno results"], ["aa bb\ndd"], []])
    rollout = SimpleNamespace(kept=[t])
    metrics = SearchStepStage(0.6, True, True).run(rollout, {"t": Task("t", "q", "x", {"evidence": ["aa cc"]})}, 0)
    c = 1 / (1 + (math.log(3 / 2) + 1) ** 2)
    close(torch.tensor(t.metadata["search_steps"]), [[c, 0.0], [0.0, 0.5], [0.0, 0.0]])
    want = [0.0] * 8
    want[2], want[5] = 0.6 * c, 0.6 * (0.0 - 0.5)
    assert t.token_rewards == pytest.approx(want)
    assert metrics["rollout/search_steps/turns"] == 3 and metrics["rollout/search_steps/redundancy_mean"] == \
        pytest.approx(0.5 / 3)


def test_stepsearch_is_gae_over_outcome_and_step_rewards():
    mask, values = torch.ones(1, 3), torch.zeros(1, 3)
    tr = torch.tensor([[0.0, 0.3, 0.0]])
    cfg = StepSearchSettings(scale_by_std=False)
    adv = stepsearch_advantage(torch.tensor([1.0]), mask, values, cfg, token_rewards=tr)
    close(adv, [[1.3, 1.3, 1.0]])  # gamma = lam = 1, V = 0: the returns-to-go
    assert ADVANTAGES.needs("stepsearch") >= {"values", "search_steps"}


def test_search_tasks_carry_their_gold_evidence_and_the_stage_is_built_from_the_settings():
    task = search_splits(countries=5, hops=2, heldout_size=1).train[0]
    assert len(task.metadata["evidence"]) == 2 and task.answer in task.metadata["evidence"][1]
    cfg = load_config("agent_search", ["algo.advantage={name: stepsearch, step_scale: 0.5}", "algo.kl.coef=0"])
    stage = search_step_stage(cfg.algo)
    assert stage is not None and stage.scale == 0.5 and search_step_stage(load_config("agent_search", []).algo) is None


# ------------------------------------------------------------------------------------------- end to end

QUIET = ["eval.every=0", "eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0",
         "train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=4", "task.heldout_size=4",
         "algo.skip_equal_reward_groups=false", "algo.kl.coef=0"]


def _rows(run_dir):
    from reinforge.track.jsonl import read_jsonl

    return [m for m in read_jsonl(run_dir / "metrics.jsonl") if "reward/mean" in m]


@pytest.mark.slow
def test_igpo_trains_on_the_guessing_game(tmp_path):
    from reinforge.orchestrate.run import train

    cfg = load_config("agent_guessing", [f"output_dir={tmp_path}", "algo.advantage=igpo", *QUIET])
    rows = _rows(train(cfg).run_dir)
    assert len(rows) == 1
    row = rows[0]
    assert row["rollout/answer_probs/states"] >= 2 and 0 < row["rollout/answer_probs/prob_mean"] < 1
    assert "rollout/answer_probs/gain_mean" in row and "train/loss" in row


@pytest.mark.slow
def test_stepsearch_trains_on_the_search_agent(tmp_path):
    from reinforge.orchestrate.run import train

    cfg = load_config("agent_search", [f"output_dir={tmp_path}", "algo.advantage=stepsearch", "env.max_turns=2",
                                       *QUIET])
    rows = _rows(train(cfg).run_dir)
    assert len(rows) == 1
    row = rows[0]
    assert row["rollout/search_steps/turns"] >= 8 and row["rollout/search_steps/rows_without_evidence"] == 0
    assert "rollout/search_steps/gain_mean" in row and "train/loss" in row
