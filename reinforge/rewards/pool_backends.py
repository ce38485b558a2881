"""The worker backends of ``VerifierPool`` (``reinforge.rewards.pool``): threads and spawned processes.

Each runs a batch of ``(task, completion)`` calls with a per-call timeout and reports every call as
``_Raw``: (status ``ok``/``error``/``timeout``, the ``RewardResult`` or the error text, seconds, the
exception or None). The pool turns these into outcomes and applies the ``on_error`` policy.
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


# ----------------------------------------------------------------------------------------------
# Threads


class _ThreadBackend:
    """Each call runs in a daemon thread of its own, at most ``workers`` at once: the slots are shared
    by every batch, also by batches from several threads at once (environments scoring inside
    concurrent steps). A call past its timeout frees its slot; its thread is left behind (Python
    cannot kill it) and its late result is dropped."""

    def __init__(self, verifier: Verifier, workers: int, name: str) -> None:
        self.verifier, self.workers, self.name = verifier, workers, name
        self._slots = threading.Semaphore(workers)

    def run(self, items: list[tuple[Task, str]], timeout_s: float, on_error: OnError) -> list[_Raw]:
        """The timeout counts from when a call starts running, not from submission."""
        results: queue.Queue = queue.Queue()
        raw: list[_Raw | None] = [None] * len(items)
        running: dict[int, float] = {}
        next_item = 0
        while next_item < len(items) or running:
            while next_item < len(items) and self._slots.acquire(blocking=False):
                running[next_item] = time.monotonic()
                threading.Thread(target=self._call, args=(next_item, *items[next_item], results), daemon=True,
                                 name=f"verifier-{self.name}").start()
                next_item += 1
            now = time.monotonic()
            wait_s = min((start + timeout_s - now for start in running.values()), default=0.01)
            if next_item < len(items):
                wait_s = min(wait_s, 0.01)  # waiting for a free slot
            try:
                i, reply = results.get(timeout=max(wait_s, 0.0))
                if running.pop(i, None) is not None:
                    raw[i] = reply
                    self._slots.release()
            except queue.Empty:
                pass
            now = time.monotonic()
            for i, start in list(running.items()):
                if now - start > timeout_s:
                    del running[i]
                    raw[i] = ("timeout", f"no result after {timeout_s:g}s", now - start, None)
                    self._slots.release()
        return raw  # type: ignore[return-value]

    def wait_ready(self) -> None:
        pass

    def _call(self, i: int, task: Task, completion: str, results: queue.Queue) -> None:
        start = time.monotonic()
        try:
            result = self.verifier(task, completion)
            if not isinstance(result, RewardResult):
                raise TypeError(f"returned {type(result).__name__}, not a RewardResult")
            results.put((i, ("ok", result, time.monotonic() - start, None)))
        except Exception as exc:
            results.put((i, ("error", f"{type(exc).__name__}: {exc}", 0.0, exc)))

    def close(self) -> None:
        pass


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
            result = verifier(task, completion)
            if not isinstance(result, RewardResult):
                raise TypeError(f"returned {type(result).__name__}, not a RewardResult")
            reply: tuple = ("ok", result, time.monotonic() - start)
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

    def run(self, items: list[tuple[Task, str]], timeout_s: float, on_error: OnError) -> list[_Raw]:
        with self._batch_lock:
            return self._run(items, timeout_s, on_error)

    def _run(self, items: list[tuple[Task, str]], timeout_s: float, on_error: OnError) -> list[_Raw]:
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
