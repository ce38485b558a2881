"""Group and pairwise LLM judges: reply parsing, win rates, position-swap consistency, the error policy,
group scoring in the reward pool, the judge config, and a judge served by `reinforge serve` on loopback."""

from __future__ import annotations

import itertools
import json
import re
import socket
from collections.abc import Callable

import pytest

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.rewards.build import build_judge
from reinforge.rewards.composite import CompositeReward, RewardTerm, RewardTermError, term_metrics
from reinforge.rewards.judge import JudgeError, LLMJudge
from reinforge.rewards.judge_group import (
    DEFAULT_VERDICT_PATTERN,
    GroupJudge,
    PairwiseJudge,
    parse_group_scores,
    parse_verdict,
    sample_pairs,
    win_rates,
)
from reinforge.rewards.pool import VerifierError, VerifierPool
from reinforge.rewards.verifiers import RewardResult
from reinforge.types import Task
from tests.stub_openai_server import StubOpenAI, answered_by

TASK = Task("t1", "Name a letter.", "x")
PAIR = re.compile(r"Response A:\n(.*?)\n\nResponse B:\n(.*?)\n\nReason", re.S)


# --- parsing (no server) -------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ('{"scores": [7, 3.5, 10]}', [7.0, 3.5, 10.0]),
    ('Thinking... "scores": [1, 1, 1] was wrong.\n```json\n{"scores": [2, 0, 9]}\n```', [2.0, 0.0, 9.0]),
    ('{"scores": ["4", "5", "6"]}', [4.0, 5.0, 6.0]),
    ("Candidate 1: 7\nCandidate 2: 4\nCandidate 3: 9", [7.0, 4.0, 9.0]),
    ("Some reasoning.\n1: 2\n2) 3\n**3.** score: 8.5\n", [2.0, 3.0, 8.5]),
    ("candidate 1: 1\ncandidate 2: 2\ncandidate 3: 3\n\nOn reflection:\ncandidate 2: 6", [1.0, 6.0, 3.0]),
])
def test_group_scores_parse_from_json_or_lines(text, expected):
    assert parse_group_scores(text, 3) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "message"), [
    ('{"scores": [7, 3]}', "2 scores for 3 candidates"),
    ('{"scores": [7, 3, 1, 1]}', "4 scores for 3 candidates"),
    ("Candidate 1: 7\nCandidate 2: 4", "2 scores for 3 candidates"),
    ("Candidate 1: 7\nCandidate 3: 4\nCandidate 4: 4", r"scored candidates \[1, 3, 4\]"),
    ('{"scores": [7, 3, 11]}', "outside the scale"),
    ('{"scores": [7, "good", 1]}', "not all numbers"),
    ('{"scores": [7, 3, 1,]}', "not JSON"),
    ("They are all fine.", "no scores"),
])
def test_group_score_failures_are_judge_errors_with_the_reply(text, message):
    with pytest.raises(JudgeError, match=message) as e:
        parse_group_scores(text, 3)
    assert repr(text)[:40] in str(e.value)


@pytest.mark.parametrize(("text", "verdict"), [
    ("Verdict: A", "a"), ("b is longer. VERDICT: **B**", "b"), ("verdict - tie", "tie"),
    ("Verdict: B at first, then on reflection Verdict: A", "a"),
])
def test_parse_verdict(text, verdict):
    assert parse_verdict(text, re.compile(DEFAULT_VERDICT_PATTERN, re.I)) == verdict


def test_parse_verdict_failures():
    with pytest.raises(JudgeError, match="no verdict"):
        parse_verdict("A is better.", re.compile(DEFAULT_VERDICT_PATTERN, re.I))
    with pytest.raises(JudgeError, match="'c' is not A, B or tie"):
        parse_verdict("Winner: C", re.compile(r"winner: (\w)", re.I))


