"""Environment calls of many episodes at once: concurrent, bounded, each with a timeout.

Agent environments wait on tools (a sandboxed program, a search, a simulated user); run one after
another, 64 episodes x a 200 ms tool is 13 s of waiting per turn. ``EnvCalls.run`` starts the calls
of one turn together, at most ``concurrency`` at a time (a call that ends frees its slot for the
next), and returns their outcomes in the order given, so an episode's result never depends on
which call finished first:

* a plain ``step`` runs in its own daemon thread (a blocking tool releases the GIL while it waits);
* an ``async def step`` (or a ``step`` returning an awaitable) runs on the calls' event loop;
* a call still running after ``timeout_s`` is abandoned: its episode ends (``EnvOutcome.timed_out``),
  never the run. Python cannot kill a thread, so a hung synchronous call keeps its thread until it
  returns (its result is dropped); an async call is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EnvOutcome:
    """One call: its value, or the exception it raised, or ``timed_out``; and how long it took."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0


@dataclass
class EnvCallStats:
    """What the calls of a collection cost: wall-clock seconds spent waiting on them (``wait_s``),
    how many ran, timed out and raised, and the most that were in flight at once."""

    wait_s: float = 0.0
    calls: int = 0
    timeouts: int = 0
    errors: int = 0
    in_flight_max: int = 0
    call_s: float = 0.0  # the calls' own durations, summed (> wait_s when they overlapped)

    def metrics(self) -> dict[str, float]:
        """Per-step metrics; those that depend on timing are under ``time/`` and ``perf/``."""
        return {"env/calls": float(self.calls), "env/timeouts": float(self.timeouts), "env/errors": float(self.errors),
                "perf/env_in_flight_max": float(self.in_flight_max), "time/env_call_s": self.call_s}


@dataclass
class EnvCalls:
    """Runs environment calls concurrently (``concurrency`` at once; 1 = one after another), each
    bounded by ``timeout_s`` (0 = none); ``stats`` accumulates over every ``run``."""

    concurrency: int = 64
    timeout_s: float = 60.0
    stats: EnvCallStats = field(default_factory=EnvCallStats)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.timeout_s < 0:
            raise ValueError(f"env calls: concurrency must be >= 1 and timeout_s >= 0, got {self.concurrency}, "
                             f"{self.timeout_s}")

    def run(self, calls: Sequence[Callable[[], Any]]) -> list[EnvOutcome]:
        """Every ``call()`` (a function of no arguments), concurrently; outcomes in the given order."""
        if not calls:
            return []
        t0 = time.perf_counter()
        outcomes = _run_coroutine(self._all(calls))
        self.stats.wait_s += time.perf_counter() - t0
        self.stats.calls += len(calls)
        self.stats.timeouts += sum(o.timed_out for o in outcomes)
        self.stats.errors += sum(o.error is not None for o in outcomes)
        self.stats.call_s += sum(o.seconds for o in outcomes)
        return outcomes

    def take_stats(self) -> EnvCallStats:
        """The stats so far, reset."""
        stats, self.stats = self.stats, EnvCallStats()
        return stats

    async def _all(self, calls: Sequence[Callable[[], Any]]) -> list[EnvOutcome]:
        slots = asyncio.Semaphore(self.concurrency)
        in_flight = [0]

        async def one(call: Callable[[], Any]) -> EnvOutcome:
            async with slots:
                in_flight[0] += 1
                self.stats.in_flight_max = max(self.stats.in_flight_max, in_flight[0])
                start = time.perf_counter()
                task = asyncio.ensure_future(_awaitable(call))
                try:
                    # asyncio.wait, not wait_for: a TimeoutError the environment raises itself (its own
                    # client's timeout) is its error, with its message, not this call running out of time
                    done, _ = await asyncio.wait({task}, timeout=self.timeout_s or None)
                    if not done:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                        return EnvOutcome(timed_out=True, seconds=time.perf_counter() - start)
                    return EnvOutcome(task.result(), seconds=time.perf_counter() - start)
                except Exception as e:
                    return EnvOutcome(error=e, seconds=time.perf_counter() - start)
                finally:
                    if not task.done():  # this wait itself was cancelled
                        task.cancel()
                    in_flight[0] -= 1

        return list(await asyncio.gather(*(one(c) for c in calls)))


async def _awaitable(call: Callable[[], Any]) -> Any:
    """``call()`` in a daemon thread of its own, or awaited on this loop if it is a coroutine function
    (or returns an awaitable)."""
    if inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(getattr(call, "func", None)):
        return await call()
    future: Future = Future()

    def target() -> None:
        try:
            value = call()
        except BaseException as e:
            value, error = None, e
        else:
            error = None
        with contextlib.suppress(InvalidStateError):  # a call past its timeout was abandoned: drop its late result
            future.set_exception(error) if error is not None else future.set_result(value)

    threading.Thread(target=target, name="reinforge-env-call", daemon=True).start()
    value = await asyncio.wrap_future(future)
    return await value if inspect.isawaitable(value) else value


def _run_coroutine(coroutine: Any) -> Any:
    """Run ``coroutine`` to the end from synchronous code, also when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as e:
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
