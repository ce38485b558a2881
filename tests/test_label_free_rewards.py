"""Label-free and cheap rewards (reinforge/rewards/label_free.py, reinforge/rewards/bleu.py) against hand-computed
values: majority vote (TTRL), RESTRAIN's weights, TruthRL's ternary reward, RLCR's Brier reward, BLEU; and a
tiny run trained on the majority vote."""

import math
from pathlib import Path

import pytest

from reinforge.rewards import VERIFIERS
from reinforge.rewards.bleu import sentence_bleu, tokenize_13a
from reinforge.rewards.composite import CompositeReward, RewardTerm
from reinforge.rewards.label_free import (
    bleuberi_text,
    canonical_answer,
    majority,
    parse_confidence,
    restrain_rewards,
)
from reinforge.rewards.pool import VerifierPool
from reinforge.types import Task

E = math.e


def task(answer="", **meta):
    return Task("t", "q", answer, meta)


def group(name, t, completions):
    return VERIFIERS.get(name).score_group(t, completions)


# --- majority vote (TTRL) ------------------------------------------------------------------------


def test_majority_vote_rewards_agreement_with_the_groups_answer():
    results = group("majority_vote", task(gold_verifier="numeric_match"),
                    ["\\boxed{4}", "Answer: 4", "so 5", "it is 4.0"])
    assert [r.reward for r in results] == [1.0, 1.0, 0.0, 1.0]  # 4.0 votes as 4
    assert [r.answer for r in results] == ["4", "4", "5", "4"]


def test_a_tie_goes_to_the_answer_seen_first():
    assert [r.reward for r in group("majority_vote", task(), ["3", "5", "5", "3"])] == [1.0, 0.0, 0.0, 1.0]
    assert [r.reward for r in group("majority_vote", task(), ["5", "3", "3", "5"])] == [1.0, 0.0, 0.0, 1.0]
    assert majority(["b", None, "a", "a", "b"]) == ("b", {"b": 2, "a": 2})


def test_a_sample_without_an_answer_scores_0_and_does_not_vote():
    results = group("majority_vote", task(), ["no idea", "no idea", "7"])
    assert [r.reward for r in results] == [0.0, 0.0, 1.0] and results[0].answer is None
    assert [r.reward for r in group("majority_vote", task(), ["none", "nothing"])] == [0.0, 0.0]
    tagged = task(number_fallback=False)  # without the last-number fallback "7" is no answer
    assert [r.reward for r in group("majority_vote", tagged, ["7", "\\boxed{8}"])] == [0.0, 1.0]


def test_correct_reports_the_gold_answer_and_reward_only_the_vote():
    results = group("majority_vote", task("5", gold_verifier="numeric_match"), ["4", "4", "5"])
    assert [r.reward for r in results] == [1.0, 1.0, 0.0]
    assert [r.correct for r in results] == [False, False, True]
    assert not any(r.correct for r in group("majority_vote", task("", gold_verifier="numeric_match"), ["5", "5"]))


def test_one_completion_is_its_own_majority():
    assert VERIFIERS.get("majority_vote")(task("1", gold_verifier="numeric_match"), "2").reward == 1.0


def test_canonical_answers():
    assert canonical_answer(" 0.50 ") == canonical_answer("1/2") == "1/2"
    assert canonical_answer("-3.0") == "-3" and canonical_answer("x = 2") == "x=2"
    assert canonical_answer("1/0") == "1/0"


def test_the_vote_reaches_the_group_through_a_composite_and_the_pool():
    composite = CompositeReward([RewardTerm("vote", "majority_vote", params={"gold_verifier": "numeric_match"})])
    assert composite.scores_groups
    assert [r.reward for r in composite.score_group(task("4"), ["4", "5", "4"])] == [1.0, 0.0, 1.0]
    a, b = Task("a", "q", "4", {"gold_verifier": "numeric_match"}), Task("b", "q", "9", {"gold_verifier": "numeric_match"})
    with VerifierPool(VERIFIERS.get("majority_vote"), workers=1, kind="thread") as pool:
        outcomes = pool.score([a, b, a, b, a], ["4", "9", "5", "8", "5"])  # a: 5 wins 2-1; b: tie, 9 first
    assert [o.reward for o in outcomes] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert [o.result.correct for o in outcomes] == [True, True, False, False, False]


# --- RESTRAIN -------------------------------------------------------------------------------------


def test_restrain_weights_each_answer_by_its_shaped_frequency():
    # f = 3/4 and 1/4, g(f) = exp(-(f - 1)^2 / 0.5): the ratio of the two is exp(1.125 - 0.125) = e
    assert restrain_rewards(["1", "1", "1", "2"], sigma=0.5, center=1.0, kappa=2) == pytest.approx(
        [E / (1 + E)] * 3 + [1 / (1 + E)])
    results = group("restrain_vote", task("2", gold_verifier="numeric_match"), ["1", "1", "1", "2"])
    assert [r.reward for r in results] == pytest.approx([E / (1 + E)] * 3 + [1 / (1 + E)])
    assert [r.correct for r in results] == [False, False, False, True]