def test_win_rates_and_pair_sampling():
    # 0 beats 1, 2 beats 0, 1 and 2 tie: 0 -> (1 + 0) / 2, 1 -> (0 + 1/2) / 2, 2 -> (1 + 1/2) / 2; 3 in no pair
    assert win_rates(4, {(0, 1): 1.0, (0, 2): 0.0, (1, 2): 0.5}) == [0.5, 0.25, 0.75, 0.5]
    assert sample_pairs(3, None, 0, "t") == [(0, 1), (0, 2), (1, 2)]
    assert sample_pairs(3, 5, 0, "t") == [(0, 1), (0, 2), (1, 2)]  # fewer pairs than max_pairs: all
    drawn = sample_pairs(6, 4, 0, "t")
    assert len(drawn) == 4 and drawn == sorted(set(drawn)) and set(drawn) <= set(itertools.combinations(range(6), 2))
    assert drawn == sample_pairs(6, 4, 0, "t")  # deterministic
    assert {tuple(sample_pairs(6, 4, s, "t")) for s in range(5)} != {tuple(drawn)}  # the seed matters


# --- against the stub OpenAI server --------------------------------------------------------------


class Judges:
    """The stub's per-episode reply functions: ``url(fn)`` is a base_url whose calls ``fn(content)`` answers."""

    def __init__(self, stub: StubOpenAI, base: str) -> None:
        self.stub, self.base, self.fns, self.n = stub, base, {}, 0

    def url(self, fn: Callable[[str], str]) -> str:
        self.n += 1
        self.fns[f"j{self.n}"] = fn
        return f"{self.base}/episodes/j{self.n}/v1"

    def calls(self, url: str) -> list[str]:
        return [body["messages"][-1]["content"] for body in self.stub.requests.get(url.split("/")[-2], [])]


@pytest.fixture(scope="module")
def judges():
    pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    from reinforge.orchestrate.agent_episodes import BackgroundServer

    holder: list[Judges] = []
    stub = StubOpenAI(answered_by(lambda episode, content: holder[0].fns[episode](content)))
    with BackgroundServer(stub.app, log_level="error") as url:
        holder.append(Judges(stub, url))
        yield holder[0]


def _preferences(better: dict[tuple[str, str], str]) -> Callable[[str], str]:
    """A judge that answers a pair by ``better[(a, b)]`` (the winner's text, or "tie"), in either order."""
    def reply(content: str) -> str:
        a, b = PAIR.search(content).groups()
        winner = better.get((a, b), better.get((b, a)))
        return "Verdict: tie" if winner == "tie" else f"Hmm.\nVerdict: {'A' if winner == a else 'B'}"
    return reply


def _pairwise(url: str, **kw) -> PairwiseJudge:
    return PairwiseJudge(url, "judge", max_retries=0, timeout_s=10, **kw)


def test_group_judge_scores_the_group_in_one_call(judges):
    url = judges.url(lambda content: 'Ranking done.\n{"scores": [10, 2.5, 5]}')
    results = GroupJudge(url, "judge", max_retries=0).score_group(TASK, ["x", "yy", "zzz"])
    assert [r.reward for r in results] == pytest.approx([1.0, 0.25, 0.5])
    assert [r.raw_score for r in results] == [10.0, 2.5, 5.0] and [r.correct for r in results] == [True, False, False]
    (content,) = judges.calls(url)  # one call for the whole group
    assert "Candidate 1:\nx\n\nCandidate 2:\nyy\n\nCandidate 3:\nzzz" in content
    assert "Name a letter." in content and "3 candidate" in content and "from 0 to 10" in content


