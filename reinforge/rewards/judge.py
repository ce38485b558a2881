"""LLM-as-judge: a rubric prompt sent to any OpenAI-compatible chat endpoint, its reply parsed into a score.

The rubric is a template with ``{prompt}``, ``{completion}`` and ``{answer}`` (the task's reference);
only these three placeholders are filled, so other braces in the rubric (a JSON example) stay as
written. Chat-message prompts are rendered as ``role: content`` lines. The judge's reply is searched
with ``score_pattern`` (case-insensitive; the pattern's first group, else the whole match, is the
number); the last match counts, since judges usually reason first. With ``scale = (lo, hi)``:
``reward = (v - lo) / (hi - lo)`` in [0, 1].

``ChatJudge`` is the client (one user message, the reply's text) that the group and pairwise judges
(``reinforge.rewards.judge_group``) share; without a rubric ``LLMJudge`` uses ``DEFAULT_RUBRIC``.

Failure path: an HTTP / connection / timeout error, an empty reply, no match, or a value outside
the scale raises ``JudgeError`` with the judge's raw text (truncated). Nothing is scored 0 here:
``CompositeReward``'s ``on_error`` decides (raise by default, or score 0 and count).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reinforge.errors import ConfigError, ReinforgeError
from reinforge.rewards.verifiers import RewardResult
from reinforge.types import Task

DEFAULT_SCORE_PATTERN = r"(?:score|rating)\s*[:=]?\s*(\d+(?:\.\d+)?)"
DEFAULT_RUBRIC = (
    "Grade the response to the prompt below from 0 to 10 (10: fully correct and clear; 0: wrong or empty).\n\n"
    "Prompt:\n{prompt}\n\nReference answer (may be empty):\n{answer}\n\nResponse:\n{completion}\n\n"
    "Reason briefly, then end with one line 'Score: N'."
)
_RAW_CHARS = 500


class JudgeError(ReinforgeError):
    """The judge could not be reached or its reply gave no valid score."""


@dataclass(frozen=True)
class JudgeRewardResult(RewardResult):
    """A ``RewardResult`` with the judge's parsed value (on its own scale) and its reply."""

    raw_score: float = 0.0
    judge_text: str = ""


def prompt_text(task: Task) -> str:
    """The task's prompt as text: chat messages as ``role: content`` lines."""
    if isinstance(task.prompt, str):
        return task.prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in task.prompt)