def test_restrain_penalises_a_low_consistency_group():
    assert restrain_rewards(["1", "2", "3", "4"], 0.5, 1.0, kappa=2) == [0.0] * 4
    assert restrain_rewards(["1", "1", "3", "4"], 0.5, 1.0, kappa=3) == [0.0] * 4
    assert restrain_rewards([None, None], 0.5, 1.0, kappa=0) == [0.0, 0.0]
    ones = [0.25] * 4  # kappa 0: four distinct answers share the weight
    assert restrain_rewards(["1", "2", "3", "4"], 0.5, 1.0, kappa=0) == pytest.approx(ones)


def test_restrain_prompt_weight_and_unanswered_samples():
    u = math.exp(-0.25 / 0.5)  # g(0.5) with center 1, sigma 0.5
    assert restrain_rewards(["1", "1"], 0.5, 1.0, 2, reference_majority=0.5) == pytest.approx([u, u])
    assert restrain_rewards(["1", "1", None], 0.5, 1.0, 2) == [1.0, 1.0, 0.0]
    meta = dict(restrain_sigma=0.5, restrain_kappa=2, reference_majority=0.5, gold_verifier="numeric_match")
    assert [r.reward for r in group("restrain_vote", task(**meta), ["1", "1"])] == pytest.approx([u, u])


@pytest.mark.parametrize("bad", [{"restrain_sigma": 0}, {"restrain_center": 1.5}, {"restrain_kappa": -1},
                                 {"reference_majority": 2}])
def test_restrain_rejects_bad_options(bad):
    with pytest.raises(ValueError):
        group("restrain_vote", task(**bad), ["1"])


# --- TruthRL --------------------------------------------------------------------------------------


def truthrl(completion, answer="Paris", **meta):
    return VERIFIERS.get("truthrl_ternary")(task(answer, **meta), completion)


def test_truthrl_ternary_reward():
    assert (truthrl("\\boxed{Paris}").reward, truthrl("\\boxed{Paris}").correct) == (1.0, True)
    assert truthrl("\\boxed{The Paris.}").reward == 1.0  # normalised: articles and punctuation go
    assert truthrl("\\boxed{London}").reward == -1.0
    idk = truthrl("\\boxed{I don't know}")
    assert (idk.reward, idk.correct) == (0.0, False)
    assert truthrl("\\boxed{Honestly, I dont know.}").reward == 0.0
    assert truthrl("\\boxed{Paris, France}", answers=["Paris, France"]).reward == 1.0


def test_truthrl_without_an_answer_and_the_abstention_scope():
    assert truthrl("I don't know.").reward == -1.0  # no extracted answer: as the paper's code, a miss is -1
    assert truthrl("I don't know.", abstain_scope="completion").reward == 0.0
    assert truthrl("Paris, I think", abstain_scope="completion").reward == -1.0
    with pytest.raises(ValueError, match="abstain_scope"):
        truthrl("x", abstain_scope="everywhere")


def test_truthrl_phrases_and_rewards_are_configurable():
    assert truthrl("\\boxed{It cannot be determined}", abstain_phrases=["cannot be determined"]).reward == 0.0
    assert truthrl("\\boxed{I don't know}", abstain_phrases="cannot be determined").reward == -1.0
    assert truthrl("\\boxed{I don't know}", abstain_reward=-1.0).reward == -1.0  # the binary baseline


def test_truthrl_out_of_knowledge_tasks_reward_abstaining():
    assert truthrl("\\boxed{I don't know}", out_of_knowledge=True).reward == 1.0
    assert truthrl("\\boxed{Paris}", out_of_knowledge=True).reward == -1.0
    assert truthrl("no box at all", out_of_knowledge=True).reward == -1.0


def test_truthrl_can_judge_with_a_named_verifier():
    assert truthrl("\\boxed{0.5}", answer="1/2", gold_verifier="numeric_match").reward == 1.0
    assert truthrl("\\boxed{0.5}", answer="1/2").reward == -1.0  # exact match after normalisation only


# --- RLCR -----------------------------------------------------------------------------------------


def rlcr(completion, answer="4", **meta):
    return VERIFIERS.get("rlcr_brier")(task(answer, **meta), completion)