def test_group_judge_wrong_count_and_transport_errors(judges):
    url = judges.url(lambda content: '{"scores": [10, 2]}')
    with pytest.raises(JudgeError, match=r"judge 'judge' on task 't1': the judge gave 2 scores for 3"):
        GroupJudge(url, "judge", max_retries=0).score_group(TASK, ["x", "y", "z"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(JudgeError, match="failed on task 't1': APIConnectionError"):
        GroupJudge(down, "judge", max_retries=0, timeout_s=5).score_group(TASK, ["x", "y"])


def test_pairwise_win_rates_for_a_group_of_three(judges):
    # x beats y, z beats x, y and z tie: x = (1 + 0)/2, y = (0 + 1/2)/2, z = (1 + 1/2)/2
    url = judges.url(_preferences({("x", "y"): "x", ("x", "z"): "z", ("y", "z"): "tie"}))
    results = _pairwise(url).score_group(TASK, ["x", "y", "z"])
    assert [r.reward for r in results] == pytest.approx([0.5, 0.25, 0.75])
    assert [r.correct for r in results] == [False, False, True]
    shown = sorted(PAIR.search(c).groups() for c in judges.calls(url))
    assert shown == sorted([("x", "y"), ("y", "x"), ("x", "z"), ("z", "x"), ("y", "z"), ("z", "y")])
    assert [r.stats for r in results] == [{"pairs": 2.0, "agreed": 2.0}] * 3  # a consistent judge


def test_swap_inconsistent_pairs_are_ties_and_the_consistency_rate_is_logged(judges):
    # consistent on the pairs with x (x wins both); on (y, z) the judge always picks the first shown
    def reply(content: str) -> str:
        a, b = PAIR.search(content).groups()
        return "Verdict: A" if "x" in (a, b) and a == "x" or {a, b} == {"y", "z"} else "Verdict: B"

    reward = CompositeReward([RewardTerm("pw", _pairwise(judges.url(reply)))])
    results = reward.score_group(TASK, ["x", "y", "z"])
    assert [r.reward for r in results] == pytest.approx([1.0, 0.25, 0.25])  # (y, z) disagreed: a tie
    assert [r.stats["pw"] for r in results] == [{"pairs": 2.0, "agreed": 2.0}, {"pairs": 2.0, "agreed": 1.0},
                                                {"pairs": 2.0, "agreed": 1.0}]
    metrics = term_metrics(results)
    assert metrics["reward/judge/pw/swap_consistency"] == pytest.approx(2 / 3)
    biased = CompositeReward([RewardTerm("pw", _pairwise(judges.url(lambda c: "Verdict: A")))])
    always_a = biased.score_group(TASK, ["x", "y", "z"])
    assert [r.reward for r in always_a] == [0.5] * 3
    assert term_metrics(always_a + results)["reward/judge/pw/swap_consistency"] == pytest.approx(4 / 12)


def test_without_swap_each_pair_is_asked_once_and_no_consistency_is_measured(judges):
    url = judges.url(lambda content: "Verdict: A")  # position-biased: the first shown always wins
    results = CompositeReward([RewardTerm("pw", _pairwise(url, swap=False))]).score_group(TASK, ["x", "y", "z"])
    assert [r.reward for r in results] == pytest.approx([1.0, 0.5, 0.0])  # (0,1), (0,2), (1,2) shown in order
    assert len(judges.calls(url)) == 3 and all(not r.stats for r in results)
    assert not any(k.startswith("reward/judge/") for k in term_metrics(results))


def test_max_pairs_draws_the_same_pairs_each_time(judges):
    group = [f"c{i}" for i in range(6)]
    url = judges.url(_preferences({pair: max(pair) for pair in itertools.combinations(group, 2)}))
    judge = _pairwise(url, max_pairs=4, pair_seed=3)
    first, second = judge.score_group(TASK, group), judge.score_group(TASK, group)
    assert [r.reward for r in first] == [r.reward for r in second]
    shown = judges.calls(url)
    assert len(shown) == 2 * 2 * 4  # two groups, 4 pairs each, both orders
    pairs = sample_pairs(6, 4, 3, TASK.id)
    assert {tuple(sorted(PAIR.search(c).groups())) for c in shown} == {(group[i], group[j]) for i, j in pairs}
    compared = {k for pair in pairs for k in pair}
    for k, r in enumerate(first):  # the later-numbered candidate wins each comparison; one in no pair scores 1/2
        won = [1.0 if k == max(p) else 0.0 for p in pairs if k in p]
        assert r.reward == (sum(won) / len(won) if k in compared else 0.5)


def _with_numeric(judge) -> list[RewardTerm]:
    return [RewardTerm("correct", "exact_match", primary=True), RewardTerm("judge", judge, 2.0)]


def test_on_error_raise_names_the_term_and_task(judges):
    garbage = GroupJudge(judges.url(lambda content: "I like them all."), "judge", max_retries=0)
    reward = CompositeReward(_with_numeric(garbage), on_error="raise")
    with pytest.raises(RewardTermError, match=r"term 'judge' failed on task 't1': JudgeError: .*no scores.*"
                                              r"group of 3 completions"):
        reward.score_group(TASK, ["x", "y", "x"])
    with VerifierPool(CompositeReward(_with_numeric(garbage)), on_error="raise") as pool:
        with pytest.raises(VerifierError, match=r"on task 't1'.*reward term 'judge' failed on task 't1'"):
            pool.score([TASK] * 3, ["x", "y", "x"])


def test_on_error_zero_scores_the_group_zero_for_that_term_and_counts(judges):
    garbage = PairwiseJudge(judges.url(lambda content: "Both are lovely."), "judge", max_retries=0)
    reward = CompositeReward(_with_numeric(garbage), on_error="zero")
    with VerifierPool(reward, on_error="zero") as pool:
        outcomes = pool.score([TASK] * 3, ["x", "y", "x"])
    assert [o.status for o in outcomes] == ["ok"] * 3
    assert [o.reward for o in outcomes] == [1.0, 0.0, 1.0]  # the per-sample term still scores
    assert all(o.result.terms == {"correct": o.reward, "judge": 0.0} for o in outcomes)
    assert all("no verdict" in o.result.errors["judge"] for o in outcomes)
    assert reward.error_counts == {"correct": 0, "judge": 3}
    assert term_metrics([o.result for o in outcomes])["reward/errors/judge"] == 3.0


class _Counting:
    """exact_match that records every completion it is called with."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, task: Task, completion: str) -> RewardResult:
        self.seen.append(completion)
        return RewardResult(float(completion == task.answer), completion == task.answer)


def test_pool_scores_each_task_group_in_one_call_and_keeps_the_order(judges):
    def scores(content: str) -> str:  # candidate i scores its length
        found = re.findall(r"^Candidate \d+:\n(.*)$", content, re.M)
        return json.dumps({"scores": [len(c) for c in found]})

    url = judges.url(scores)
    counting = _Counting()
    reward = CompositeReward([RewardTerm("judge", GroupJudge(url, "judge", max_retries=0)),
                              RewardTerm("exact", counting, 0.0)])
    a, b = Task("a", "p", "xx"), Task("b", "q", "x")
    with VerifierPool(reward, workers=2) as pool:
        outcomes = pool.score([a, b, a, b, a], ["x", "yyy", "xx", "x", "zzzz"])
    assert [o.reward for o in outcomes] == pytest.approx([0.1, 0.3, 0.2, 0.1, 0.4])
    assert [o.result.terms["exact"] for o in outcomes] == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert sorted(counting.seen) == sorted(["x", "yyy", "xx", "x", "zzzz"])  # the per-sample term: each once
    calls = judges.calls(url)
    assert len(calls) == 2 and sorted(len(re.findall(r"^Candidate \d+:", c, re.M)) for c in calls) == [2, 3]


def test_per_sample_terms_are_called_per_sample():
    counting = _Counting()
    reward = CompositeReward([RewardTerm("exact", counting), RewardTerm("len", "length_penalty",
                                                                          params={"max_len": 3})])
    assert not reward.scores_groups
    with VerifierPool(reward) as pool:
        outcomes = pool.score([TASK] * 3, ["x", "yyyy", "x"])
    assert [o.reward for o in outcomes] == [1.0, -1.0, 1.0] and sorted(counting.seen) == ["x", "x", "yyyy"]
    assert all(not o.result.stats for o in outcomes)


def test_a_composite_with_a_group_term_scores_one_completion_as_a_group_of_one(judges):
    url = judges.url(lambda content: "Candidate 1: 4")
    reward = CompositeReward([RewardTerm("judge", GroupJudge(url, "judge", max_retries=0))])
    assert reward.scores_groups and reward(TASK, "x").reward == pytest.approx(0.4)
    assert PairwiseJudge(url, "judge")(TASK, "x").reward == 0.5  # no other sample to compare with


# --- config ----------------------------------------------------------------------------------------


def _judge_term(**judge) -> list[str]:
    fields = ", ".join(f"{k}: {v}" for k, v in {"base_url": "http://127.0.0.1:1/v1", "model": "m", **judge}.items())
    return [f"reward.terms=[{{name: j, judge: {{{fields}}}}}]"]


@pytest.mark.parametrize(("judge", "message"), [
    ({"mode": "group", "rubric": "'{prompt} {completion}'"}, r"judge.rubric: mode group needs \{completions\}"),
    ({"mode": "pairwise", "rubric": "'{completion_a}'"}, r"mode pairwise needs \{completion_b\}"),
    ({"rubric": "'{prompt}'"}, r"mode pointwise needs \{completion\}"),
    ({"mode": "ranked"}, "mode: allowed values"),
    ({"mode": "group", "swap": "false"}, "judge.swap does not apply to mode group"),
    ({"max_pairs": 4}, "judge.max_pairs does not apply to mode pointwise"),
    ({"mode": "pairwise", "score_pattern": "x"}, "judge.score_pattern does not apply to mode pairwise"),
    ({"mode": "pairwise", "max_pairs": 0}, "max_pairs: Input should be greater than or equal to 1"),
    ({"mode": "pairwise", "verdict_pattern": "'('"}, "verdict_pattern: not a regex"),
    ({"scale": "[10, 0]"}, "scale: must be"),
])
def test_bad_judge_config_is_a_config_error_naming_the_field(judge, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(None, _judge_term(**judge))
    assert "reward.terms.0.judge" in str(e.value)


def test_group_judges_are_refused_in_multi_turn_environments():
    with pytest.raises(ConfigError, match=r"reward.terms.0.judge.mode: a group judge .* env.name=calculator"):
        load_config(None, [*_judge_term(mode="group"), "env.name=calculator"])


def test_the_judge_config_builds_the_mode_with_its_defaults():
    cfg = load_config(None, _judge_term(mode="pairwise", max_pairs=3, swap="false", concurrency=2))
    judge = build_judge(cfg.reward.terms[0].judge)
    assert isinstance(judge, PairwiseJudge) and (judge.max_pairs, judge.swap, judge.concurrency) == (3, False, 2)
    assert "{completion_a}" in judge.rubric and judge.pattern.pattern == DEFAULT_VERDICT_PATTERN
    group = build_judge(load_config(None, _judge_term(mode="group", scale="[1, 5]")).reward.terms[0].judge)
    assert isinstance(group, GroupJudge) and group.scale == (1.0, 5.0) and "{completions}" in group.rubric
    point = build_judge(load_config(None, _judge_term()).reward.terms[0].judge)
    assert isinstance(point, LLMJudge) and "{completion}" in point.rubric
    with pytest.raises(ConfigError, match=r"mode group must contain \{completions\}"):
        GroupJudge("http://127.0.0.1:1/v1", "m", "{completion}")


# --- in the training loop ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_scores_groups_with_judges_and_logs_the_swap_consistency(judges, tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl
    from tests.test_docs_metrics import _undocumented

    def lengths(content: str) -> str:
        found = re.findall(r"^Candidate \d+:\n(.*?)(?=\n\nCandidate \d+:|\n\nReply with JSON)", content, re.M | re.S)
        return json.dumps({"scores": [min(len(c), 10) for c in found]})

    group, pairwise = judges.url(lengths), judges.url(lambda content: "Verdict: A")  # a position-biased judge
    terms = (f"reward.terms=[{{name: exact, verifier: exact_match, primary: true}}, "
             f"{{name: group, weight: 0.5, judge: {{mode: group, base_url: '{group}', model: j, max_retries: 0}}}}, "
             f"{{name: pw, weight: 0.5, judge: {{mode: pairwise, base_url: '{pairwise}', model: j, max_retries: 0}}}}]")
    result = train(load_config(None, [
        f"output_dir={tmp_path}", "train.steps=2", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0",
        "rollout.prompts_per_step=2", "rollout.group_size=3", "train.time_limit_s=0", "task.heldout_size=2",
        "log.report=false", terms]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2
    for m in rows:
        assert m["reward/judge/pw/swap_consistency"] == 0.0  # "A" both ways round: no pair agreed
        assert m["reward/term/pw"] == 0.5 and m["reward/errors/group"] == 0.0 and 0 < m["reward/term/group"] <= 1
    assert _undocumented(set(rows[0])) == set()
    group_calls = [len(re.findall(r"^Candidate \d+:", c, re.M)) for c in judges.calls(group)]
    assert group_calls.count(3) == 2 * 2  # one call per prompt and step, with its 3 samples
    assert len(judges.calls(pairwise)) >= 2 * 2 * 3 * 2  # 3 pairs per prompt, both orders
