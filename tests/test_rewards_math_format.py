"""Math verifiers (extraction, math-verify equivalence, regex, multiple choice) and the think/answer format reward."""

from __future__ import annotations

import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reinforge.rewards import math as rmath
from reinforge.rewards.format import think_answer_format
from reinforge.rewards.math import extract_answer, extract_choice, last_boxed, multiple_choice, regex_match
from reinforge.rewards.verifiers import VERIFIERS
from reinforge.types import Task


def task(answer: str, **metadata) -> Task:
    return Task("t1", "q", answer, metadata)


# --- extraction ---------------------------------------------------------------------------------


def test_last_boxed_balances_nested_braces_and_skips_unclosed():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{\sqrt{3}}{2}} done") == r"\frac{\sqrt{3}}{2}"
    assert last_boxed(r"\boxed{7} and a truncated \boxed{\frac{1}{") == "7"
    assert last_boxed("no box") is None


@pytest.mark.parametrize(("text", "expected"), [
    (r"so \boxed{\frac{1}{2}}, not <answer>3</answer>", r"\frac{1}{2}"),  # boxed beats tags
    ("<answer> 42 </answer> answer: 5", "42"),  # the tag beats the label
    ("**Answer:** $3/4$.", "3/4"),  # markdown, $...$ and a trailing period stripped
    ("Final answer:\n\n  17\nthanks 9", "17"),  # the label's answer on the next line
    ("we get 3, then 1,234,567 apples", "1234567"),  # the last number, commas removed
    ("x = -2.5.", "-2.5"),
    ("no digits here", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_without_number_fallback():
    assert extract_answer("it is 12", number_fallback=False) is None


# --- math-verify --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def math_verify_match():
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'reinforge[math]')")
    return rmath.math_verify_match


@pytest.mark.parametrize(("gold", "completion", "ok"), [
    ("1/2", r"so \boxed{0.5}", True),
    (r"\frac{1}{2}", "Answer: 1/2", True),
    (r"\pi/2", r"\boxed{\frac{\pi}{2}}", True),
    ("x^2+1", r"\boxed{1 + x^2}", True),
    (r"50\%", r"\boxed{0.5}", True),
    ("(1,2]", r"\boxed{(1, 2]}", True),
    ("1000", "The answer is 1,000.", True),
    ("42", r"\boxed{42\text{ apples}}", True),
    ("3", r"\boxed{x = 3}", True),
    ("2", r"\boxed{3}", False),
    (r"\frac{1}{3}", r"\boxed{0.33}", False),
    ("(1,2]", r"\boxed{[1, 2]}", False),
])
def test_math_verify_equivalence(math_verify_match, gold, completion, ok):
    result = math_verify_match(task(gold), completion)
    assert (result.reward, result.correct) == (float(ok), ok)
    assert result.answer == extract_answer(completion)


def test_math_verify_no_answer_and_bad_reference(math_verify_match):
    assert math_verify_match(task("5"), "I do not know").answer is None
    assert math_verify_match(task("5"), "I do not know").reward == 0.0
    with pytest.raises(ValueError, match="cannot parse the reference answer ''"):
        math_verify_match(task(""), r"\boxed{1}")


def test_math_verify_runs_in_worker_threads(math_verify_match):
    # math-verify's SIGALRM timeouts raise ValueError outside the main thread; we disable them there.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: math_verify_match(task("1/2"), c), [r"\boxed{0.5}", r"\boxed{2}"]))
    assert [r.correct for r in results] == [True, False]


def test_math_verify_timeouts_only_in_the_main_thread_without_a_pending_alarm(math_verify_match):
    assert rmath._signal_timeout_s() == rmath.MATH_VERIFY_TIMEOUT_S
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(rmath._signal_timeout_s).result() is None
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        assert rmath._signal_timeout_s() is None
        assert math_verify_match(task("1/2"), r"\boxed{0.5}").correct
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # someone else's alarm is still set
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert threading.current_thread() is threading.main_thread()


def test_math_verify_missing_package_names_the_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name.startswith("math_verify"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_math_verify)
    with pytest.raises(ImportError, match=r"pip install 'reinforge\[math\]'"):
        rmath.math_verify_match(task("1"), "1")


# --- regex --------------------------------------------------------------------------------------


def test_regex_fullmatch_on_the_extracted_answer():
    t = task("unused", answer_regex=r"(?i)paris(, france)?")
    assert regex_match(t, "<answer>Paris, France</answer>").correct
    assert regex_match(t, "  paris ").correct  # no tag: the whole stripped completion
    assert not regex_match(t, "<answer>Paris is nice</answer>").correct  # fullmatch, not search
    assert regex_match(t, "<answer>Paris, France</answer>").answer == "Paris, France"


def test_regex_answer_as_pattern_search_mode_and_bad_pattern():
    assert regex_match(task(r"\d{3}"), r"\boxed{123}").correct
    assert not regex_match(task(r"\d{3}"), r"\boxed{1234}").correct
    t = task("x", answer_regex=r"\bcat\b", regex_mode="search")
    assert regex_match(t, "a cat sat").answer == "cat" and not regex_match(t, "concatenate").correct
    with pytest.raises(ValueError, match="bad answer regex"):
        regex_match(task("(unclosed"), "x")


# --- multiple choice ----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("Answer: C", "C"),
    ("answer: c", "C"),
    (r"\boxed{\text{(B)}}", "B"),
    ("<answer>(D) 42</answer>", "D"),
    ("Reasoning... so the answer is (B).", "B"),
    ("C.", "C"),
    ("(A) because it is larger", "A"),
    ("b", "B"),
    ("I first liked (A), but (D) fits", "D"),
    ("A cat sat on the mat", None),  # the article is not a choice
    ("the answer is a prime", None),
    ("<answer>Paris</answer> (B)", None),  # an explicit non-letter answer is not a choice
    ("Answer: F", None),  # outside A-E
])
def test_extract_choice(text, expected):
    assert extract_choice(text) == expected


