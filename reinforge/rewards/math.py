"""Math verifiers: answer extraction, symbolic equivalence (``math-verify``), regex and multiple choice.

``extract_answer`` reads, in order: the last ``\\boxed{...}`` (balanced braces), else the last
``<answer>...</answer>`` tag, else the text after the last ``answer:`` label (any case; the rest of
that line, or the next non-empty line), else the last number (thousands commas removed). It
strips surrounding whitespace, ``**`` and ``$...$`` and a trailing period.

``math_verify_match`` compares the extracted answer with ``task.answer`` through Hugging Face's
``math-verify`` (LaTeX, fractions, sets, intervals, percentages, ``\\text{}`` units): both sides are
parsed as inline maths (``$...$``) first, then as plain text. math-verify bounds parsing and
comparison with ``signal.alarm``, which works only in the main thread and cancels any alarm already
set; we pass its timeouts (``MATH_VERIFY_TIMEOUT_S``) only in the main thread with no pending alarm,
and otherwise disable them (math-verify then logs a one-time warning) and rely on the caller's
per-call timeout (``VerifierPool``). A math-verify timeout on a prediction scores 0 (it is logged
by math-verify, not raised).
"""

from __future__ import annotations

import re
import signal
import threading
from functools import lru_cache
from typing import Any

from reinforge.rewards.verifiers import CPU_BOUND, VERIFIERS, RewardResult
from reinforge.types import Task

MATH_VERIFY_TIMEOUT_S = 5
_INSTALL = "the math_verify verifier needs math-verify: pip install 'reinforge[math]' (or pip install math-verify)"

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_ANSWER_LABEL = re.compile(r"answer\s*[:：][\s*]*([^\n]+)", re.I)
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?")
_MATH_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces balance; None if there is none."""
    span = _last_boxed_span(text)
    return text[span[0]:span[1]] if span is not None else None


def _last_boxed_span(text: str) -> tuple[int, int] | None:
    """[start, end) of the last balanced box's content."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return start, i
    return None


def _clean(answer: str) -> str:
    s = answer.strip().strip("*").strip().removesuffix(".").rstrip()
    for left, right in _MATH_DELIMS:
        if s.startswith(left) and s.endswith(right) and len(s) > len(left) + len(right):
            s = s[len(left) : -len(right)].strip()
            break
    return s.removesuffix(".").strip()


def extract_answer(text: str, number_fallback: bool = True) -> str | None:
    """The final answer in ``text`` (see the module docstring for the order); None if there is none."""
    found = _located_answer(text, number_fallback)
    if found is None:
        return None
    _, raw, is_number = found
    if is_number:
        return raw.replace(",", "")
    return _clean(raw) or None


def answer_start(text: str, number_fallback: bool = True) -> int | None:
    """Where the answer ``extract_answer`` reads begins in ``text`` (the first non-space character of the
    box's, tag's or label's content, or the last number); None if there is none. What precedes it is the
    completion's reasoning (and the opening of its answer format)."""
    found = _located_answer(text, number_fallback)
    if found is None:
        return None
    start, raw, _ = found
    return start + len(raw) - len(raw.lstrip())


def _located_answer(text: str, number_fallback: bool) -> tuple[int, str, bool] | None:
    """(where the raw answer starts, the raw answer, whether it is the last-number fallback), in
    ``extract_answer``'s order."""
    span = _last_boxed_span(text)
    if span is not None:
        return span[0], text[span[0]:span[1]], False
    for pattern in (_ANSWER_TAG, _ANSWER_LABEL):
        matches = list(pattern.finditer(text))
        if matches:
            return matches[-1].start(1), matches[-1].group(1), False
    if number_fallback and (numbers := list(_NUMBER.finditer(text))):
        return numbers[-1].start(), numbers[-1].group(), True
    return None


# ----------------------------------------------------------------------------------------------
# math-verify


def _math_verify() -> tuple[Any, Any]:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ImportError(_INSTALL) from None
    return parse, verify


def _signal_timeout_s() -> int | None:
    """math-verify's SIGALRM timeout if it is safe to use here (main thread, no alarm pending), else None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return None
    return MATH_VERIFY_TIMEOUT_S


def _parse(text: str, timeout_s: int | None, raise_on_error: bool = False) -> list:
    """math-verify parse of ``text`` as inline maths, else as plain text (first non-empty result)."""
    parse, _ = _math_verify()
    candidates = (text, f"${text}$") if "$" in text else (f"${text}$", text)
    for candidate in candidates:
        parsed = parse(candidate, parsing_timeout=timeout_s, raise_on_error=raise_on_error)
        if parsed:
            return parsed
    return []


@VERIFIERS.register(
    "math_verify",
    formula="r = 1 if math-verify finds the extracted answer equivalent to the reference answer else 0",
    paper="Hugging Face Math-Verify (github.com/huggingface/Math-Verify)",
    needs=(CPU_BOUND,),
)
def math_verify_match(task: Task, completion: str) -> RewardResult:
    """1 when ``extract_answer(completion)`` is mathematically equivalent to ``task.answer`` (math-verify's
    ``verify(gold, prediction)``: numeric to 6 decimals, symbolic simplification, sets, intervals).
    Raises ValueError when the task's answer does not parse (a data error, not a wrong completion)."""
    _, verify = _math_verify()
    timeout_s = _signal_timeout_s()
    gold = _gold(task.answer, timeout_s)
    if not gold:
        raise ValueError(f"task {task.id!r}: math-verify cannot parse the reference answer {task.answer!r}")
    answer = extract_answer(completion)
    if answer is None:
        return RewardResult(0.0, False, None)
    prediction = _parse(answer, timeout_s)
    ok = bool(prediction) and bool(verify(gold, prediction, timeout_seconds=timeout_s))
    return RewardResult(float(ok), ok, answer)


