"""Step verifiers: process rewards, a score for each step of a completion, as per-token rewards.

A step verifier (registered in ``STEP_VERIFIERS``, recipe key ``reward.step_verifier``) reads a task
and a completion and returns its scored steps: ``(end, score)``, ``end`` the character offset in the
completion where the step ends. ``StepRewards`` puts ``coef * score`` on the generated token in which
each step ends (``Trajectory.token_rewards``), the dense reward of Dai et al. 2024 ("Process
Supervision-Guided Policy Optimization for Code Generation", arXiv:2410.17621), where a process
reward model scores every line of code and its scores are added at the lines' ends to the unit
tests' outcome reward at the last token:

    r_t = coef * s_k [t ends step k] + r_outcome [t = last]

The advantage estimators read them as ``token_rewards`` (``gae``, the paper's PPO, folds them into
its per-token rewards; the group estimators add their returns-to-go). Built in: ``arithmetic_steps``,
a rule-based verifier of the arithmetic a completion writes out (a process reward model would be a
plug-in step verifier). Single-turn episodes only (multi-turn episodes have per-turn rewards).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from reinforge.registry import Registry, Settings, kind
from reinforge.rewards.step_shaping import shape_steps
from reinforge.types import Task

StepVerifier = Callable[..., list[tuple[int, float]]]

STEP_VERIFIERS: Registry[StepVerifier] = kind("step_verifier", Registry("step verifier"))

_EQUATION = re.compile(r"(-?\d+)\s*([-+*x×])\s*(-?\d+)\s*=\s*(-?\d+)")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "x": lambda a, b: a * b,
        "×": lambda a, b: a * b}


class ArithmeticStepSettings(Settings):
    """The scores of a correct and a wrong written-out step."""

    correct: float = Field(1.0, description="score of a step whose equation holds")
    wrong: float = Field(-1.0, description="score of a step whose equation is false")


@STEP_VERIFIERS.register(
    "arithmetic_steps",
    formula="s_k = correct if a op b = c holds, wrong if not, for each equation 'a op b = c' (op in + - * x) "
            "written in the completion; a step ends where its equation does",
    paper="rule-based process supervision, cf. Lightman et al. 2023, Let's Verify Step by Step (arXiv:2305.20050)",
    settings=ArithmeticStepSettings,
)
def arithmetic_steps(task: Task, completion: str, cfg: ArithmeticStepSettings) -> list[tuple[int, float]]:
    """Every integer equation ``a op b = c`` in the completion is a step, scored by whether it holds."""
    out = []
    for m in _EQUATION.finditer(completion):
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        out.append((m.end(), cfg.correct if _OPS[op](a, b) == c else cfg.wrong))
    return out


def token_of_offsets(decode: Callable[[list[int]], str], token_ids: Sequence[int], ends: Sequence[int]) -> list[int]:
    """For each character offset, the index of the generated token in which it falls: the first k with
    ``len(decode(token_ids[:k + 1])) >= end`` (binary search over prefixes; the last token if none)."""
    out = []
    for end in ends:
        lo, hi = 0, len(token_ids) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if len(decode(list(token_ids[: mid + 1]))) >= end:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
    return out


@dataclass
class StepRewards:
    """The run's step verifier (``reward.step_verifier``) and its coefficient, applied after scoring, and the
    step-reward shaper (``reward.step_shaping``: a name of rewards/step_shaping.py and its settings) applied
    to each completion's scores before they are placed."""

    name: str
    settings: Any
    coef: float
    shaper: str | None = None
    shaper_settings: Any = None

    def apply(self, tasks: Sequence[Task], trajectories: Sequence[Any], decode: Callable[[list[int]], str],
              prompt_lens: Sequence[int]) -> dict[str, float]:
        """``Trajectory.token_rewards`` of each (single-turn) trajectory: ``coef * score`` on the token in
        which each step ends; returns the counters (totals over these completions, so rounds add up):
        ``reward/steps`` (steps found) and ``reward/step_score`` (their summed score, after the shaper)."""
        fn = STEP_VERIFIERS.get(self.name)
        n_steps, total = 0, 0.0
        for task, traj, n_prompt in zip(tasks, trajectories, prompt_lens, strict=True):
            steps = fn(task, traj.completion_text, self.settings)
            scores = [s for _, s in steps]
            if self.shaper is not None:
                scores = shape_steps(self.shaper, self.shaper_settings, scores)
            rewards = [0.0] * len(traj.token_ids)
            generated = traj.token_ids[n_prompt:]
            if steps and generated:
                for k, score in zip(token_of_offsets(decode, generated, [e for e, _ in steps]), scores, strict=True):
                    rewards[n_prompt + k] += self.coef * score
            traj.token_rewards = rewards
            n_steps += len(steps)
            total += sum(scores)
        return {"reward/steps": float(n_steps), "reward/step_score": total}
