"""Judges that see a whole group (the samples of one prompt): group-relative scoring and pairwise comparison.

Both declare ``score_group(task, completions) -> list[RewardResult]``: a ``CompositeReward`` term whose
verifier has it is scored once per group, and ``VerifierPool`` hands such a composite each task's
completions together (``reinforge.rewards.pool``). Called on one completion (``__call__``) they judge
a group of one.

- ``GroupJudge`` (RULER, OpenPipe ART 2025, "Relative Universal LLM-Elicited Rewards"): one call shows
  the prompt and the numbered candidates (``{completions}``) and asks for one score per candidate;
  the reply is read as JSON ``{"scores": [...]}`` (the last such object), else as lines
  ``candidate <i>: <score>``. ``reward_i = (s_i - lo) / (hi - lo)``.
- ``PairwiseJudge``: A-vs-B verdicts (``A``, ``B`` or ``tie``, read with ``verdict_pattern``); each
  sample's reward is its win rate in its group, ``r_i = (wins_i + ties_i / 2) / pairs_i`` over the
  pairs it was compared in (all pairs, or ``max_pairs`` of them drawn with a seed per task); a sample
  in no pair scores 1/2. With ``swap`` each pair is asked in both orders (A, B) and (B, A); two
  verdicts that disagree make the pair a tie (position bias cancels, Zheng et al. 2023, MT-Bench
  "Judging LLM-as-a-Judge", arXiv:2306.05685), and each sample's result counts its pairs and the
  pairs whose verdicts agreed (``stats``: the swap-consistency rate ``agreed / pairs``).

Failures (transport, empty reply, no parse, a wrong count of scores, a score outside the scale) raise
``JudgeError`` for the whole group; the composite's ``on_error`` decides (raise, or 0 for the group).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from reinforge.errors import ConfigError
from reinforge.rewards.judge import (
    ChatJudge,
    JudgeError,
    JudgeRewardResult,
    check_scale,
    fill_template,
    prompt_text,
)
from reinforge.types import Task

DEFAULT_GROUP_RUBRIC = (
    "You are comparing {n} candidate responses to the same prompt. Score each from {low} to {high} on how well "
    "it answers the prompt (correctness first, then completeness and clarity). Judge them against each other: "
    "a better candidate gets a higher score.\n\n"
    "Prompt:\n{prompt}\n\nReference answer (may be empty):\n{answer}\n\nCandidates:\n{completions}\n\n"
    'Reply with JSON only, one score per candidate in order: {"scores": [s_1, ..., s_{n}]}'
)
DEFAULT_PAIRWISE_RUBRIC = (
    "Which of two responses answers the prompt better (correctness first, then completeness and clarity)?\n\n"
    "Prompt:\n{prompt}\n\nReference answer (may be empty):\n{answer}\n\n"
    "Response A:\n{completion_a}\n\nResponse B:\n{completion_b}\n\n"
    "Reason briefly, then end with one line 'Verdict: A', 'Verdict: B' or 'Verdict: tie'."
)
DEFAULT_VERDICT_PATTERN = r"verdict\W*(a|b|tie)\b"
_JSON_SCORES = re.compile(r'"scores"\s*:\s*\[([^\[\]]*)\]', re.I)
_LINE_SCORE = re.compile(
    r"^\W*(?:candidate|response|sample)?\s*#?\s*(\d+)\s*[:=)\].*-]+\s*(?:score\s*[:=]?\s*)?(-?\d+(?:\.\d+)?)\b",
    re.I | re.M)
_RAW_CHARS = 500
Verdict = Literal["a", "b", "tie"]


def _require(template: str, names: Sequence[str], mode: str) -> None:
    missing = [f"{{{n}}}" for n in names if f"{{{n}}}" not in template]
    if missing:
        raise ConfigError(f"judge.rubric for mode {mode} must contain {' and '.join(missing)}")


def number_candidates(completions: Sequence[str]) -> str:
    """The ``{completions}`` block: ``Candidate i:`` headers (from 1) over each completion."""
    return "\n\n".join(f"Candidate {i}:\n{c}" for i, c in enumerate(completions, 1))


def parse_group_scores(text: str, n: int, scale: tuple[float, float] = (0.0, 10.0)) -> list[float]:
    """``n`` raw scores from a judge's reply: the last JSON ``"scores": [...]`` list, else lines
    ``candidate <i>: <score>`` (or ``<i>: <score>``; for each i the last line counts) for exactly
    i = 1..n. JudgeError on no scores, a wrong count, a non-number or a score outside ``scale``."""
    lists = _JSON_SCORES.findall(text)
    if lists:
        try:
            scores = json.loads(f"[{lists[-1]}]")
        except json.JSONDecodeError:
            raise JudgeError(f"the judge's scores list is not JSON numbers: {text[:_RAW_CHARS]!r}") from None
    else:
        by_index = {int(i): v for i, v in _LINE_SCORE.findall(text)}
        if not by_index:
            raise JudgeError(f"no scores in the judge's reply: {text[:_RAW_CHARS]!r}")
        if sorted(by_index) != list(range(1, len(by_index) + 1)):
            raise JudgeError(f"the judge scored candidates {sorted(by_index)}, not 1..{n}: {text[:_RAW_CHARS]!r}")
        scores = [float(by_index[i]) for i in range(1, len(by_index) + 1)]
    if len(scores) != n:
        raise JudgeError(f"the judge gave {len(scores)} scores for {n} candidates: {text[:_RAW_CHARS]!r}")
    try:
        values = [float(s) for s in scores if not isinstance(s, bool | list | dict | None)]
    except ValueError:
        values = []
    if len(values) != n:
        raise JudgeError(f"the judge's scores are not all numbers: {text[:_RAW_CHARS]!r}")
    lo, hi = scale
    if not all(lo <= s <= hi for s in values):
        raise JudgeError(f"a score is outside the scale [{lo:g}, {hi:g}]: {text[:_RAW_CHARS]!r}")
    return values


def parse_verdict(text: str, pattern: re.Pattern[str]) -> Verdict:
    """``a``, ``b`` or ``tie`` from the last match of ``pattern`` (its first group, else the whole match);
    JudgeError on no match or another word."""
    matches = list(pattern.finditer(text))
    if not matches:
        raise JudgeError(f"no verdict in the judge's reply (pattern {pattern.pattern!r}): {text[:_RAW_CHARS]!r}")
    token = (matches[-1].group(1) if pattern.groups else matches[-1].group(0)).strip().lower()
    if token not in ("a", "b", "tie"):
        raise JudgeError(f"the judge's verdict {token!r} is not A, B or tie: {text[:_RAW_CHARS]!r}")
    return token  # type: ignore[return-value]


class GroupJudge(ChatJudge):
    """RULER-style: one call scores every completion of a group; ``correct`` = ``reward > threshold``.
    Template placeholders: ``{prompt}``, ``{answer}``, ``{completions}`` (required), ``{n}``, ``{low}``, ``{high}``."""

    def __init__(self, base_url: str, model: str, rubric: str = DEFAULT_GROUP_RUBRIC, *,
                 scale: tuple[float, float] = (0, 10), threshold: float = 0.5, **client: Any) -> None:
        _require(rubric, ["completions"], "group")
        self.scale = check_scale(scale)
        super().__init__(base_url, model, **client)
        self.rubric, self.threshold = rubric, threshold

    def render(self, task: Task, completions: Sequence[str]) -> str:
        lo, hi = self.scale
        return fill_template(self.rubric, {
            "prompt": prompt_text(task), "answer": task.answer, "completions": number_candidates(completions),
            "n": str(len(completions)), "low": f"{lo:g}", "high": f"{hi:g}"})

    def score_group(self, task: Task, completions: Sequence[str]) -> list[JudgeRewardResult]:
        text = self.chat(self.render(task, completions), task.id)
        try:
            raw = parse_group_scores(text, len(completions), self.scale)
        except JudgeError as exc:
            raise JudgeError(f"judge {self.model!r} on task {task.id!r}: {exc}") from None
        lo, hi = self.scale
        rewards = [(s - lo) / (hi - lo) for s in raw]
        return [JudgeRewardResult(r, r > self.threshold, None, raw_score=s, judge_text=text)
                for r, s in zip(rewards, raw, strict=True)]

    def __call__(self, task: Task, completion: str) -> JudgeRewardResult:
        return self.score_group(task, [completion])[0]


@dataclass(frozen=True)
class PairwiseRewardResult(JudgeRewardResult):
    """A sample's win rate, with ``stats``: ``pairs`` (its pairs asked in both orders) and ``agreed``
    (those whose two verdicts agreed); empty without ``swap``."""

    stats: dict[str, float] = field(default_factory=dict)


def sample_pairs(n: int, max_pairs: int | None, seed: int, task_id: str) -> list[tuple[int, int]]:
    """Every pair ``i < j`` of ``n`` samples, or ``max_pairs`` of them drawn with ``random.Random`` seeded
    by ``(seed, task_id)`` (the same pairs on every run), in order."""
    pairs = list(itertools.combinations(range(n), 2))
    if max_pairs is None or len(pairs) <= max_pairs:
        return pairs
    return sorted(random.Random(f"{seed}:{task_id}").sample(pairs, max_pairs))


def win_rates(n: int, outcomes: dict[tuple[int, int], float]) -> list[float]:
    """Each sample's mean score over its pairs: ``outcomes[(i, j)]`` is i's score against j (1 win,
    1/2 tie, 0 loss; j gets ``1 - outcome``); a sample in no pair gets 1/2."""
    total, count = [0.0] * n, [0] * n
    for (i, j), s in outcomes.items():
        total[i], total[j] = total[i] + s, total[j] + 1.0 - s
        count[i], count[j] = count[i] + 1, count[j] + 1
    return [t / c if c else 0.5 for t, c in zip(total, count, strict=True)]


_WINNER = {"a": 1.0, "b": 0.0, "tie": 0.5}  # the first-shown completion's score


class PairwiseJudge(ChatJudge):
    """A-vs-B comparisons turned into win rates (module docstring); ``correct`` = ``reward > threshold``.
    Template placeholders: ``{prompt}``, ``{answer}``, ``{completion_a}`` and ``{completion_b}`` (required).
    ``concurrency`` comparisons run at once (each a chat call)."""

    def __init__(self, base_url: str, model: str, rubric: str = DEFAULT_PAIRWISE_RUBRIC, *,
                 verdict_pattern: str = DEFAULT_VERDICT_PATTERN, swap: bool = True, max_pairs: int | None = None,
                 pair_seed: int = 0, concurrency: int = 8, threshold: float = 0.5, **client: Any) -> None:
        _require(rubric, ["completion_a", "completion_b"], "pairwise")
        try:
            self.pattern = re.compile(verdict_pattern, re.I)
        except re.error as exc:
            raise ConfigError(f"judge.verdict_pattern {verdict_pattern!r} is not a regex: {exc}") from None
        if max_pairs is not None and max_pairs < 1 or concurrency < 1:
            raise ConfigError(f"judge.max_pairs and judge.concurrency must be >= 1, got {max_pairs}, {concurrency}")
        super().__init__(base_url, model, **client)
        self.rubric, self.swap, self.max_pairs, self.pair_seed = rubric, swap, max_pairs, pair_seed
        self.concurrency, self.threshold = concurrency, threshold

    def verdict(self, task: Task, a: str, b: str) -> float:
        """The score of ``a`` against ``b`` (1, 1/2 or 0) from one call with ``a`` shown first."""
        text = self.chat(fill_template(self.rubric, {"prompt": prompt_text(task), "answer": task.answer,
                                                      "completion_a": a, "completion_b": b}), task.id)
        try:
            return _WINNER[parse_verdict(text, self.pattern)]
        except JudgeError as exc:
            raise JudgeError(f"judge {self.model!r} on task {task.id!r}: {exc}") from None

    def score_group(self, task: Task, completions: Sequence[str]) -> list[PairwiseRewardResult]:
        n = len(completions)
        pairs = sample_pairs(n, self.max_pairs, self.pair_seed, task.id)
        calls = [(i, j) for i, j in pairs] + ([(j, i) for i, j in pairs] if self.swap else [])
        pool = ThreadPoolExecutor(max(1, min(self.concurrency, len(calls))), thread_name_prefix="pairwise-judge")
        try:  # the first failed call fails the group; calls not yet started are dropped
            verdicts = list(pool.map(lambda c: self.verdict(task, completions[c[0]], completions[c[1]]), calls))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        scores = dict(zip(calls, verdicts, strict=True))
        outcomes, pairs_of, agreed_of = {}, [0] * n, [0] * n
        for i, j in pairs:
            first = scores[(i, j)]
            if not self.swap:
                outcomes[(i, j)] = first
                continue
            agree = first == 1.0 - scores[(j, i)]  # the swapped call's verdict, seen from i
            outcomes[(i, j)] = first if agree else 0.5
            for k in (i, j):
                pairs_of[k] += 1
                agreed_of[k] += agree
        return [PairwiseRewardResult(r, r > self.threshold, None, raw_score=r,
                                     stats={"pairs": float(p), "agreed": float(a)} if self.swap else {})
                for r, p, a in zip(win_rates(n, outcomes), pairs_of, agreed_of, strict=True)]

    def __call__(self, task: Task, completion: str) -> PairwiseRewardResult:
        return self.score_group(task, [completion])[0]