@lru_cache(maxsize=4096)
def _gold(answer: str, timeout_s: int | None) -> list:
    """The parsed reference (cached: every sample of a group shares it); math-verify's timeout
    (a BaseException) becomes a TimeoutError."""
    from math_verify.errors import TimeoutException

    try:
        return _parse(_clean(answer), timeout_s, raise_on_error=True)
    except TimeoutException:
        raise TimeoutError(f"math-verify timed out parsing the reference answer {answer[:200]!r}") from None


# ----------------------------------------------------------------------------------------------
# Regex and multiple choice


@VERIFIERS.register(
    "regex",
    formula="r = 1 if re.fullmatch(pattern, extracted answer) (or re.search(pattern, completion)) else 0",
    paper="-",
)
def regex_match(task: Task, completion: str) -> RewardResult:
    """Pattern: ``task.metadata["answer_regex"]``, else ``task.answer`` read as a regex. The default
    ``regex_mode="fullmatch"`` matches the extracted answer (boxed / tag / label, else the whole
    stripped completion; no last-number fallback); ``regex_mode="search"`` searches the whole completion."""
    pattern = task.metadata.get("answer_regex", task.answer)
    mode = task.metadata.get("regex_mode", "fullmatch")
    if mode not in ("fullmatch", "search"):
        raise ValueError(f"task {task.id!r}: regex_mode must be 'fullmatch' or 'search', got {mode!r}")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"task {task.id!r}: bad answer regex {pattern!r}: {exc}") from None
    if mode == "search":
        match = compiled.search(completion)
        return RewardResult(float(match is not None), match is not None, match.group(0) if match else None)
    answer = extract_answer(completion, number_fallback=False) or completion.strip()
    ok = compiled.fullmatch(answer) is not None
    return RewardResult(float(ok), ok, answer)


@lru_cache(maxsize=64)
def _choice_patterns(letters: str) -> tuple[re.Pattern[str], ...]:
    up, both = re.escape(letters.upper()), re.escape(letters.upper() + letters.lower())
    return (
        re.compile(rf"(?i:answer\s+is)\s*:?\s*[(\[]?([{up}])(?![A-Za-z])"),  # "the answer is (C)"
        re.compile(rf"\A[(\[]?([{both}])(?:[)\].:](?:\s.*)?)?\Z", re.S),  # the completion starts with "C." / "(C)"
        re.compile(rf"[(\[]([{up}])[)\]]"),  # the last "(C)"
    )


def _letter(text: str, letters: str) -> str | None:
    """A choice letter at the start of a short answer: "C", "(C)", "c.", "C) Paris", "\\text{C}"."""
    s = re.sub(r"\\text(?:bf)?\{([^}]*)\}", r"\1", text).strip()
    both = re.escape(letters.upper() + letters.lower())
    match = re.match(rf"[\s(\[*]*([{both}])(?![A-Za-z])", s)
    return match.group(1).upper() if match else None


def extract_choice(text: str, letters: str = "ABCDE") -> str | None:
    """The chosen letter (upper case): from a boxed / tag / ``answer:`` answer if there is one (None
    if that answer is not a letter), else "the answer is C", else a completion that starts with
    the letter ("C", "C.", "(C) ..."), else the last "(C)". Lower-case letters count only in the
    tagged answer and a completion that starts with one (not "a" in running text)."""
    tagged = extract_answer(text, number_fallback=False)
    if tagged is not None:
        return _letter(tagged, letters)
    stripped = text.strip()
    for pattern in _choice_patterns(letters):
        found = pattern.findall(stripped)
        if found:
            return found[-1].upper()
    return None


@VERIFIERS.register(
    "multiple_choice",
    formula="r = 1 if the extracted choice letter equals the answer letter (case-insensitive) else 0",
    paper="-",
)
def multiple_choice(task: Task, completion: str) -> RewardResult:
    """Letters from ``task.metadata["choices"]`` (default "ABCDE"); ``task.answer`` is a letter ("C",
    "(C)", "c"). Raises ValueError when the answer is not one of the letters."""
    letters = "".join(task.metadata.get("choices", "ABCDE"))
    match = re.fullmatch(r"[(\[]?([A-Za-z])[)\].]?", task.answer.strip())
    gold = match.group(1).upper() if match else None
    if gold is None or gold not in letters.upper():
        raise ValueError(f"task {task.id!r}: the answer {task.answer!r} is not one of the choices {letters!r}")
    choice = extract_choice(completion, letters)
    ok = choice == gold
    return RewardResult(float(ok), ok, choice)
