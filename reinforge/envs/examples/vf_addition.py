"""A `verifiers` (0.4, ``verifiers.v1``) taskset written here: two-digit additions, scored by a rubric.

Each task is ``"a+b="`` with ``a`` and ``b`` drawn (seeded) from 10..99, its answer ``a + b``. The rubric
has one reward and two metrics (logged, not rewarded):

    exact      (reward, w = 1.0)  1 when the reply, stripped, is the sum's digits, else 0
    ones       (metric)           1 when the reply's last character is the sum's last digit
    abs_error  (metric)           |reply - sum|, 100 when the reply is not an integer

``ones`` is not rewarded: as partial credit (weight 0.25, tried first) it also pays a reply that drops the
sum's hundreds digit (``58`` for ``79+79``), and of the two seeds run with it one fell (held-out greedy
0.435 -> 0.270 in 60 steps; the other rose, 0.435 -> 0.560); the cause was not isolated.
``env.correct_at: 1.0`` counts exact answers. No system prompt: the
shipped ``tiny-base`` reads only digits, ``+ - =`` and spaces. Used by the recipe ``verifiers_addition``
(``env.id: reinforge.envs.examples.vf_addition``); nothing downloads.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: str


def _reply(trace: vf.Trace) -> str:
    return (trace.last_reply or "").strip()


class AdditionTask(vf.Task[AdditionData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, task: AdditionData, trace: vf.Trace) -> float:
        return float(_reply(trace) == task.answer)

    @vf.metric
    async def ones(self, task: AdditionData, trace: vf.Trace) -> float:
        reply = _reply(trace)
        return float(bool(reply) and reply[-1] == task.answer[-1])

    @vf.metric
    async def abs_error(self, task: AdditionData, trace: vf.Trace) -> float:
        reply = _reply(trace)
        return float(abs(int(reply) - int(task.answer))) if reply.isdigit() else 100.0


class AdditionConfig(vf.TasksetConfig):
    n: int = 2000
    seed: int = 0
    low: int = 10
    high: int = 99


class AdditionTaskset(vf.Taskset[AdditionTask, AdditionConfig]):
    """``n`` seeded problems ``a+b=`` with ``a, b`` in ``[low, high]`` (distinct pairs)."""

    def load(self) -> Iterator[AdditionTask]:
        cfg = self.config
        rng, seen = random.Random(cfg.seed), set()
        pairs = (cfg.high - cfg.low + 1) ** 2
        while len(seen) < min(cfg.n, pairs):
            a, b = rng.randint(cfg.low, cfg.high), rng.randint(cfg.low, cfg.high)
            if (a, b) in seen:
                continue
            seen.add((a, b))
            yield AdditionTask(AdditionData(prompt=f"{a}+{b}=", answer=str(a + b), id=f"{a}+{b}"), cfg.task)


__all__ = ["AdditionTaskset"]