def test_rlcr_brier_reward():
    pytest.importorskip("math_verify")
    right = rlcr("<think>2+2</think><answer>4</answer><confidence>0.8</confidence>")
    assert (right.reward, right.correct) == (pytest.approx(1 - 0.2 ** 2), True)
    wrong = rlcr("<answer>5</answer><confidence>0.3</confidence>")
    assert (wrong.reward, wrong.correct) == (pytest.approx(-0.3 ** 2), False)
    assert rlcr("<answer>4</answer><confidence>1</confidence>").reward == 1.0
    assert rlcr("<answer>5</answer><confidence>1.0</confidence>").reward == -1.0
    assert rlcr("<answer>4</answer><conf>0.5</conf>", confidence_tag="conf").reward == pytest.approx(0.75)


def test_rlcr_unreadable_confidence_is_the_minimum():
    pytest.importorskip("math_verify")
    for bad in ("<answer>4</answer>", "<answer>4</answer><confidence>high</confidence>",
                "<answer>4</answer><confidence>1.5</confidence>", "<answer>4</answer><confidence>nan</confidence>"):
        result = rlcr(bad)
        assert (result.reward, result.correct) == (-1.0, True), bad


def test_parse_confidence():
    assert parse_confidence("<confidence>0.2</confidence> then <confidence> 0.6 </confidence>") == 0.6
    assert parse_confidence("<confidence>-0.1</confidence>") is None
    assert parse_confidence("nothing") is None
    with pytest.raises(ValueError, match="tag name"):
        parse_confidence("x", "a>b")


# --- BLEU (BLEUBERI) ------------------------------------------------------------------------------


def test_13a_tokens():
    assert tokenize_13a("Hello, world.") == ("Hello", ",", "world", ".")
    assert tokenize_13a("3.14 and 1,000") == ("3.14", "and", "1,000")
    assert tokenize_13a("a-b 5-3") == ("a-b", "5", "-", "3")
    assert tokenize_13a("$5 (x) &amp;") == ("$", "5", "(", "x", ")", "&")


def test_sentence_bleu_by_hand():
    # matches / possible: 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3; add-one: 6/7, 4/6, 2/5, 1/4
    assert sentence_bleu("the cat sat on the mat", ["the cat is on the mat"]) == pytest.approx(
        (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25)
    assert sentence_bleu("the cat sat on the mat", ["the cat is on the mat"], smooth=False) == 0.0
    assert sentence_bleu("the cat", ["the cat sat on the mat"]) == pytest.approx(math.exp(1 - 6 / 2))  # brevity
    assert sentence_bleu("foo", ["bar baz"]) == pytest.approx(0.5 ** 0.25 * math.exp(1 - 2))  # no overlap, smoothed
    assert sentence_bleu("the cat sat", ["the cat sat"]) == 1.0
    # two references: counts clipped by the larger, length the shortest (2): every precision 1, no penalty
    assert sentence_bleu("the cat", ["the cat sat", "the dog"]) == 1.0
    assert sentence_bleu("", ["x"]) == 0.0
    with pytest.raises(ValueError):
        sentence_bleu("x", [])


def test_bleu_verifier():
    bleu = VERIFIERS.get("bleu")
    result = bleu(task("the cat is on the mat"), "<think>hmm</think><answer> the cat sat on the mat </answer>")
    assert result.reward == pytest.approx((6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25)
    assert result.answer == "the cat sat on the mat" and not result.correct
    exact = bleu(task("x", references=["the cat sat"]), "the cat sat")
    assert (exact.reward, exact.correct) == (1.0, True)
    assert bleu(task("x"), "<answer>  </answer>").reward == 0.0
    assert bleuberi_text("a <answer> b") == "b"
    with pytest.raises(ValueError, match="reference"):
        bleu(task(""), "x")


def test_every_label_free_verifier_is_documented():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text()
    section = docs.split("## Label-free and cheap rewards", 1)[1].split("\n## ", 1)[0]
    for name in ("majority_vote", "restrain_vote", "truthrl_ternary", "rlcr_brier", "bleu"):
        entry = next(e for e in VERIFIERS.entries() if e.name == name)
        assert f"`{name}`" in section and f"`{entry.formula}`" in section, name


# --- a tiny run on the vote -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_trains_on_the_majority_vote(tmp_path):
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    terms = "reward.terms=[{name: vote, verifier: majority_vote, params: {gold_verifier: numeric_match}}]"
    result = train(load_config(None, [
        f"output_dir={tmp_path}", "name=vote", "train.steps=2", "eval.every=0", "eval.final_samples=0",
        "checkpoint.every=0", "rollout.prompts_per_step=4", "rollout.group_size=4", "train.time_limit_s=0",
        "task.heldout_size=8", "log.report=false", terms, "reward.pool=thread"]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2 and all(0 <= m["reward/term/vote"] <= 1 and "reward/accuracy" in m for m in rows)
    # each group has a majority answer (samples without one score 0), so some sample earns 1 every step
    assert all(m["reward/mean"] > 0 for m in rows)
