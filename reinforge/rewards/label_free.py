"""Label-free and cheap rewards: majority vote (TTRL), RESTRAIN's weighted votes, TruthRL's ternary reward,
RLCR's calibration reward and BLEU (BLEUBERI). docs/rewards.md "Label-free and cheap rewards" has each
one's formula, paper, options and departures; each function's docstring says the same in short.

The two voting verifiers need the whole group (the samples of one prompt): they are functions with a
``score_group(task, completions)`` attribute and ``scores_groups = True``, so ``VerifierPool`` (and a
``CompositeReward`` term) hands them each task's completions in one call; called on one completion they
see a group of one. ``reward`` uses the vote only; ``correct`` is the sample's agreement with the gold
answer when the task has one (``gold_verifier``, default ``math_verify``), so accuracy metrics stay honest.

Options are read from ``task.metadata`` (or a reward term's ``params``).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from reinforge.rewards.bleu import sentence_bleu
from reinforge.rewards.imported import resolve_verifier
from reinforge.rewards.math import extract_answer
from reinforge.rewards.verifiers import CPU_BOUND, VERIFIERS, RewardResult
from reinforge.types import Task

GroupFn = Callable[[Task, Sequence[str]], list[RewardResult]]
DEFAULT_GOLD_VERIFIER = "math_verify"
DEFAULT_ABSTAIN_PHRASES = ("I don't know",)
_NUMERIC = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def _groupwise(group_fn: GroupFn) -> Callable[[Callable[..., RewardResult]], Callable[..., RewardResult]]:
    """Give a verifier function ``score_group`` (``group_fn``) and ``scores_groups = True``."""
    def attach(fn: Callable[..., RewardResult]) -> Callable[..., RewardResult]:
        fn.score_group = group_fn  # type: ignore[attr-defined]
        fn.scores_groups = True  # type: ignore[attr-defined]
        return fn
    return attach


# ----------------------------------------------------------------------------------------------
# Votes: the answers of a group


def canonical_answer(answer: str) -> str:
    """The form answers are voted in: whitespace removed; a plain number (``0.50``, ``1/2``, ``-3``) as
    its exact fraction (``1/2``, ``-3``), so equal numbers written differently count as one answer."""
    s = "".join(answer.split())
    if _NUMERIC.fullmatch(s):
        try:
            return str(Fraction(s))
        except (ValueError, ZeroDivisionError):
            return s
    return s


def group_answers(task: Task, completions: Sequence[str]) -> list[str | None]:
    """Each completion's canonical extracted answer (``extract_answer``; ``number_fallback`` from the task's
    metadata, default true), None where there is none."""
    fallback = bool(task.metadata.get("number_fallback", True))
    found = [extract_answer(c, number_fallback=fallback) for c in completions]
    return [canonical_answer(a) if a is not None else None for a in found]


def majority(answers: Sequence[str | None]) -> tuple[str | None, Counter[str]]:
    """The most frequent answer and every answer's count; samples without an answer do not vote. A tie goes
    to the tied answer seen first in the group (``Counter.most_common``, as TTRL's code); None if no sample
    has an answer."""
    counts = Counter(a for a in answers if a is not None)
    return (counts.most_common(1)[0][0] if counts else None), counts


def gold_correct(task: Task, completion: str) -> bool:
    """Whether the completion agrees with ``task.answer`` by the ``gold_verifier`` (a registered verifier or
    ``module:function``, default ``math_verify``); False when the task has no answer."""
    if not task.answer.strip():
        return False
    return bool(resolve_verifier(task.metadata.get("gold_verifier", DEFAULT_GOLD_VERIFIER))(task, completion).correct)


def _majority_group(task: Task, completions: Sequence[str]) -> list[RewardResult]:
    answers = group_answers(task, completions)
    label, _ = majority(answers)
    return [RewardResult(float(a is not None and a == label), gold_correct(task, c), a)
            for a, c in zip(answers, completions, strict=True)]


@_groupwise(_majority_group)
@VERIFIERS.register(
    "majority_vote",
    formula="r_i = 1 if a_i == the most frequent answer of the group else 0 (a_i: sample i's extracted answer; "
            "no gold label; a sample without an answer scores 0 and does not vote)",
    paper="Zuo et al. 2025, TTRL: Test-Time Reinforcement Learning (arXiv:2504.16084)",
    needs=(CPU_BOUND,),
)
def majority_vote(task: Task, completion: str) -> RewardResult:
    """TTRL: 1 when the sample's answer is its group's majority answer (a tie: the first seen), else 0.
    ``correct``: agreement with the gold answer (``gold_verifier``). Alone, a completion is its own majority."""
    return _majority_group(task, [completion])[0]


# ----------------------------------------------------------------------------------------------
# RESTRAIN: every answer a pseudo-label, weighted by its frequency


def restrain_shape(f: float, center: float, sigma: float) -> float:
    """RESTRAIN's shaping function ``g(f) = exp(-(f - center)^2 / (2 sigma^2))``."""
    return math.exp(-((f - center) ** 2) / (2.0 * sigma * sigma))


def _restrain_options(meta: dict[str, Any]) -> tuple[float, float, int, float | None]:
    sigma = float(meta.get("restrain_sigma", 0.5))
    center = float(meta.get("restrain_center", 1.0))
    kappa = int(meta.get("restrain_kappa", 2))
    ref = meta.get("reference_majority")
    if not sigma > 0 or not 0 <= center <= 1 or kappa < 0:
        raise ValueError(f"restrain_vote needs restrain_sigma > 0, 0 <= restrain_center <= 1 and restrain_kappa >= 0; "
                         f"got {sigma}, {center}, {kappa}")
    if ref is not None and not 0 <= float(ref) <= 1:
        raise ValueError(f"reference_majority is a fraction of the reference samples in [0, 1], got {ref!r}")
    return sigma, center, kappa, None if ref is None else float(ref)


def restrain_rewards(answers: Sequence[str | None], sigma: float, center: float, kappa: int,
                     reference_majority: float | None = None) -> list[float]:
    """``r_i = u * w_{a_i}`` with ``w_j = g(c_j / n) / sum_l g(c_l / n)`` over the distinct answers (n = the
    group's size), ``u = g(reference_majority)`` (1 without it); 0 for a sample without an answer, and
    0 for the whole group when its largest count ``M = max_j c_j`` is below ``kappa``."""
    label, counts = majority(answers)
    if label is None or counts[label] < kappa:
        return [0.0] * len(answers)
    n = len(answers)
    shaped = {a: restrain_shape(c / n, center, sigma) for a, c in counts.items()}
    total = sum(shaped.values())
    u = 1.0 if reference_majority is None else restrain_shape(reference_majority, center, sigma)
    return [u * shaped[a] / total if a is not None else 0.0 for a in answers]


def _restrain_group(task: Task, completions: Sequence[str]) -> list[RewardResult]:
    answers = group_answers(task, completions)
    rewards = restrain_rewards(answers, *_restrain_options(task.metadata))
    return [RewardResult(r, gold_correct(task, c), a) for r, a, c in zip(rewards, answers, completions, strict=True)]


@_groupwise(_restrain_group)
@VERIFIERS.register(
    "restrain_vote",
    formula="r_i = u * g(f_{a_i}) / sum_j g(f_j), g(f) = exp(-(f - center)^2 / (2 sigma^2)), f_j = c_j / n; "
            "r_i = 0 for every sample of a group whose largest count M < kappa (u = g(reference_majority), default 1)",
    paper="Yu et al. 2025, RESTRAIN: From Spurious Votes to Signals (arXiv:2510.02172), pseudo-label and prompt weights",
    needs=(CPU_BOUND,),
)
def restrain_vote(task: Task, completion: str) -> RewardResult:
    """RESTRAIN's pseudo-label weighting as a reward: a sample earns its answer's normalised weight
    (``restrain_rewards``); a low-consistency group (``M < restrain_kappa``) earns 0. The ``-delta`` advantage
    offset of such groups is not a reward (docs/rewards.md). ``correct``: agreement with the gold answer."""
    return _restrain_group(task, [completion])[0]


# ----------------------------------------------------------------------------------------------
# TruthRL: correct +1, abstain 0, wrong -1

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_text(s: str) -> str:
    """SQuAD-style: lower case, punctuation and articles removed, whitespace collapsed
    (``"I don't know."`` -> ``"i dont know"``)."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCTUATION)).split())


def abstains(text: str, phrases: Sequence[str]) -> bool:
    """Whether a normalised abstention phrase occurs in the normalised ``text``."""
    norm = normalize_text(text)
    return any((p := normalize_text(phrase)) and p in norm for phrase in phrases)


def _truth_correct(task: Task, completion: str, answer: str) -> bool:
    """``gold_verifier``'s verdict when one is named, else a normalised exact match of ``answer`` with
    ``task.answer`` or one of ``task.metadata["answers"]``."""
    if "gold_verifier" in task.metadata:
        return gold_correct(task, completion)
    golds = [task.answer, *task.metadata.get("answers", [])]
    return normalize_text(answer) in {normalize_text(g) for g in golds if g.strip()}


@VERIFIERS.register(
    "truthrl_ternary",
    formula="r = +1 if the answer is correct, 0 if it abstains (an abstention phrase), -1 if it is wrong or there is "
            "none; an out_of_knowledge task: +1 if it abstains, else -1",
    paper="Wei et al. 2025, TruthRL: Incentivizing Truthful LLMs via Reinforcement Learning (arXiv:2509.25760)",
)
def truthrl_ternary(task: Task, completion: str) -> RewardResult:
    """TruthRL's ternary reward: +1 for a correct answer, 0 for an abstention, -1 for a wrong or missing one.
    Options: ``abstain_phrases`` (default ``["I don't know"]``, matched normalised, as a substring),
    ``abstain_scope`` ``answer`` (default: the extracted answer) or ``completion``, ``abstain_reward`` (default
    0; -1 gives the binary baseline), ``out_of_knowledge`` (the knowledge-boundary relabelling), ``answers``
    (aliases), ``gold_verifier``. ``correct`` is ``reward == 1``."""
    meta = task.metadata
    phrases = meta.get("abstain_phrases", DEFAULT_ABSTAIN_PHRASES)
    phrases = [phrases] if isinstance(phrases, str) else list(phrases)
    scope = meta.get("abstain_scope", "answer")
    if scope not in ("answer", "completion"):
        raise ValueError(f"abstain_scope must be 'answer' or 'completion', got {scope!r}")
    answer = extract_answer(completion, number_fallback=False)
    where = answer if scope == "answer" else completion
    abstained = where is not None and abstains(where, phrases)
    if meta.get("out_of_knowledge", False):
        reward = 1.0 if abstained else -1.0
    elif abstained:
        reward = float(meta.get("abstain_reward", 0.0))
    elif answer is None:
        reward = -1.0
    else:
        reward = 1.0 if _truth_correct(task, completion, answer) else -1.0
    return RewardResult(reward, reward == 1.0, answer)


# ----------------------------------------------------------------------------------------------
# RLCR: correctness plus a Brier score on the stated confidence


@lru_cache(maxsize=16)
def _tag_pattern(tag: str) -> re.Pattern[str]:
    if not re.fullmatch(r"[A-Za-z_][\w.-]*", tag):
        raise ValueError(f"confidence_tag must be a tag name, got {tag!r}")
    return re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.S)


def parse_confidence(completion: str, tag: str = "confidence") -> float | None:
    """The number in the last ``<tag>...</tag>`` if it is a finite float in [0, 1], else None."""
    found = _tag_pattern(tag).findall(completion)
    if not found:
        return None
    try:
        q = float(found[-1].strip())
    except ValueError:
        return None
    return q if math.isfinite(q) and 0.0 <= q <= 1.0 else None


@VERIFIERS.register(
    "rlcr_brier",
    formula="r = c - (q - c)^2 (c = 1 if the answer is correct else 0, q = the stated confidence in [0, 1]); "
            "r = -1 if q is missing or not a number in [0, 1]",
    paper="Damani et al. 2025, Beyond Binary Rewards: Training LMs to Reason About Their Uncertainty (arXiv:2507.16806)",
    needs=(CPU_BOUND,),
)
def rlcr_brier(task: Task, completion: str) -> RewardResult:
    """RLCR: correctness (``gold_verifier``, default ``math_verify``) minus the Brier score of the confidence in
    the last ``<confidence>`` tag (``confidence_tag``). Without a readable confidence the reward is the minimum,
    -1 (the authors' code scores both its accuracy and Brier terms 0 then); ``correct`` stays the real verdict."""
    c = float(gold_correct(task, completion))
    q = parse_confidence(completion, task.metadata.get("confidence_tag", "confidence"))
    reward = -1.0 if q is None else c - (q - c) ** 2
    return RewardResult(reward, bool(c), extract_answer(completion))


# ----------------------------------------------------------------------------------------------
# BLEU against the reference answer(s)


def bleuberi_text(completion: str) -> str:
    """What BLEUBERI scores: the text after the first ``<answer>`` up to the next ``</answer>`` (or to the end
    when it is not closed), else the whole completion; stripped."""
    if "<answer>" in completion:
        completion = completion.split("<answer>", 1)[1].split("</answer>", 1)[0]
    return completion.strip()


@VERIFIERS.register(
    "bleu",
    formula="r = BLEU(response, references) in [0, 1] (13a tokens, n-grams up to 4, add-one smoothing, "
            "brevity penalty against the shortest reference); 0 for an empty response",
    paper="Chang et al. 2025, BLEUBERI: BLEU is a surprisingly effective reward for instruction following "
          "(arXiv:2505.11080)",
    needs=(CPU_BOUND,),
)
def bleu(task: Task, completion: str) -> RewardResult:
    """Sentence BLEU (``reinforge.rewards.bleu``) of the response (``bleuberi_text``) against ``task.answer``
    and ``task.metadata["references"]``; ``bleu_max_order`` (default 4); ``correct``: BLEU >= ``bleu_correct_at``
    (default 1.0). ValueError when the task has no reference."""
    refs = [r for r in [task.answer, *task.metadata.get("references", [])] if r.strip()]
    if not refs:
        raise ValueError(f"task {task.id!r}: bleu needs a reference (task.answer or metadata references)")
    text = bleuberi_text(completion)
    score = sentence_bleu(text, refs, int(task.metadata.get("bleu_max_order", 4))) if text else 0.0
    return RewardResult(score, score >= float(task.metadata.get("bleu_correct_at", 1.0)), text or None)
