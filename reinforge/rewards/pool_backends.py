"""The worker backends of ``VerifierPool`` (``reinforge.rewards.pool``): threads and spawned processes.

Each runs a batch of ``(task, completion)`` calls with a per-call timeout and reports every call as
``_Raw``: (status ``ok``/``error``/``timeout``, the ``RewardResult`` or the error text, seconds, the
exception or None). A call whose completion is a ``CompletionGroup`` is one ``score_group`` call for
the whole group (its payload: a list of RewardResults). The pool turns these into outcomes and applies the ``on_error`` policy.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import pickle
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections
from typing import Any, Literal

from reinforge.errors import ReinforgeError
from reinforge.rewards.verifiers import RewardResult, Verifier
from reinforge.types import Task

OnError = Literal["raise", "zero"]
# A backend runs calls and reports (status, RewardResult or error text, seconds, exception or None).
_Raw = tuple[Literal["ok", "error", "timeout"], Any, float, BaseException | None]


class CompletionGroup(tuple):
    """The completions of one task handed to a group-scoring verifier as one call (``score_group``)."""

    __slots__ = ()


def _invoke(verifier: Any, task: Task, completion: str | CompletionGroup) -> RewardResult | list[RewardResult]:
    """``verifier(task, completion)``, or ``verifier.score_group(task, completions)`` for a
    ``CompletionGroup``: a RewardResult (a list of one per completion), else TypeError."""
    if isinstance(completion, CompletionGroup):
        results = verifier.score_group(task, list(completion))
        if not isinstance(results, list) or len(results) != len(completion) or not all(
                isinstance(r, RewardResult) for r in results):
            raise TypeError(f"score_group did not return {len(completion)} RewardResults")
        return results
    result = verifier(task, completion)
    if not isinstance(result, RewardResult):
        raise TypeError(f"returned {type(result).__name__}, not a RewardResult")
    return result


_Item = tuple[Task, "str | CompletionGroup"]


# ----------------------------------------------------------------------------------------------
# Threads


class _ThreadBackend:
    """``workers`` long-lived daemon threads take calls from one queue, shared by every batch, also by
    batches from several threads at once (environments scoring inside concurrent steps). A call past its
    timeout frees its slot: its thread is abandoned (Python cannot kill it; its late result is dropped
    and it exits after the call) and a fresh thread takes its place. A call costs a queue round trip,
    not a thread start (benchmarks/bench_reward_pool.py)."""

    def __init__(self, verifier: Verifier, workers: int, name: str) -> None:
        self.verifier, self.workers, self.name = verifier, workers, name
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._live: set[int] = set()  # ids of the threads that take calls (not abandoned, not closed)
        self._running: dict[int, dict[int, tuple[float, int]]] = {}  # batch -> item -> (start, thread id)
        self._next_thread = 0
        self._closed = False

    def run(self, items: list[_Item], timeout_s: float, on_error: OnError) -> list[_Raw]:
        """The timeout counts from when a call starts running, not from submission."""
        self._closed = False
        self._fill()
        results: queue.Queue = queue.Queue()
        batch = id(results)
        with self._lock:
            self._running[batch] = {}
        for i, (task, completion) in enumerate(items):
            self._jobs.put((batch, i, task, completion, results))
        raw: list[_Raw | None] = [None] * len(items)
        left = set(range(len(items)))
        while left:
            try:
                i, reply = results.get(timeout=self._wait_s(batch, timeout_s))
                if i in left:
                    raw[i] = reply
                    left.discard(i)
            except queue.Empty:
                if self._closed:
                    for i in left:
                        raw[i] = ("error", "the reward pool was closed before this call ran", 0.0, None)
                    left.clear()
            for i in self._timed_out(batch, timeout_s):
                raw[i] = ("timeout", f"no result after {timeout_s:g}s", timeout_s, None)
                left.discard(i)
        with self._lock:
            del self._running[batch]
        return raw  # type: ignore[return-value]

    def _wait_s(self, batch: int, timeout_s: float) -> float:
        """Until the earliest deadline of this batch's running calls (or a short poll while none runs)."""
        now = time.monotonic()
        with self._lock:
            starts = [start for start, _ in self._running[batch].values()]
        return max(0.0, min((s + timeout_s - now for s in starts), default=0.05))

    def _timed_out(self, batch: int, timeout_s: float) -> list[int]:
        """This batch's calls past their timeout; each one's thread is abandoned and replaced."""
        now = time.monotonic()
        with self._lock:
            running = self._running[batch]
            out = [i for i, (start, _) in running.items() if now - start > timeout_s]
            for i in out:
                self._live.discard(running.pop(i)[1])
        if out:
            self._fill()
        return out

    def _fill(self) -> None:
        """Start threads until ``workers`` take calls."""
        with self._lock:
            while len(self._live) < self.workers:
                self._next_thread += 1
                self._live.add(self._next_thread)
                threading.Thread(target=self._serve, args=(self._next_thread,), daemon=True,
                                 name=f"verifier-{self.name}").start()

    def _serve(self, me: int) -> None:
        """A worker thread: calls until it is abandoned (its call timed out) or the pool closes (it then
        leaves within a second)."""
        while True:
            try:
                job = self._jobs.get(timeout=1.0)
            except queue.Empty:
                with self._lock:
                    if me not in self._live:
                        return
                continue
            batch, i, task, completion, results = job
            with self._lock:
                if me not in self._live:  # closed or abandoned meanwhile: hand the call back
                    self._jobs.put(job)
                    return
                if batch not in self._running:  # its batch has ended (the pool was closed under it)
                    continue
                self._running[batch][i] = (time.monotonic(), me)
            reply = self._call(task, completion)
            with self._lock:
                if me not in self._live:
                    return  # past its timeout: the batch has moved on, another thread took this one's place
                self._running[batch].pop(i, None)
            results.put((i, reply))

    def wait_ready(self) -> None:
        pass

    def _call(self, task: Task, completion: str | CompletionGroup) -> _Raw:
        start = time.monotonic()
        try:
            return ("ok", _invoke(self.verifier, task, completion), time.monotonic() - start, None)
        except Exception as exc:
            return ("error", f"{type(exc).__name__}: {exc}", 0.0, exc)

    def close(self) -> None:
        with self._lock:
            self._live, self._closed = set(), True


