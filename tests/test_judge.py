"""LLM-as-judge: the rubric, the score parser, the failure path, and a judge served by `reinforge serve` on loopback."""

from __future__ import annotations

import pickle
import re
import socket

import pytest

from reinforge.errors import ConfigError, ReinforgeError
from reinforge.rewards.composite import CompositeReward, RewardTerm, term_metrics
from reinforge.rewards.judge import JudgeError, LLMJudge, parse_score, render_rubric
from reinforge.types import Task

MODEL = "tiny-base"
DIGIT = r"(\d)"  # the tiny model writes digits only: grade by the last digit it writes, on a 0-9 scale


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- rubric and parser (no server) -------------------------------------------------------------


def test_render_rubric_fills_only_the_three_placeholders_in_one_pass():
    task = Task("t", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}], "4")
    text = render_rubric('Q: {prompt}\nA: {completion}\nRef: {answer}\nReply {"score": N} {other}', task, "{answer}")
    assert text == 'Q: system: be brief\nuser: 2+2?\nA: {answer}\nRef: 4\nReply {"score": N} {other}'


@pytest.mark.parametrize(("text", "expected"), [
    ("Score: 7", (7.0, 0.7)),
    ("The essay is fine. rating=8.5", (8.5, 0.85)),
    ("score 2 at first... final SCORE: 10", (10.0, 1.0)),  # the last match counts, case-insensitive
    ("Score: 0", (0.0, 0.0)),
])
def test_parse_score(text, expected):
    assert parse_score(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "message"), [
    ("I cannot grade this.", "no score"),
    ("Score: 11", "outside the scale"),
    ("", "no score"),
])
def test_parse_score_failures_carry_the_raw_text(text, message):
    with pytest.raises(JudgeError, match=message) as e:
        parse_score(text)
    assert isinstance(e.value, ReinforgeError) and repr(text) in str(e.value)


def test_parse_score_custom_pattern_scale_and_truncated_text():
    assert parse_score("B: 3 of 5", r"(\d) of 5", (1, 5)) == (3.0, 0.5)
    assert parse_score("9", r"\d", (0, 9)) == (9.0, 1.0)  # no group: the whole match
    with pytest.raises(JudgeError) as e:
        parse_score("x" * 5000)
    assert len(str(e.value)) < 700


def test_bad_judge_config_fails_early():
    with pytest.raises(ConfigError, match=r"\{completion\}"):
        LLMJudge("http://127.0.0.1:1/v1", MODEL, "Rate {prompt}")
    with pytest.raises(ConfigError, match="scale"):
        LLMJudge("http://127.0.0.1:1/v1", MODEL, "{completion}", scale=(10, 0))
    with pytest.raises(ConfigError, match="score_pattern"):
        LLMJudge("http://127.0.0.1:1/v1", MODEL, "{completion}", score_pattern="(")


def test_server_down_is_a_judge_error():
    judge = LLMJudge(f"http://127.0.0.1:{_free_port()}/v1", MODEL, "{completion}", max_retries=0, timeout_s=5)
    with pytest.raises(JudgeError, match=r"failed on task 't1': APIConnectionError"):
        judge(Task("t1", "p", "a"), "c")


# --- against `reinforge serve` on loopback -----------------------------------------------------


@pytest.fixture(scope="module")
def server_url():
    pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    from reinforge.orchestrate.agent_episodes import BackgroundServer
    from reinforge.serve.launch import build_server_app

    app = build_server_app(MODEL, seed=0)
    with BackgroundServer(app, log_level="error") as url:
        yield f"{url}/v1"


def _judge(url: str, **kwargs) -> LLMJudge:
    options = dict(score_pattern=DIGIT, scale=(0, 9), max_tokens=4, temperature=0.0, max_retries=0, timeout_s=30)
    return LLMJudge(url, MODEL, "{prompt}{completion}", **(options | kwargs))


TASKS = [Task("a", "12+3", "15"), Task("b", "40+41", "81"), Task("c", "7+8", "15")]


