"""Held-out evaluation of a policy through a rollout engine: greedy accuracy, pass@k."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reinforge.data.base import Task
from reinforge.eval.passk import mean_pass_at_k
from reinforge.rewards.verifiers import Verifier
from reinforge.rollout.prompts import encode_prompt, prompt_messages
from reinforge.rollout.types import GenerationRequest, SamplingParams


@dataclass
class EvalResult:
    greedy_accuracy: float
    pass_at_k: dict[int, float]
    num_prompts: int
    samples: int

    def as_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}heldout_acc": self.greedy_accuracy}
        out.update({f"{prefix}pass@{k}": v for k, v in self.pass_at_k.items()})
        return out


def build_requests(tasks: Sequence[Task], tokenizer, system_prompt: str | None) -> list[GenerationRequest]:
    return [
        GenerationRequest(encode_prompt(tokenizer, prompt_messages(t.prompt, system_prompt)), t.id) for t in tasks
    ]


def _correct(tasks: Sequence[Task], gens, verifier: Verifier, per_task: int) -> list[int]:
    counts = [0] * len(tasks)
    for i, g in enumerate(gens):
        task = tasks[i // per_task]
        counts[i // per_task] += int(g.finish_reason == "stop" and verifier(task, g.text).correct)
    return counts


def evaluate(
    engine,
    tasks: Sequence[Task],
    verifier: Verifier,
    max_new_tokens: int,
    samples: int = 0,
    temperature: float = 1.0,
    ks: Sequence[int] = (1, 2, 4, 8, 16),
    system_prompt: str | None = None,
) -> EvalResult:
    """Greedy accuracy on ``tasks``; with ``samples`` > 0 also pass@k (k <= samples) at ``temperature``.

    A completion counts only if it ended by itself (EOS or stop string), not by the length limit.
    """
    tasks = list(tasks)
    requests = build_requests(tasks, engine.tokenizer, system_prompt)
    greedy = engine.generate(requests, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
    greedy_acc = sum(_correct(tasks, greedy, verifier, 1)) / len(tasks)
    pass_k: dict[int, float] = {}
    if samples > 0:
        sampled = engine.generate(
            requests, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=samples)
        )
        counts = _correct(tasks, sampled, verifier, samples)
        pass_k = {k: mean_pass_at_k(counts, samples, k) for k in ks if k <= samples}
    return EvalResult(greedy_acc, pass_k, len(tasks), samples)