def fill_template(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{name}`` of ``values`` filled in one pass (other braces stay as written,
    and a filled value is never expanded again)."""
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")\}")
    return pattern.sub(lambda m: values[m.group(1)], template)


def render_rubric(rubric: str, task: Task, completion: str) -> str:
    """The rubric with ``{prompt}``, ``{completion}`` and ``{answer}`` filled in (in one pass)."""
    return fill_template(rubric, {"prompt": prompt_text(task), "completion": completion, "answer": task.answer})


def parse_score(text: str, pattern: str | re.Pattern[str] = DEFAULT_SCORE_PATTERN,
                scale: tuple[float, float] = (0.0, 10.0)) -> tuple[float, float]:
    """``(raw value, value normalised to [0, 1])`` from the last match of ``pattern`` in ``text``;
    raises JudgeError when there is no match or the value is outside ``scale``."""
    compiled = re.compile(pattern, re.I) if isinstance(pattern, str) else pattern
    matches = list(compiled.finditer(text))
    if not matches:
        raise JudgeError(f"no score in the judge's reply (pattern {compiled.pattern!r}): {text[:_RAW_CHARS]!r}")
    last = matches[-1]
    token = last.group(1) if compiled.groups else last.group(0)
    try:
        value = float(token)
    except (TypeError, ValueError):
        raise JudgeError(f"the judge's score {token!r} is not a number: {text[:_RAW_CHARS]!r}") from None
    lo, hi = scale
    if not lo <= value <= hi:
        raise JudgeError(f"the judge's score {value:g} is outside the scale [{lo:g}, {hi:g}]: {text[:_RAW_CHARS]!r}")
    return value, (value - lo) / (hi - lo)


class ChatJudge:
    """The OpenAI-compatible client of a judge: ``chat(content, task_id)`` sends one user message and
    returns the reply's text; any transport or API error, or an empty reply, is a ``JudgeError``."""

    def __init__(self, base_url: str, model: str, *, api_key: str = "EMPTY", max_tokens: int = 512,
                 temperature: float = 0.0, timeout_s: float = 60.0, max_retries: int = 2,
                 seed: int | None = None) -> None:
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import openai
            except ImportError:
                raise ImportError("LLM judges need the openai client: pip install 'reinforge[serve]'") from None
            self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s,
                                         max_retries=self.max_retries)
        return self._client

    def chat(self, content: str, task_id: str) -> str:
        """The judge's reply to ``content``; JudgeError on any transport or API error or an empty reply."""
        client = self.client
        import openai

        request: dict[str, Any] = dict(model=self.model, max_tokens=self.max_tokens, temperature=self.temperature,
                                       messages=[{"role": "user", "content": content}])
        if self.seed is not None:
            request["seed"] = self.seed
        try:
            response = client.chat.completions.create(**request)
        except openai.OpenAIError as exc:
            raise JudgeError(f"judge {self.model!r} at {self.base_url} failed on task {task_id!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
        text = response.choices[0].message.content if response.choices else None
        if not text:
            raise JudgeError(f"judge {self.model!r} returned no text for task {task_id!r}")
        return text

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # the HTTP client is rebuilt after unpickling


def check_scale(scale: tuple[float, float]) -> tuple[float, float]:
    """``(lo, hi)`` as floats; ConfigError unless ``hi > lo``."""
    lo, hi = scale
    if not hi > lo:
        raise ConfigError(f"judge.scale must be (low, high) with high > low, got {scale}")
    return float(lo), float(hi)


class LLMJudge(ChatJudge):
    """A Verifier that asks an OpenAI-compatible endpoint to grade a completion against a rubric;
    ``reward`` = the normalised score, ``correct`` = ``reward > threshold``."""

    def __init__(self, base_url: str, model: str, rubric: str = DEFAULT_RUBRIC, *, api_key: str = "EMPTY",
                 max_tokens: int = 512, temperature: float = 0.0, score_pattern: str = DEFAULT_SCORE_PATTERN,
                 scale: tuple[float, float] = (0, 10), timeout_s: float = 60.0, max_retries: int = 2,
                 threshold: float = 0.5, seed: int | None = None) -> None:
        if "{completion}" not in rubric:
            raise ConfigError("judge.rubric must contain {completion} (and may use {prompt} and {answer})")
        self.scale = check_scale(scale)
        try:
            self.pattern = re.compile(score_pattern, re.I)
        except re.error as exc:
            raise ConfigError(f"judge.score_pattern {score_pattern!r} is not a regex: {exc}") from None
        super().__init__(base_url, model, api_key=api_key, max_tokens=max_tokens, temperature=temperature,
                         timeout_s=timeout_s, max_retries=max_retries, seed=seed)
        self.rubric, self.threshold = rubric, threshold

    def ask(self, task: Task, completion: str) -> str:
        """The judge's reply to the rendered rubric; JudgeError on any transport or API error."""
        return self.chat(render_rubric(self.rubric, task, completion), task.id)

    def __call__(self, task: Task, completion: str) -> JudgeRewardResult:
        text = self.ask(task, completion)
        try:
            raw, reward = parse_score(text, self.pattern, self.scale)
        except JudgeError as exc:
            raise JudgeError(f"judge {self.model!r} on task {task.id!r}: {exc}") from None
        return JudgeRewardResult(reward, reward > self.threshold, None, raw_score=raw, judge_text=text)
