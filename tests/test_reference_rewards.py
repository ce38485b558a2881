"""The policy's likelihood of the reference answer as a reward (rewards/reference_prob.py, orchestrate/
reference_rewards.py): RLPR's debiased mean probability with its adaptive std filter, DRO's R3 with its token
weights and filters, where a completion's reasoning ends, the stage on hand-computed bigram models and on the
shipped model, the config checks, and a run."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from test_turn_credit import _Bigram
from torch import nn

from reinforge.config import load_config
from reinforge.orchestrate.answer_probs import span_logprobs
from reinforge.orchestrate.reference_rewards import ReferenceRewardStage, reference_reward_stage
from reinforge.orchestrate.rollouts import Rollout
from reinforge.rewards.reference_prob import (
    R3Settings,
    RLPRSettings,
    StdThreshold,
    dro_drops,
    dro_r3,
    hardest_rank,
    r3_rewards,
    reasoning_of,
    reference_terms,
    rlpr,
    rlpr_reward,
)
from reinforge.types import Task, Trajectory

RLPR_TERM = "reward.terms=[{name: r, verifier: rlpr, params: {gold_verifier: exact_match}}]"
DRO_TERM = "reward.terms=[{name: r, verifier: dro_r3, params: {gold_verifier: exact_match}}]"


# ---- where the reasoning ends ------------------------------------------------------------------


@pytest.mark.parametrize("completion,reasoning", [
    ("46", ""),                                    # the arithmetic task: the bare answer, no reasoning
    ("12 and 34 make 46", "12 and 34 make "),      # the last number
    ("so \\boxed{ 46 } done", "so \\boxed{ "),     # the box's content, its leading space kept as reasoning
    ("think <answer> 46</answer>", "think <answer> "),
    ("Answer: **46**", "Answer: **"),
    ("no digits here", "no digits here"),          # no answer: all reasoning, the reference at its end
    ("", ""),
])
def test_the_reasoning_is_the_text_before_the_answer_extract_answer_reads(completion, reasoning):
    assert reasoning_of(completion) == reasoning


def test_without_the_number_fallback_a_bare_number_is_reasoning():
    assert reasoning_of("12 then 46", number_fallback=False) == "12 then 46"


def test_the_pool_placeholders_score_zero_and_judge_correct_against_the_gold_answer():
    task = Task("t", "1+1=", "46", {"gold_verifier": "exact_match"})
    for verifier in (rlpr, dro_r3):
        assert (verifier(task, "46").reward, verifier(task, "46").correct, verifier(task, "46").answer) == (0.0, True, "46")
        assert not verifier(task, "45").correct


# ---- RLPR --------------------------------------------------------------------------------------


def test_rlpr_is_the_mean_of_the_probabilities_debiased_and_clipped():
    logp = [math.log(0.9), math.log(0.1)]
    assert rlpr_reward(logp, None) == pytest.approx(0.5)  # mean of probabilities, not exp(mean log) = 0.3
    assert rlpr_reward(logp, [math.log(0.2), math.log(0.2)]) == pytest.approx(0.3)
    assert rlpr_reward(logp, [math.log(0.8), math.log(0.8)]) == 0.0  # below the baseline: clipped to 0
    assert rlpr_reward([], None) == 0.0


def test_the_std_threshold_is_beta_times_the_ema_of_earlier_steps_mean_group_std():
    th = StdThreshold(beta=0.5, decay=0.9, warmup=1)
    groups = [[0.0, 1.0], [0.5, 0.5], [0.3]]  # stds 0.7071, 0, and a group of one (no std)
    assert th.drop(groups) == [False, False, False]  # the first step only enters the EMA
    s = 2 ** -0.5
    assert th.ema == pytest.approx(s / 2) and th.threshold() == pytest.approx(s / 4)
    assert th.drop(groups) == [False, True, False]  # 0 < 0.177: dropped; the single sample never
    assert th.ema == pytest.approx(0.9 * s / 2 + 0.1 * s / 2)
    restored = StdThreshold(0.5, 0.9, 1)
    restored.load_state_dict(json.loads(json.dumps(th.state_dict())))
    assert (restored.ema, restored.steps) == (th.ema, 2)


def test_the_std_filter_waits_for_its_warmup():
    th = StdThreshold(beta=1.0, decay=0.0, warmup=3)
    for _ in range(3):
        assert th.drop([[0.0, 0.0], [0.0, 1.0]]) == [False, False]
    assert th.drop([[0.0, 0.0], [0.0, 1.0]]) == [True, False]  # decay 0: the EMA is the last mean, 0.354


# ---- DRO's R3 ----------------------------------------------------------------------------------


def test_r3_weights_tokens_by_their_spread_over_the_group():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -2.0, -0.5], [-2.0, -2.0, -1.5]], dtype=torch.float64)
    base = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64)
    r3, sigma = r3_rewards(logp, base)
    s0, s2 = torch.tensor([-1.0, -3.0, -2.0]).std(correction=0), torch.tensor([-0.5, -0.5, -1.5]).std(correction=0)
    w0, w2 = s0 / (s0 + s2), s2 / (s0 + s2)
    assert sigma.tolist() == pytest.approx([s0.item(), 0.0, s2.item()])
    assert r3.tolist() == pytest.approx([(w0 * 0 + w2 * 0.5).item(), (w0 * -2 + w2 * 0.5).item(),
                                         (w0 * -1 + w2 * -0.5).item()])
    uniform, _ = r3_rewards(logp, None, "uniform")
    assert uniform.tolist() == pytest.approx(logp.mean(1).tolist())  # DRO-Aggr: the plain mean log-probability


def test_r3_without_spread_is_the_same_for_every_sample():
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], dtype=torch.float64)
    r3, sigma = r3_rewards(logp, None)
    assert sigma.tolist() == [0.0, 0.0] and r3.tolist() == pytest.approx([-1.5, -1.5])
    assert r3_rewards(torch.zeros(2, 0, dtype=torch.float64), None)[0].tolist() == [0.0, 0.0]


def test_dro_filters_drop_unreachable_groups_then_the_lowest_spread():
    assert hardest_rank([1, 7, 3, 2], 0.5) == 5.0 and hardest_rank([4], 0.1) == 4.0 and hardest_rank([], 0.5) == 0.0
    cfg = R3Settings(low_variation_drop=0.5, difficulty_top_k=3)
    hardest = [[5.0, 2.0], [4.0, 9.0], [1.0, 1.0], [2.0, 3.0], [1.0, 2.0]]  # group 1: no sample within the top 3
    assert dro_drops([0.3, 0.9, 0.1, 0.2, 0.5], hardest, cfg) == [False, True, True, True, False]
    assert dro_drops([0.3, 0.1], [[9.0], [9.0]], R3Settings()) == [False, False]  # both filters off by default


# ---- the teacher-forced pass -------------------------------------------------------------------

VOCAB = "0123456789 +=x"


def _bigram(seed: int = 0) -> _Bigram:
    """A bigram model (next-token logits: a row of a random table) over ``VOCAB``; ``p(prev, next)`` its
    probability of ``next`` after ``prev``."""
    model = _Bigram(torch.randn(len(VOCAB), len(VOCAB), generator=torch.Generator().manual_seed(seed)))
    model.p = lambda prev, nxt: torch.softmax(model.table[VOCAB.index(prev)].detach(), -1)[VOCAB.index(nxt)].item()
    return model


def _encode(text: str, add_special_tokens: bool = False) -> list[int]:
    return [VOCAB.index(c) for c in text]


def test_span_logprobs_scores_the_span_and_ranks_it_in_the_vocabulary():
    model = _bigram()
    (logp, ranks), = span_logprobs(model, 0, [_encode("3=")], [_encode("12")], [[0, 2]], 1.0, ranks=True)
    assert logp == pytest.approx([math.log(model.p("=", "1")), math.log(model.p("1", "2"))])
    row = model.table[VOCAB.index("=")].detach()
    assert ranks[0] == 1 + int((row > row[VOCAB.index("1")]).sum())


def _row(group: int, completion: str, task: str = "t", reward: float = 0.0, **kw) -> Trajectory:
    prompt = _encode("3+4=")
    ids = prompt + _encode(completion)
    return Trajectory(ids, [0] * len(prompt) + [1] * len(completion), [0.0] * len(ids), 0, group, task, reward=reward,
                      completion_text=completion, **kw)


def _stage(model: nn.Module, verifier: str, **params) -> ReferenceRewardStage:
    reward = SimpleNamespace(terms=[SimpleNamespace(name="r", verifier=verifier, weight=2.0, params=params)])
    engine = SimpleNamespace(model=model, pad_id=0, tokenizer=SimpleNamespace(encode=_encode))
    stage = reference_reward_stage(reward, "exact_match", engine, SimpleNamespace(temperature=1.0))
    assert stage is not None
    return stage


def test_the_stage_sets_rlpr_from_each_rows_reasoning_replacing_the_placeholder():
    model = _bigram()
    rows = [_row(0, "9 12", reward=0.5, metadata={"reward_terms": {"r": 0.0, "other": 0.5}}), _row(0, "12"),
            _row(0, "x")]
    demo = _row(-1, "12", demonstration=True)
    rollout = Rollout(sampled=rows, kept=[*rows, demo], baseline=[0.1, 0.2, 0.3, 0.4])
    stage = _stage(model, "rlpr", std_filter=False)
    metrics = stage.run(rollout, {"t": Task("t", "3+4=", "12")}, 1)
    second = model.p("1", "2")  # the same after every prefix: a bigram model
    base = (model.p("=", "1") + second) / 2

    def expected(last: str) -> float:
        return min(max((model.p(last, "1") + second) / 2 - base, 0.0), 1.0)

    values = [t.metadata["reward_terms"]["r"] for t in rows]
    assert values == pytest.approx([expected(" "), 0.0, expected("x")])  # no reasoning: exactly 0
    assert [t.reward for t in rows] == pytest.approx([0.5 + 2 * values[0], 0.0, 2 * values[2]])  # weight 2
    assert rows[0].metadata["reward_terms"]["other"] == 0.5 and "reward_terms" not in demo.metadata
    assert rollout.kept[-1] is demo and rollout.baseline == [0.1, 0.2, 0.3, 0.4]
    assert metrics["rollout/reference/reasoning_chars_mean"] == pytest.approx(1.0)  # "9 ", "", "x"
    assert metrics["rollout/reference/base_prob_mean"] == pytest.approx(base)
    stage.run(rollout, {"t": Task("t", "3+4=", "12")}, 2)  # a replayed row is scored again: replaced, not added
    assert [t.reward for t in rows] == pytest.approx([0.5 + 2 * values[0], 0.0, 2 * values[2]])


def test_the_stage_sets_r3_per_group_and_drops_the_groups_its_filters_name():
    model = _bigram(seed=1)
    rows = [_row(0, "9 12"), _row(0, "x12"), _row(1, "12"), _row(1, "12")]  # group 1: no spread
    rollout = Rollout(sampled=rows, kept=list(rows), baseline=[0.0] * 4)
    stage = _stage(model, "dro_r3", low_variation_drop=0.5)
    metrics = stage.run(rollout, {"t": Task("t", "3+4=", "12")}, 1)
    log_base = math.log(model.p("=", "1"))
    # only the first reference token varies (a bigram model): w = [1, 0], r = log p(1 | last) - log p(1 | =)
    assert [t.metadata["reward_terms"]["r"] for t in rows] == pytest.approx(
        [math.log(model.p(" ", "1")) - log_base, math.log(model.p("x", "1")) - log_base, 0.0, 0.0])
    assert rollout.kept == rows[:2] and rollout.baseline == [0.0, 0.0]
    assert metrics["rollout/reference/r/groups_dropped"] == 1.0


def test_the_rlpr_std_filter_drops_flat_groups_once_its_ema_exists():
    model = _bigram()
    assert model.p("x", "1") > model.p("=", "1")  # the reasoning "x" raises p(reference): a value above 0
    rows = [_row(0, "x12"), _row(0, "12"), _row(1, "12"), _row(1, "12")]
    stage = _stage(model, "rlpr", std_filter_warmup=1)
    tasks = {"t": Task("t", "3+4=", "12")}
    first = Rollout(sampled=rows, kept=list(rows))
    assert stage.run(first, tasks, 1)["rollout/reference/r/groups_dropped"] == 0.0 and len(first.kept) == 4
    second = Rollout(sampled=rows, kept=list(rows))
    metrics = stage.run(second, tasks, 2)
    assert second.kept == rows[:2] and metrics["rollout/reference/r/groups_dropped"] == 1.0
    assert metrics["rollout/reference/r/std_threshold"] > 0
    assert stage.state_dict()["r"]["steps"] == 2
    fresh = _stage(_bigram(), "rlpr", std_filter_warmup=1)
    fresh.load_state_dict(json.loads(json.dumps(stage.state_dict())))
    assert fresh.thresholds["r"].ema == stage.thresholds["r"].ema


def test_the_stage_on_the_shipped_model_matches_a_plain_forward(tiny_model):
    from reinforge.models.loading import load_tokenizer
    from reinforge.rollout.prompts import encode_prompt

    tok = load_tokenizer("tiny-base")
    prompt = encode_prompt(tok, [{"role": "user", "content": "12+34="}])
    rows = []
    for text in ("5 46", "46"):
        ids = prompt + tok.encode(text, add_special_tokens=False)
        rows.append(Trajectory(ids, [0] * len(prompt) + [1] * (len(ids) - len(prompt)), [0.0] * len(ids), 0, 0, "t",
                               completion_text=text))
    engine = SimpleNamespace(model=tiny_model, pad_id=tok.pad_token_id, tokenizer=tok)
    reward = SimpleNamespace(terms=[SimpleNamespace(name="r", verifier="rlpr", weight=1.0,
                                                    params={"std_filter": False})])
    stage = reference_reward_stage(reward, "exact_match", engine, SimpleNamespace(temperature=1.0))
    stage.run(Rollout(sampled=rows, kept=list(rows)), {"t": Task("t", "12+34=", "46")}, 1)

    def mean_prob(prefix: list[int]) -> float:
        ref = tok.encode("46", add_special_tokens=False)
        seq = torch.tensor([prefix + ref])
        with torch.no_grad():
            probs = torch.softmax(tiny_model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0].float(), -1)
        return sum(probs[len(prefix) - 1 + k, t].item() for k, t in enumerate(ref)) / len(ref)

    reasoning = prompt + tok.encode("5 ", add_special_tokens=False)
    assert rows[0].metadata["reward_terms"]["r"] == pytest.approx(max(mean_prob(reasoning) - mean_prob(prompt), 0.0),
                                                                   abs=1e-5)
    assert rows[1].metadata["reward_terms"]["r"] == 0.0


# ---- config ------------------------------------------------------------------------------------


def test_the_terms_are_found_and_their_params_checked():
    cfg = load_config(None, [RLPR_TERM.replace("exact_match}", "exact_match, std_filter_beta: 0.25}")])
    (term,) = reference_terms(cfg.reward, cfg.task.verifier)
    assert isinstance(term.settings, RLPRSettings) and term.settings.std_filter_beta == 0.25
    alone = load_config(None, ["task.verifier=dro_r3"])
    assert isinstance(reference_terms(alone.reward, alone.task.verifier)[0].settings, R3Settings)
    assert reference_terms(load_config(None, []).reward, "exact_match") == []


@pytest.mark.parametrize("overrides,match", [
    ([RLPR_TERM.replace("exact_match}", "exact_match, no_such: 1}")], "reward.terms.0.params: no_such"),
    ([RLPR_TERM, "algo.dynamic_sampling=true"], "algo.dynamic_sampling: reads the rewards"),
    ([DRO_TERM, "rollout.hints={name: ghpo}"], "rollout.hints"),
    ([RLPR_TERM, "algo.advantage=remax"], "greedy_baseline"),
    ([RLPR_TERM, "model.path=tiny-agent", "env.name=retry"], "single-turn"),
])
def test_what_reads_rewards_before_the_stage_is_refused(overrides, match):
    with pytest.raises(Exception, match=match):
        load_config(None, overrides)


@pytest.mark.slow
def test_a_run_on_the_arithmetic_task_where_completions_are_almost_all_bare_answers(tmp_path):
    """The arithmetic task's completions are nearly always the bare answer: no reasoning, so the value is 0
    (the reference after the prompt, less itself) and the groups are flat; the stage's state is saved."""
    from reinforge.orchestrate.run import train

    result = train(load_config(None, [RLPR_TERM, f"output_dir={tmp_path}", "train.steps=2", "task.heldout_size=8",
                                      "rollout.prompts_per_step=4", "rollout.group_size=4", "eval.final_samples=0",
                                      "log.report=false", "checkpoint.every=2"]))
    steps = [m for m in result.metrics() if "reward/mean" in m]
    assert len(steps) == 2 and all(0 <= m["reward/term/r"] <= 1 for m in steps)
    assert all(m["rollout/reference/reasoning_chars_mean"] < 1 for m in steps)
    assert all(0 < m["rollout/reference/prob_mean"] < 1 and 0 < m["rollout/reference/base_prob_mean"] < 1
               for m in steps)
    state = json.loads((result.run_dir / "checkpoints" / "step_2" / "state.json").read_text())
    assert state["reference_rewards"]["r"]["steps"] == 2
