"""``VerifierPool``: score many completions off the main loop, in parallel, each call with its own timeout.

Two kinds of worker:
- ``"thread"`` (this class's default; a run's ``reward.pool: auto`` picks per verifier, see
  ``reinforge.rewards.build.pool_kind``): worker threads. Right for verifiers that wait rather than compute: the
  sandboxed code verifier (each test runs in a sandbox subprocess with its own hard wall clock),
  reward-model scoring (torch releases the GIL), LLM judges (HTTP). Threads start in
  microseconds and need no pickling. Limit: a thread cannot be killed, so a pure-Python verifier
  stuck forever keeps its thread (the pool starts fresh threads for the next batch).
- ``"process"``: worker processes (spawned, one call at a time each). Right for CPU-bound
  pure-Python verifiers (math-verify's symbolic equivalence), which threads cannot run in
  parallel; a call past its timeout is ended by killing its worker, which is replaced. The
  verifier must pickle (registered verifiers and ``CompositeReward`` of them do); each worker
  costs one Python interpreter importing the verifier's modules (~2 s, once per pool).

Group scoring: a verifier with a true ``scores_groups`` (a ``CompositeReward`` with a group or pairwise
judge term) is called once per task id of a batch, ``score_group(task, completions)`` with all of that
task's completions (the samples of one prompt), under one timeout; a failed or timed-out group call
fails each of its completions. Any other verifier is called once per completion, as before.

A call that raises or times out is counted (``stats``), logged with its task id and completion,
and kept in ``failures`` (the last 1000). The error policy ``on_error``: ``"zero"`` scores it 0,
``"raise"`` makes ``score`` raise ``VerifierError``. A verifier with its own ``on_error``
attribute (``CompositeReward``, which can zero a single failed term) follows the pool's policy.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from reinforge.errors import ReinforgeError
from reinforge.rewards.pool_backends import CompletionGroup, OnError, _ProcessBackend, _Raw, _ThreadBackend
from reinforge.rewards.verifiers import RewardResult, Verifier
from reinforge.types import Task

if TYPE_CHECKING:
    from reinforge.rewards.steps import StepRewards

log = logging.getLogger(__name__)

PoolKind = Literal["thread", "process"]
_SAMPLE_CHARS = 500


class VerifierError(ReinforgeError):
    """A verifier raised or timed out and the policy is ``on_error="raise"``."""


@dataclass(frozen=True)
class VerifierOutcome:
    """One verifier call: ``status`` ``ok``, ``error`` (it raised) or ``timeout``; ``reward`` is 0
    unless ok. ``continues``: no call, the completion goes on in a later step (episodes.score_single_turn)."""

    reward: float
    status: Literal["ok", "error", "timeout", "continues"]
    result: RewardResult | None = None
    error: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class VerifierFailure:
    """A logged failure, with its sample."""

    task_id: str
    completion: str
    status: Literal["error", "timeout"]
    error: str


@dataclass(frozen=True)
class FailedReward(RewardResult):
    """The zero reward of a failed call (``on_error="zero"``): ``status`` ``error`` or ``timeout``."""

    status: str = "error"
    error: str = ""


class VerifierPool:
    """Scores ``(task, completion)`` pairs with ``verifier`` on ``workers`` threads or processes."""

    def __init__(self, verifier: Verifier, *, workers: int = 2, timeout_s: float = 60.0,
                 on_error: OnError = "raise", kind: PoolKind = "thread", name: str | None = None) -> None:
        if kind not in ("thread", "process"):
            raise ValueError(f"kind must be 'thread' or 'process', got {kind!r}")
        if workers < 1 or not timeout_s > 0:
            raise ValueError(f"need workers >= 1 and timeout_s > 0, got {workers} and {timeout_s}")
        self.verifier, self.workers, self.timeout_s, self.kind = verifier, workers, timeout_s, kind
        self.name = name or getattr(verifier, "__name__", type(verifier).__name__)
        self.stats = {"calls": 0, "errors": 0, "timeouts": 0}
        self.failures: deque[VerifierFailure] = deque(maxlen=1000)
        self.on_error = on_error
        # a step verifier's scorer (``reward.step_verifier``: process rewards), set by ``build_reward_pool``
        self.steps: StepRewards | None = None
        self._backend: _ThreadBackend | _ProcessBackend = (
            _ThreadBackend(verifier, workers, self.name) if kind == "thread" else _ProcessBackend(verifier, workers)
        )

    @property
    def on_error(self) -> OnError:
        return self._on_error

    @on_error.setter
    def on_error(self, value: OnError) -> None:
        if value not in ("zero", "raise"):
            raise ValueError(f"on_error must be 'zero' or 'raise', got {value!r}")
        self._on_error = value
        if hasattr(self.verifier, "on_error"):  # process workers get the policy with each call
            self.verifier.on_error = value

    def observe(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float]:
        """A training batch, once scored (never a held-out one), to a verifier that learns from the policy's
        samples (``observe``: a co-evolving reward model, rewards/co_evolve.py); its metrics."""
        observe = getattr(self.verifier, "observe", None)
        return observe(tasks, completions) if observe is not None else {}

    def state_dict(self) -> dict[str, Any]:
        """The verifier's state for checkpoints (a reward model's normaliser, a co-evolving one's weights)."""
        state = getattr(self.verifier, "state_dict", None)
        return state() if state is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.verifier.load_state_dict(state)

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[VerifierOutcome]:
        """One outcome per (task, completion), in order. A verifier that ``scores_groups`` (a composite
        with a group or pairwise judge term) gets one call per task id with all of its completions."""
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
        self.stats["calls"] += len(tasks)
        if getattr(self.verifier, "scores_groups", False):
            return self._score_groups(tasks, completions)
        raw = self._backend.run(list(zip(tasks, completions, strict=True)), self.timeout_s, self.on_error)
        return [self._outcome(task, completion, reply)
                for task, completion, reply in zip(tasks, completions, raw, strict=True)]

    def _score_groups(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[VerifierOutcome]:
        """The pairs grouped by task id (in order of first appearance): one ``score_group`` call each,
        whose results (or failure) go back to the group's positions."""
        groups: dict[str, list[int]] = {}
        for i, task in enumerate(tasks):
            groups.setdefault(task.id, []).append(i)
        items = [(tasks[idx[0]], CompletionGroup(completions[i] for i in idx)) for idx in groups.values()]
        raw = self._backend.run(items, self.timeout_s, self.on_error)
        outcomes: list[VerifierOutcome | None] = [None] * len(tasks)
        for idx, (status, payload, seconds, exc) in zip(groups.values(), raw, strict=True):
            for k, i in enumerate(idx):
                reply = (status, payload[k] if status == "ok" else payload, seconds, exc)
                outcomes[i] = self._outcome(tasks[i], completions[i], reply)  # type: ignore[arg-type]
        return outcomes  # type: ignore[return-value]

    def _outcome(self, task: Task, completion: str, reply: _Raw) -> VerifierOutcome:
        status, payload, seconds, exc = reply
        if status == "ok":
            return VerifierOutcome(float(payload.reward), "ok", payload, "", seconds)
        return self._failed(task, completion, status, payload, seconds, exc)

    def _failed(self, task: Task, completion: str, status: Literal["error", "timeout"], error: str,
                seconds: float, exc: BaseException | None) -> VerifierOutcome:
        self.stats["errors" if status == "error" else "timeouts"] += 1
        self.failures.append(VerifierFailure(task.id, completion, status, error))
        message = (f"verifier {self.name} {status} on task {task.id!r}: {error}; "
                   f"completion: {completion[:_SAMPLE_CHARS]!r}")
        log.warning(message)
        if self.on_error == "raise":
            raise VerifierError(message + " (with on_error 'zero' such calls score 0 and are counted)") from exc
        return VerifierOutcome(0.0, status, None, error, seconds)

    def as_verifier(self) -> Verifier:
        """This pool as a plain ``Verifier`` (task, completion) -> ``RewardResult``, for environments
        that score inside ``step`` (multi-turn episodes): every call runs in the pool with its timeout
        and the pool's ``on_error`` policy; a zeroed failure is a ``FailedReward`` (its ``status``
        and ``error`` reach the trajectory's metadata)."""

        def pooled(task: Task, completion: str) -> RewardResult:
            outcome = self.score([task], [completion])[0]
            if outcome.result is not None:
                return outcome.result
            return FailedReward(0.0, False, status=outcome.status, error=outcome.error)

        pooled.__name__ = self.name
        return pooled

    def wait_ready(self) -> None:
        """Block until every worker can take calls (process workers start in the background)."""
        self._backend.wait_ready()

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