def test_multiple_choice_compares_case_insensitively_and_checks_the_reference():
    assert multiple_choice(task("c"), "Answer: C").correct
    assert multiple_choice(task("(B)"), "b.").reward == 1.0
    assert not multiple_choice(task("B"), "Answer: C").correct
    assert multiple_choice(task("F", choices="ABCDEF"), "Answer: F").correct
    with pytest.raises(ValueError, match="not one of the choices"):
        multiple_choice(task("42"), "Answer: C")


# --- format -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("completion", "ok"), [
    ("<think>a</think>\n<answer>4</answer>", True),
    ("  <think>\nmulti\nline</think><answer> 4 </answer>\n", True),
    ("<answer>4</answer><think>a</think>", False),  # order
    ("<think>a</think><answer>4</answer> more", False),  # text after
    ("hi <think>a</think><answer>4</answer>", False),  # text before
    ("<think>a</think>b<answer>4</answer>", False),  # text between
    ("<think>a</think><answer>4</answer><answer>5</answer>", False),  # twice
    ("<think>a <think></think><answer>4</answer>", False),
    ("<think>a</think><answer>  </answer>", False),  # blank answer
    ("<think>a</think>", False),
])
def test_think_answer_format(completion, ok):
    result = think_answer_format(task("4"), completion)
    assert (result.reward, result.correct) == (float(ok), ok)
    assert result.answer == ("4" if ok else result.answer)


def test_think_answer_format_custom_tags_and_prefilled_think():
    t = task("4", think_tag="reasoning", answer_tag="final")
    assert think_answer_format(t, "<reasoning>x</reasoning><final>4</final>").correct
    assert not think_answer_format(t, "<think>x</think><answer>4</answer>").correct
    prefilled = task("4", think_prefilled=True)
    assert think_answer_format(prefilled, "x</think><answer>4</answer>").correct
    assert not think_answer_format(prefilled, "<think>x</think><answer>4</answer>").correct
    with pytest.raises(ValueError, match="tag name"):
        think_answer_format(task("4", think_tag="a>b"), "x")


# --- registry and docs --------------------------------------------------------------------------


def test_registered_and_documented():
    import reinforge.rewards.composite  # noqa: F401  (registers length_penalty)

    docs = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text()
    for name in ("math_verify", "regex", "multiple_choice", "think_answer_format", "length_penalty"):
        assert name in VERIFIERS
        entry = next(e for e in VERIFIERS.entries() if e.name == name)
        assert f"`{name}`" in docs and entry.formula in docs, name
    assert re.search(r"pip install", docs)
