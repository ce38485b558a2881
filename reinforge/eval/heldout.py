"""Held-out evaluation of a policy through a rollout engine.

Metrics, each with a percentile bootstrap confidence interval over prompts (``eval/stats.py``):

- greedy accuracy: one greedy completion per prompt;
- mean@n: the mean correctness of the n sampled completions of a prompt, averaged over prompts;
- pass@k: the unbiased estimator 1 - C(n - c, k) / C(n, k) of Chen et al. 2021 (c correct of n);
- maj@k: the majority answer (as the verifier reads it) of the first k samples is correct;
- best-of-k (with a reranker, ``eval/rerank.py``): the reward model's favourite of the first k samples is correct.

A completion counts only if it ended by itself (EOS or stop string), not by the length limit.
Results are broken down by task metadata keys where the tasks carry them (e.g. ``difficulty``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reinforge.eval.passk import pass_at_k
from reinforge.eval.stats import bootstrap_ci
from reinforge.rewards.pool import VerifierPool
from reinforge.rewards.verifiers import Verifier
from reinforge.rollout.prompts import encode_prompt, prompt_messages
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.rollout.vision import image_data_url, vision_request
from reinforge.types import Task

DEFAULT_KS = (1, 2, 4, 8, 16)
EXAMPLES = 8  # greedy completions kept for a report (EvalResult.examples)
THUMBNAIL_SIDE = 96  # their pictures' largest side, in pixels
BREAKDOWN_KEYS = ("task", "source", "difficulty", "level", "category")


@dataclass
class EvalResult:
    greedy_accuracy: float
    pass_at_k: dict[int, float]
    num_prompts: int
    samples: int
    mean_at_n: float | None = None
    maj_at_k: dict[int, float] = field(default_factory=dict)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    breakdown: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    pass_curve: dict[int, float] = field(default_factory=dict)
    best_of_k: dict[int, float] = field(default_factory=dict)  # with a reranker (eval/rerank.py)
    examples: list[dict[str, Any]] = field(default_factory=list)  # greedy completions of the first prompts

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}heldout_acc": self.greedy_accuracy}
        out.update({f"{prefix}pass@{k}": v for k, v in self.pass_at_k.items()})
        if self.mean_at_n is not None:
            out[f"{prefix}mean@{self.samples}"] = self.mean_at_n
        out.update({f"{prefix}maj@{k}": v for k, v in self.maj_at_k.items()})
        out.update({f"{prefix}best_of_{k}": v for k, v in self.best_of_k.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_prompts": self.num_prompts, "samples": self.samples, "greedy_accuracy": self.greedy_accuracy,
            "mean_at_n": self.mean_at_n, "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()},
            "maj_at_k": {str(k): v for k, v in self.maj_at_k.items()},
            "confidence_intervals_95": {k: list(v) for k, v in self.intervals.items()},
            "breakdown": self.breakdown, "pass_curve": {str(k): v for k, v in self.pass_curve.items()},
            **({"best_of_k": {str(k): v for k, v in self.best_of_k.items()}} if self.best_of_k else {}),
            **({"examples": self.examples} if self.examples else {}),
        }


def build_requests(tasks: Sequence[Task], tokenizer, system_prompt: str | None, processor=None
                   ) -> list[GenerationRequest]:
    """One request per task; a task with pictures goes through the model's ``processor`` (an error without one:
    a picture is never dropped silently, rollout/vision.py)."""
    out = []
    for t in tasks:
        prompt = prompt_messages(t.prompt, system_prompt)
        if t.images:
            out.append(vision_request(processor, prompt, t.images, t.id, f"task {t.id!r}"))
        else:
            out.append(GenerationRequest(encode_prompt(tokenizer, prompt), t.id))
    return out


def _score(tasks: Sequence[Task], gens: list[Generation], verifier: Verifier | VerifierPool, per_task: int
           ) -> tuple[np.ndarray, list[list[str | None]]]:
    """Correctness [P, per_task] (0/1) and the verifier's answers [P][per_task]. In a ``VerifierPool``
    the calls run in parallel; a call that failed (and the pool's policy zeroed) counts as wrong."""
    call_tasks = [tasks[i // per_task] for i in range(len(gens))]
    if isinstance(verifier, VerifierPool):
        results = [o.result for o in verifier.score(call_tasks, [g.text for g in gens])]
    else:
        results = [verifier(t, g.text) for t, g in zip(call_tasks, gens, strict=True)]
    correct = np.zeros((len(tasks), per_task))
    answers: list[list[str | None]] = [[None] * per_task for _ in tasks]
    for i, (g, result) in enumerate(zip(gens, results, strict=True)):
        p, j = divmod(i, per_task)
        ended = g.finish_reason == "stop" and result is not None
        correct[p, j] = float(ended and result.correct)
        answers[p][j] = (result.answer if result.answer is not None else g.text.strip()) if ended else None
    return correct, answers


def majority_correct(correct: np.ndarray, answers: list[list[str | None]], k: int) -> np.ndarray:
    """Per prompt: is the most common answer among the first k samples correct (ties: first seen)."""
    out = np.zeros(len(answers))
    for p, row in enumerate(answers):
        votes = Counter(a for a in row[:k] if a is not None)
        if votes:
            best = max(votes, key=lambda a: (votes[a], -row.index(a)))
            out[p] = correct[p, row.index(best)]
    return out


# A player plays every task ``per_task`` times with the given sampling and returns correctness
# [P, per_task] (0/1) and the answers [P][per_task] that majority voting compares.
Player = Callable[[Sequence[Task], SamplingParams, int], tuple[np.ndarray, list[list[str | None]]]]


def single_turn_player(engine, verifier: Verifier | VerifierPool, system_prompt: str | None,
                       texts: list[list[str]] | None = None) -> Player:
    """One completion per sample, scored by ``verifier`` (see ``_score``); each call's completion texts
    are appended to ``texts`` when given (what a reranker scores)."""

    def play(tasks: Sequence[Task], params: SamplingParams, per_task: int):
        gens = engine.generate(build_requests(tasks, engine.tokenizer, system_prompt,
                                              getattr(engine, "processor", None)), params)
        if texts is not None:
            texts.append([g.text for g in gens])
        return _score(tasks, gens, verifier, per_task)

    return play


def evaluate(
    engine,
    tasks: Sequence[Task],
    verifier: Verifier | VerifierPool | None,
    max_new_tokens: int,
    samples: int = 0,
    temperature: float = 1.0,
    ks: Sequence[int] = DEFAULT_KS,
    system_prompt: str | None = None,
    confidence: bool = False,
    n_boot: int = 2000,
    player: Player | None = None,
    rerank: Callable[[list[Task], list[str]], list[float]] | None = None,
    texts: list[list[str]] | None = None,
) -> EvalResult:
    """Greedy accuracy on ``tasks``; with ``samples`` > 0 also mean@n, pass@k and maj@k (k <= samples) at
    ``temperature``; with ``confidence`` bootstrap intervals over prompts and the metadata breakdown.
    ``player`` replaces the single-turn completion + ``verifier`` (e.g. multi-turn episodes). ``rerank``
    scores the sampled completions for best-of-k (``eval/rerank.py``; single-turn only). ``texts``: the list a
    ``player`` appends each call's completions to (``orchestrate.collectors.play``), for the result's ``examples``."""
    tasks = list(tasks)
    texts = texts if texts is not None else []
    if player is None:
        if verifier is None:
            raise ValueError("evaluate needs a verifier or a player")
        player = single_turn_player(engine, verifier, system_prompt, texts)
    elif rerank is not None:
        raise ValueError("best-of-n reranking scores single-turn completions; this evaluation plays episodes")
    greedy = player(tasks, SamplingParams(max_new_tokens=max_new_tokens, greedy=True), 1)[0][:, 0]
    per_prompt: dict[str, np.ndarray] = {"greedy_accuracy": greedy}
    result = EvalResult(float(greedy.mean()), {}, len(tasks), samples)
    if texts:
        result.examples = examples(tasks, texts[0], greedy)
    if samples > 0:
        correct, answers = player(
            tasks, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=samples), samples
        )
        counts = correct.sum(1).astype(int)
        per_prompt[f"mean@{samples}"] = correct.mean(1)
        result.mean_at_n = float(correct.mean())
        for k in range(1, samples + 1):
            per_k = np.array([pass_at_k(samples, int(c), k) for c in counts])
            result.pass_curve[k] = float(per_k.mean())
            if k in ks:
                per_prompt[f"pass@{k}"] = per_k
                result.pass_at_k[k] = float(per_k.mean())
                maj = majority_correct(correct, answers, k)
                per_prompt[f"maj@{k}"] = maj
                result.maj_at_k[k] = float(maj.mean())
        if rerank is not None:
            per_prompt |= _best_of(tasks, correct, texts[-1], rerank, samples, ks, result)
    if confidence:
        names = list(per_prompt)
        _, low, high = bootstrap_ci(np.stack([per_prompt[n] for n in names], axis=1), n_boot=n_boot)
        result.intervals = {n: (float(lo), float(hi)) for n, lo, hi in zip(names, low, high, strict=True)}
        result.breakdown = _breakdown(tasks, per_prompt)
    return result


def examples(tasks: Sequence[Task], completions: list[str], correct: np.ndarray, n: int = EXAMPLES,
             thumbnail: int = THUMBNAIL_SIDE) -> list[dict[str, Any]]:
    """The first ``n`` prompts' greedy completions for a report: the prompt's text, its pictures as small PNG
    data URLs (at most ``thumbnail`` pixels a side), the answer, the completion and whether it was right."""
    out = []
    for t, text, ok in list(zip(tasks, completions, correct, strict=False))[:n]:
        prompt = t.prompt if isinstance(t.prompt, str) else "\n".join(
            f"{m.get('role')}: " + (m.get("content") if isinstance(m.get("content"), str) else "".join(
                p.get("text", "") for p in m.get("content") or [] if isinstance(p, dict))) for m in t.prompt)
        out.append({"task_id": t.id, "prompt": prompt, "answer": t.answer, "completion": text,
                    "correct": bool(ok), "images": [image_data_url(img, thumbnail) for img in t.images]})
    return out


def _best_of(tasks: Sequence[Task], correct: np.ndarray, texts: list[str], rerank: Callable, samples: int,
             ks: Sequence[int], result: EvalResult) -> dict[str, np.ndarray]:
    """Best-of-k for each k of ``ks``: the reranker's favourite of the first k samples (``eval/rerank.py``)."""
    from reinforge.eval.rerank import best_of

    scores = np.asarray(rerank([tasks[i // samples] for i in range(len(texts))], texts), dtype=float)
    scores = scores.reshape(len(tasks), samples)
    out = {}
    for k in ks:
        out[f"best_of_{k}"] = best_of(correct, scores, k)
        result.best_of_k[k] = float(out[f"best_of_{k}"].mean())
    return out


def _breakdown(tasks: Sequence[Task], per_prompt: dict[str, np.ndarray]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in BREAKDOWN_KEYS:
        values = [t.metadata.get(key) for t in tasks]
        if all(v is None for v in values) or len({str(v) for v in values}) < 2:
            continue
        groups: dict[str, list[int]] = {}
        for i, v in enumerate(values):
            groups.setdefault(str(v), []).append(i)
        out[key] = {g: {"prompts": float(len(idx)), **{m: float(s[idx].mean()) for m, s in per_prompt.items()}}
                    for g, idx in sorted(groups.items())}
    return out