# ----------------------------------------------------------------------------------------------
# Processes


def _worker_main(conn: Connection, payload: bytes) -> None:
    """A worker process: unpickle the verifier once, then answer (task, completion, on_error) calls."""
    verifier = pickle.loads(payload)
    conn.send(("ready", None, 0.0))
    while True:
        try:
            task, completion, on_error = conn.recv()
        except (EOFError, OSError):
            return
        if hasattr(verifier, "on_error"):
            verifier.on_error = on_error
        start = time.monotonic()
        try:
            reply: tuple = ("ok", _invoke(verifier, task, completion), time.monotonic() - start)
        except Exception as exc:  # reported to the parent, which applies the policy
            reply = ("error", f"{type(exc).__name__}: {exc}", time.monotonic() - start)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("error", f"the verifier's result does not pickle: {exc}", time.monotonic() - start))


@contextlib.contextmanager
def _may_start_children() -> Iterator[None]:
    """Let a daemonic process (an async rollout worker) start the pool's workers: multiprocessing
    refuses children to a process whose own ``daemon`` flag is set. The flag is lifted in this
    process only while starting them (the parent's view of it is unchanged, so the parent still ends
    it at exit), and the workers are daemonic and leave when their pipe closes with this process."""
    current = mp.current_process()
    if not current.daemon:
        yield
        return
    current.daemon = False
    try:
        yield
    finally:
        current.daemon = True


@dataclass
class _Worker:
    process: Any
    conn: Connection
    started: float
    ready: bool = False


