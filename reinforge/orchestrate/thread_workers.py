"""Rollout workers as threads of the learner's process (``orchestrate.backend: thread``).

Asynchronous RL in one process: each worker is a thread with its own ``RolloutWorkerCore`` (its own
copy of the model under the run's engine, reward pool and collector) that takes ``RolloutRequest``s
from its queue and puts ``RolloutResult``s on a shared one, as a worker process does
(``rollout_worker.py``). Torch runs an operator without the GIL, so with one torch thread
(``orchestrate.learner_threads: 1``, which the whole process uses) the learner's update and a
worker's generation compute at the same time, each on its own core; what they share is the
interpreter between two operators. Nothing is spawned and nothing is pickled: a run starts as fast
as a synchronous one.

Weights go through ``SharedWeights`` as they do to a worker process (the learner copies its
parameters in after each update; a worker copies them into its engine between decode steps, or
before each request with ``weight_update: wait``): the learner never waits for a worker, and a
worker never samples from tensors the optimizer is writing. A worker that raises fails the run with
its traceback; a thread cannot be killed from outside, so there are no restarts.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback

import torch

from reinforge.config import RunConfig
from reinforge.errors import ReinforgeError
from reinforge.orchestrate.rollout_worker import RolloutRequest, RolloutResult, RolloutWorkerCore
from reinforge.orchestrate.shared_weights import SharedWeights


class ThreadRolloutWorkers:
    """The learner side of the thread backend: ``RolloutWorkers``' interface (``publish``, ``submit``,
    ``next_result``, ``close``, ``restarts``) over worker threads."""

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, version: int) -> None:
        self.cfg, self.restarts = cfg, 0
        self.shared = SharedWeights(model)
        self.shared.publish(model, version)
        self.results: queue.Queue[RolloutResult] = queue.Queue()
        n = cfg.orchestrate.rollout_workers
        self.queues: list[queue.Queue[RolloutRequest | None]] = [queue.Queue() for _ in range(n)]
        self.started, self.sent = [0] * n, [0] * n  # per worker: requests begun (weights taken), requests sent
        self._next = 0
        cores = [RolloutWorkerCore(i, cfg, own_process=False) for i in range(n)]
        for core in cores:
            self.shared.sync_engine(core.engine)
        self.threads = [threading.Thread(target=self._serve, args=(i, core), name=f"reinforge-rollout-{i}",
                                         daemon=True) for i, core in enumerate(cores)]
        for thread in self.threads:
            thread.start()

    def _serve(self, i: int, core: RolloutWorkerCore) -> None:
        """Worker ``i``'s thread: serve requests until None."""
        inflight = self.cfg.orchestrate.weight_update == "inflight"
        if inflight:
            core.engine.weight_poll = lambda: (self.shared.sync_engine(core.engine), None)[1]
        try:
            while (request := self.queues[i].get()) is not None:
                if not inflight:
                    self.shared.sync_engine(core.engine)
                self.started[i] += 1
                self.results.put(core.run(request))
        except Exception:  # core.run reports its own errors; this is the weights' copy failing
            self.results.put(RolloutResult(-1, i, error=traceback.format_exc()))
        finally:
            core.close()

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """New weights for every worker; with ``wait``, once every request sent so far has taken its own."""
        if self.cfg.orchestrate.weight_update == "wait":
            deadline = time.monotonic() + self.cfg.orchestrate.timeout_s
            while any(s < n for s, n in zip(self.started, self.sent, strict=True)):
                if time.monotonic() > deadline:
                    raise ReinforgeError(f"rollout threads did not start their requests in "
                                         f"{self.cfg.orchestrate.timeout_s:g}s (orchestrate.timeout_s); started "
                                         f"{self.started} of {self.sent}")
                time.sleep(0.0005)
        self.shared.publish(model, version)

    def submit(self, request: RolloutRequest) -> None:
        i = self._next % len(self.threads)
        self._next += 1
        self.sent[i] += 1
        self.queues[i].put(request)

    def next_result(self, timeout_s: float) -> RolloutResult:
        """The next finished batch; a worker's error fails the run with its traceback."""
        try:
            result = self.results.get(timeout=timeout_s)
        except queue.Empty:
            raise ReinforgeError(f"no rollout batch arrived in {timeout_s:g}s (orchestrate.timeout_s); rollout "
                                 f"threads alive: {[t.is_alive() for t in self.threads]}") from None
        if result.error is not None:
            raise ReinforgeError(f"rollout thread {result.worker} failed on the batch for update "
                                 f"{result.update}:\n{result.error}")
        return result

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for thread in self.threads:
            thread.join(timeout=30)
