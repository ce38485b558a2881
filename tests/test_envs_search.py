"""The Search-R1-style search environment: a seeded fictional corpus, BM25 retrieval, exact-match answers;
its task source, registry entry and recipe."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import bm25s
import pytest

from reinforge.config import load_config
from reinforge.data.agent_tasks import AGENT_TASK_SOURCES
from reinforge.data.search_corpus import RELATIONS, Country, corpus, passage, search_splits
from reinforge.envs.registry import ENVIRONMENTS, EnvironmentConfigError, build_environment, check_task_kind
from reinforge.envs.search import SearchEnv, SearchIndex, final_answer, normalize_answer, search_index
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Task


def call(query: str, name: str = "search") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"query": query}}) + "</tool_call>"


def say(env: SearchEnv, content: str):
    return env.step({"role": "assistant", "content": content})


def value_in(passages: str, relation: str, country: str) -> str:
    """What the passage about ``relation`` of ``country`` says, read from a search result."""
    (line,) = [p for p in passages.split("\n") if p.startswith(f"The {relation} of {country} is ")]
    return line.rstrip(".").removeprefix(f"The {relation} of {country} is ").removeprefix("the ")


def perfect_episode(env: SearchEnv, task: Task) -> float:
    """A scripted policy: search the question (through the leader first for two hops), read, answer."""
    env.reset(task)
    relation, question = task.metadata["relation"], task.prompt[0]["content"].rstrip("?")
    country = task.metadata["country"]
    if task.metadata["hops"] == 2:
        leader = question.removeprefix(f"{relation} of the land led by ")
        found = say(env, call(question)).observation[0]["content"]
        country = next(re.match(r"The leader of (.+) is ", p)[1] for p in found.split("\n") if p.endswith(f" is {leader}."))
        question = f"{relation} of {country}"
    result = say(env, call(question))
    assert not result.done and result.observation[0]["name"] == "search"
    end = say(env, value_in(result.observation[0]["content"], relation, country))
    assert end.done and end.info["correct"] == (end.reward == 1.0)
    return end.reward


@pytest.fixture(scope="module")
def splits():
    return search_splits(heldout_size=100)


def test_the_corpus_is_deterministic_in_its_seed_and_unambiguous():
    countries, passages = corpus.__wrapped__(200, 0)  # built afresh, not from the cache
    assert (countries, passages) == corpus(200, 0) and corpus.__wrapped__(200, 1) != corpus(200, 0)
    assert corpus.__wrapped__(50, 0)[0] == countries[:50]  # a larger corpus extends a smaller one of the same seed
    assert len(passages) == 600 and passages[:3] == tuple(passage(countries[0], r) for r in RELATIONS)
    names = [n for c in countries for n in (c.name, c.capital, c.leader, c.currency)]
    assert len(set(names)) == len(names) == 800  # every name is one entity
    words = {w.strip(".") for p in passages for w in p.split()}
    assert words == set(names) | {"The", "capital", "leader", "currency", "of", "is", "the"}
    with pytest.raises(ValueError, match="countries must be an integer in 2..2000"):
        corpus(1, 0)


def test_passages_are_hand_written_sentences():
    country = Country("Zorvia", "Qelmu", "Tarok", "Vobel")
    assert [passage(country, r) for r in RELATIONS] == [
        "The capital of Zorvia is Qelmu.", "The leader of Zorvia is Tarok.", "The currency of Zorvia is the Vobel."]


def test_the_questions_do_not_contain_their_answers(splits):
    for hops in (1, 2):
        tasks = [*search_splits(hops=hops).train, *search_splits(hops=hops).heldout]
        assert len(tasks) == 200 * (3 if hops == 1 else 2)
        for t in tasks:
            assert t.answer.lower() not in t.prompt[0]["content"].lower()
    assert splits.heldout[0].prompt[0]["content"] == f"{splits.heldout[0].metadata['relation']} of " \
        f"{splits.heldout[0].metadata['country']}?"
    assert {t.id for t in splits.heldout}.isdisjoint(t.id for t in splits.train)
    assert AGENT_TASK_SOURCES["search"] is search_splits
    with pytest.raises(ValueError, match="hops must be 1 or 2"):
        search_splits(hops=3)
    with pytest.raises(ValueError, match="relations must be distinct names"):
        search_splits(relations="capital,motto")


@pytest.mark.parametrize("k", [1, 2])
def test_retrieval_finds_the_passage_of_every_question_in_the_first_k(k):
    countries, passages = corpus(200, 0)
    index = search_index(200, 0)
    for c in countries:
        for r in RELATIONS:
            assert passage(c, r) in index.search(f"{r} of {c.name}", k), (r, c.name)
        # the first hop of a two-hop question: the question itself finds the leader's passage
        assert passage(c, "leader") in index.search(f"capital of the land led by {c.leader}", k)


def test_search_results_are_ordered_and_exclude_unrelated_passages():
    index = SearchIndex(("The capital of Zorvia is Qelmu.", "The capital of Brandu is Tosk.", "Zorvia has rivers."))
    # all three words, then two of them in a 6-word passage, then one in a 3-word passage (each word is in 2 of 3)
    assert index.search("capital of Zorvia", 3) == [
        "The capital of Zorvia is Qelmu.", "The capital of Brandu is Tosk.", "Zorvia has rivers."]
    assert index.search("Tosk", 3) == ["The capital of Brandu is Tosk."]  # others share no word: left out
    assert index.search("nothing here", 3) == [] and index.search("?!", 3) == []


def test_a_perfect_policy_answers_every_heldout_question(splits):
    env = SearchEnv(k=2)
    assert [perfect_episode(env, t) for t in splits.heldout] == [1.0] * 100
    two_hop = search_splits(hops=2, heldout_size=40).heldout
    assert [perfect_episode(SearchEnv(k=2, max_tool_calls=2), t) for t in two_hop] == [1.0] * 40


def test_exact_match_after_normalisation(splits):
    assert normalize_answer("  The Qelmu. ") == "qelmu" and normalize_answer("an  A-B!") == "ab"
    assert final_answer("I think <answer>Qelmu</answer>") == "Qelmu" and final_answer("Qelmu") == "Qelmu"
    task = splits.heldout[0]
    env = SearchEnv()
    for text, reward in [(task.answer, 1.0), (f"{task.answer.upper()}.", 1.0), (f"<answer> {task.answer} </answer>", 1.0),
                         (f"the answer is {task.answer}", 0.0), ("no idea", 0.0), ("", 0.0)]:
        env.reset(task)
        assert say(env, text).reward == reward, text


def test_bad_calls_are_error_results_and_the_limit_holds(splits):
    env = SearchEnv(max_tool_calls=4, max_query_chars=20)
    env.reset(splits.heldout[0])
    result = say(env, call("x" * 21) + call("", name="lookup") + '<tool_call>{"name": "search"}</tool_call>'
                 + call("zzzz qqqq"))
    assert [m["content"] for m in result.observation] == [
        "error: query too long (21 > 20 chars)", "error: unknown tool 'lookup'; available: search",
        "error: bad arguments for search: missing required argument 'query'", "no results"]
    assert result.info == {"tool_calls": 4, "tool_errors": 3} and not result.done
    end = say(env, call("capital"))
    assert end.done and end.reward == 0.0 and end.info["reason"] == "too many tool calls: 5 > max_tool_calls=4"
    with pytest.raises(RuntimeError, match="reset"):
        say(env, "x")
    with pytest.raises(ValueError, match="needs a task from search_splits"):
        SearchEnv().reset(Task("t", "capital of Zorvia?", "Qelmu"))


def test_episodes_in_threads_are_independent(splits):
    tasks = list(splits.heldout[:32])
    with ThreadPoolExecutor(8) as pool:
        rewards = list(pool.map(lambda t: perfect_episode(SearchEnv(k=2), t), tasks))
        queries = [f"{t.metadata['relation']} of {t.metadata['country']}" for t in tasks]
        found = list(pool.map(lambda q: search_index(200, 0).search(q, 3), queries))
    assert rewards == [1.0] * 32 and found == [search_index(200, 0).search(q, 3) for q in queries]


def test_the_registry_entry_checks_its_parameters():
    assert ENVIRONMENTS["search"].params == {"k": 3, "max_tool_calls": 3, "max_query_chars": 200}
    assert build_environment("search", None, None, {"k": 5})().k == 5
    with pytest.raises(EnvironmentConfigError, match="k must be an integer >= 1"):
        build_environment("search", None, None, {"k": 0})
    check_task_kind("search", "search")
    with pytest.raises(EnvironmentConfigError, match="needs task.kind in search"):
        check_task_kind("search", "calculator")


@pytest.mark.slow
def test_the_recipe_loads_and_trains_a_step(tmp_path):
    cfg = load_config("agent_search", [f"output_dir={tmp_path}", "train.steps=1", "eval.every=0", "eval.final_samples=0",
                                       "rollout.prompts_per_step=2", "rollout.group_size=2", "task.heldout_size=4",
                                       "train.time_limit_s=0", "log.report=false"])
    assert cfg.task.kind == "search" and cfg.env.name == "search" and cfg.env.params == {"k": 2, "max_tool_calls": 2}
    result = train(cfg)
    (row,) = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert 0.0 <= row["reward/mean"] <= 1.0 and row["episode/turns_mean"] >= 1


# ---------------------------------------------------------------- names="digits": countries named by a 4-digit id


def test_digit_names_keep_the_values_and_name_each_country_by_a_distinct_id():
    (first, second), passages = corpus(2, 0, "digits")
    # the same invented values as the syllable corpus of the same seed, only the country's name differs
    assert corpus(2, 0)[0][0] == Country("Traiquil", "Veonquar", "Rairges", "Quirtrin")
    assert first == Country("land 6608", "Veonquar", "Rairges", "Quirtrin")
    assert second == Country("land 2725", "Ladimda", "Mifak", "Sekzis")
    assert passages == ("The capital of land 6608 is Veonquar.", "The leader of land 6608 is Rairges.",
                        "The currency of land 6608 is the Quirtrin.", "The capital of land 2725 is Ladimda.",
                        "The leader of land 2725 is Mifak.", "The currency of land 2725 is the Sekzis.")
    countries, _ = corpus(2000, 3, "digits")
    ids = [c.name.removeprefix("land ") for c in countries]
    assert len(set(ids)) == 2000 and all(len(i) == 4 and i.isdigit() and i[0] != "0" for i in ids)
    assert [c.capital for c in countries] == [c.capital for c in corpus(2000, 3)[0]]
    with pytest.raises(ValueError, match="names must be one of syllables, digits, ids"):
        corpus(2, 0, "letters")
    with pytest.raises(ValueError, match="names must be one of syllables, digits, ids"):
        search_splits(names="numbers")


def test_bm25_keeps_a_digit_id_as_one_word_and_finds_its_passage():
    # bm25s's tokenizer keeps words of 2+ word characters: "4821" is one token, "?" and "x" are dropped
    assert bm25s.tokenize(["capital of land 4821?", "x 7 4821"], stopwords=None, show_progress=False,
                          return_ids=False) == [["capital", "of", "land", "4821"], ["4821"]]
    p1, p2, p3, p4 = ("The capital of land 4821 is Qelmu.", "The capital of land 4812 is Tosk.",
                      "The leader of land 4821 is Tarok.", "The capital of land 9999 is Brandu.")
    index = SearchIndex((p1, p2, p3, p4))
    # all passages have 7 words (same length normalisation); Lucene idf = ln(1 + (N - df + .5) / (df + .5)), N = 4:
    # "4821" df 2 -> ln 2 = 0.693, "capital" df 3 -> ln(1 + 1.5/3.5) = 0.357, "of"/"land" df 4 -> 0.105 each.
    # p1 has all four query words; p3 has the id (0.693 + 0.21) and beats p2, p4 with "capital" (0.357 + 0.21)
    assert index.search("capital of land 4821", 2) == [p1, p3]
    assert set(index.search("4821", 4)) == {p1, p3}  # a tie (same words, same length): the order is not asserted
    assert index.search("4812", 4) == [p2] and index.search("482", 4) == []  # whole ids only: no partial match


def test_digit_questions_are_found_first_and_a_perfect_policy_answers_them():
    splits = search_splits(names="digits", heldout_size=100)
    task = splits.heldout[0]
    assert task.prompt[0]["content"] == f"{task.metadata['relation']} of {task.metadata['country']}?"
    assert task.metadata["names"] == "digits" and task.metadata["country"].startswith("land ")
    assert task.id == f"search-1hop-{task.metadata['relation']}-{task.metadata['country'].replace(' ', '-')}"
    countries, _ = corpus(200, 0, "digits")
    index = search_index(200, 0, "digits")
    assert index is not search_index(200, 0)
    for c in countries:
        for r in RELATIONS:
            assert index.search(f"{r} of {c.name}", 1) == [passage(c, r)], (r, c.name)
        assert passage(c, "leader") in index.search(f"capital of the land led by {c.leader}", 2)
    env = SearchEnv(k=2)
    assert [perfect_episode(env, t) for t in splits.heldout] == [1.0] * 100
    two_hop = search_splits(names="digits", hops=2, heldout_size=40).heldout
    assert two_hop[0].prompt[0]["content"].startswith(("capital of the land led by ", "currency of the land led by "))
    assert [perfect_episode(SearchEnv(k=2, max_tool_calls=2), t) for t in two_hop] == [1.0] * 40
    # the environment reads the corpus style from the task: the syllable index has no digit ids
    env.reset(task)
    query = f"{task.metadata['relation']} of {task.metadata['country']}"
    assert say(env, call(query)).observation[0]["content"].split("\n")[0] == passage(
        next(c for c in countries if c.name == task.metadata["country"]), task.metadata["relation"])


def test_id_names_name_every_entity_by_a_distinct_id_and_stay_searchable():
    (first, second), passages = corpus(2, 0, "ids")
    assert (first, second) == (Country("land 9493", "city 6789", "chief 5686", "coin 6077"),
                               Country("land 5738", "city 7602", "chief 9276", "coin 5853"))
    assert passages[:3] == ("The capital of land 9493 is city 6789.", "The leader of land 9493 is chief 5686.",
                            "The currency of land 9493 is the coin 6077.")
    countries, _ = corpus(2000, 0, "ids")  # 8000 distinct ids out of 1000-9999
    ids = [n.split()[1] for c in countries for n in (c.name, c.capital, c.leader, c.currency)]
    assert len(set(ids)) == 8000
    splits = search_splits(names="ids", heldout_size=100)
    task = splits.heldout[0]
    relation, country = task.metadata["relation"], task.metadata["country"]
    assert task.prompt[0]["content"] == f"{relation} of {country}?"
    assert task.answer == getattr(next(c for c in corpus(200, 0, "ids")[0] if c.name == country), relation)
    assert task.answer.split()[0] == {"capital": "city", "leader": "chief", "currency": "coin"}[relation]
    index = search_index(200, 0, "ids")
    for c in corpus(200, 0, "ids")[0]:
        for r in RELATIONS:
            assert index.search(f"{r} of {c.name}", 1) == [passage(c, r)], (r, c.name)
    env = SearchEnv(k=2)
    assert [perfect_episode(env, t) for t in splits.heldout] == [1.0] * 100
    two_hop = search_splits(names="ids", hops=2, heldout_size=40).heldout  # "capital of the land led by chief 5686?"
    assert [perfect_episode(SearchEnv(k=2, max_tool_calls=2), t) for t in two_hop] == [1.0] * 40


def test_value_first_layout_reorders_the_passages_only():
    (first, _), passages = corpus(2, 0, "ids", "value_first")
    assert first == corpus(2, 0, "ids")[0][0]  # the same facts as the default layout
    assert passages[:3] == ("city 6789 is the capital of land 9493.", "chief 5686 is the leader of land 9493.",
                            "coin 6077 is the currency of land 9493.")
    assert passage(Country("Zorvia", "Qelmu", "Tarok", "Vobel"), "currency", "value_first") == "Vobel is the currency of Zorvia."
    splits = search_splits(names="ids", layout="value_first", heldout_size=100)
    assert [t.answer for t in splits.heldout] == [t.answer for t in search_splits(names="ids", heldout_size=100).heldout]
    env = SearchEnv(k=2)
    for task in splits.heldout:  # the passage asked about comes first and opens with the answer
        env.reset(task)
        top = env.search(task.prompt[0]["content"].rstrip("?")).split("\n")[0]
        assert top == f"{task.answer} is the {task.metadata['relation']} of {task.metadata['country']}.", task.id
    with pytest.raises(ValueError, match="layout must be one of value_last, value_first"):
        search_splits(layout="sideways")