def test_judge_score_is_the_parsed_greedy_reply_of_the_server(server_url):
    import openai

    client = openai.OpenAI(base_url=server_url, api_key="EMPTY", max_retries=0)
    judge = _judge(server_url)
    scores = []
    for task in TASKS:
        result = judge(task, "=")
        reply = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0.0, messages=[
            {"role": "user", "content": f"{task.prompt}="}]).choices[0].message.content
        digits = re.findall(r"\d", reply)
        assert digits, reply  # the tiny model answers an addition with digits
        assert result.judge_text == reply
        assert result.raw_score == float(digits[-1]) and result.reward == pytest.approx(int(digits[-1]) / 9)
        assert result.correct == (result.reward > 0.5)
        scores.append(result.reward)
    assert len(set(scores)) > 1  # different prompts, different grades: the reply is really parsed


def test_unparseable_reply_and_unknown_model_are_judge_errors(server_url):
    with pytest.raises(JudgeError, match=r"no score in the judge's reply .*: '\d"):
        _judge(server_url, score_pattern=r"score: (\d)")(TASKS[0], "=")
    with pytest.raises(JudgeError, match="NotFoundError"):
        LLMJudge(server_url, "no-such-model", "{completion}", max_retries=0)(TASKS[0], "=")


def test_judge_in_a_composite_with_the_zero_policy(server_url):
    good = _judge(server_url)
    bad = pickle.loads(pickle.dumps(_judge(server_url, score_pattern="never")))  # pickles (client rebuilt)
    reward = CompositeReward([RewardTerm("judge", good, 2.0), RewardTerm("strict", bad, 1.0)], on_error="zero")
    result = reward(TASKS[1], "=")
    assert result.reward == pytest.approx(2.0 * good(TASKS[1], "=").reward)
    assert "no score" in result.errors["strict"]
    assert term_metrics([result])["reward/errors/strict"] == 1.0


def test_group_and_pairwise_judges_through_the_server_turn_garbage_replies_into_counted_zeros(server_url):
    """A local model behind `reinforge serve` answers the group and pairwise judges' requests; the tiny
    arithmetic model's replies hold no scores or verdicts, so each is a JudgeError that on_error=zero
    scores 0 for the whole group and counts."""
    import openai

    from reinforge.rewards.judge_group import GroupJudge, PairwiseJudge
    from reinforge.rewards.pool import VerifierPool

    options = dict(max_tokens=4, temperature=0.0, max_retries=0, timeout_s=30)
    group = GroupJudge(server_url, MODEL, "{prompt}{completions}", **options)
    pairwise = PairwiseJudge(server_url, MODEL, "{completion_a}+{completion_b}=", swap=False, **options)
    client = openai.OpenAI(base_url=server_url, api_key="EMPTY", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0.0, messages=[
        {"role": "user", "content": "12+3Candidate 1:\n15\n\nCandidate 2:\n14"}]).choices[0].message.content
    with pytest.raises(JudgeError, match=re.escape(f"no scores in the judge's reply: {reply!r}")):
        group.score_group(TASKS[0], ["15", "14"])  # the server's own reply reached the parser
    with pytest.raises(JudgeError, match=r"no verdict in the judge's reply .*: '\d"):
        pairwise.score_group(TASKS[0], ["15", "14"])
    reward = CompositeReward([RewardTerm("exact", "exact_match", primary=True), RewardTerm("group", group),
                              RewardTerm("pairwise", pairwise)], on_error="zero")
    with VerifierPool(reward, on_error="zero") as pool:
        outcomes = pool.score([TASKS[0]] * 2, ["15", "14"])
    assert [(o.status, o.reward) for o in outcomes] == [("ok", 1.0), ("ok", 0.0)]
    assert all(set(o.result.errors) == {"group", "pairwise"} for o in outcomes)
    assert reward.error_counts == {"exact": 0, "group": 2, "pairwise": 2}