class _ProcessBackend:
    """One call in flight per worker process, so a call's timeout counts from its start; a call past
    its timeout (or whose worker died) kills that worker and a fresh one takes its place. A worker
    takes calls once it reports ready (its start-up does not count against any call's timeout).
    Batches from several threads at once (environments scoring inside concurrent steps) take turns:
    the workers' pipes carry one batch at a time."""

    STARTUP_TIMEOUT_S = 120.0

    def __init__(self, verifier: Verifier, workers: int) -> None:
        try:
            self._payload = pickle.dumps(verifier)
        except Exception as exc:
            raise ValueError(f"a process VerifierPool needs a verifier that pickles: {exc} "
                             "(use kind='thread', or a module-level function)") from exc
        self._ctx = mp.get_context("spawn")  # never fork a process that runs torch threads
        self._workers = [self._start() for _ in range(workers)]
        self._batch_lock = threading.Lock()

    def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(child, self._payload), daemon=True,
                                    name="reinforge-verifier")
        with _may_start_children():
            process.start()
        child.close()
        return _Worker(process, parent, time.monotonic())

    def _replace(self, worker: _Worker) -> _Worker:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()
        fresh = self._start()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def run(self, items: list[_Item], timeout_s: float, on_error: OnError) -> list[_Raw]:
        with self._batch_lock:
            return self._run(items, timeout_s, on_error)

    def _run(self, items: list[_Item], timeout_s: float, on_error: OnError) -> list[_Raw]:
        raw: list[_Raw | None] = [None] * len(items)
        queue = deque(range(len(items)))
        idle = [w for w in self._workers if w.ready]
        starting = {w.conn: w for w in self._workers if not w.ready}
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        while queue or busy:
            while queue and idle:
                worker, i = idle.pop(), queue.popleft()
                task, completion = items[i]
                worker.conn.send((task, completion, on_error))
                busy[worker.conn] = (worker, i, time.monotonic())
            deadlines = [start + timeout_s for _, _, start in busy.values()]
            deadlines += [w.started + self.STARTUP_TIMEOUT_S for w in starting.values()]
            ready = wait_connections([*busy, *starting], timeout=max(min(deadlines) - time.monotonic(), 0.0))
            for conn in ready:
                if conn in starting:
                    worker = starting.pop(conn)  # type: ignore[arg-type]
                    self._check_ready(worker)
                    idle.append(worker)
                    continue
                worker, i, start = busy.pop(conn)  # type: ignore[arg-type]
                try:
                    status, payload, seconds = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    worker.process.join(5.0)  # the pipe closes before the exit status is reapable
                    code = worker.process.exitcode
                    raw[i] = ("error", f"the verifier's worker process died (exit code {code})",
                              time.monotonic() - start, None)
                    fresh = self._replace(worker)
                    starting[fresh.conn] = fresh
                    continue
                raw[i] = (status, payload, seconds, None)
                idle.append(worker)
            now = time.monotonic()
            for conn, (worker, i, start) in list(busy.items()):
                if now - start > timeout_s:
                    del busy[conn]
                    raw[i] = ("timeout", f"no result after {timeout_s:g}s (worker killed)", now - start, None)
                    fresh = self._replace(worker)
                    starting[fresh.conn] = fresh
            for worker in starting.values():
                if now - worker.started > self.STARTUP_TIMEOUT_S:
                    raise ReinforgeError(f"a verifier worker process did not start in {self.STARTUP_TIMEOUT_S:g}s")
        return raw  # type: ignore[return-value]

    def wait_ready(self) -> None:
        for worker in self._workers:
            if not worker.ready:
                if not worker.conn.poll(max(worker.started + self.STARTUP_TIMEOUT_S - time.monotonic(), 0.0)):
                    raise ReinforgeError(f"a verifier worker process did not start in {self.STARTUP_TIMEOUT_S:g}s")
                self._check_ready(worker)

    def _check_ready(self, worker: _Worker) -> None:
        try:
            status, _, _ = worker.conn.recv()
        except (EOFError, OSError):
            status = "died"
        if status != "ready":
            worker.process.join(5.0)
            raise ReinforgeError(
                f"a verifier worker process failed to start (exit code {worker.process.exitcode}): the verifier "
                "could not be unpickled in a fresh interpreter; is it defined in an importable module?"
            )
        worker.ready = True

    def close(self) -> None:
        for worker in self._workers:
            worker.conn.close()
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join(timeout=5)
