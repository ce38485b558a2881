"""Rollout workers as threads of the learner's process (``orchestrate.backend: thread``).

Asynchronous RL in one process: ``ThreadRolloutWorkers`` is ``RolloutWorkers`` (rollout_worker.py:
round-robin requests, the ``wait`` gate, results, recovery) with each worker a thread running the same
``worker_main``, its own ``RolloutWorkerCore`` (its own copy of the model under the run's engine,
reward pool and collector) and plain in-process queues. Torch runs an operator without the GIL, so
with one torch thread (``orchestrate.learner_threads: 1``, which the whole process uses) the learner's
update and a worker's generation compute at the same time, each on its own core; what they share is
the interpreter between two operators. Nothing is spawned and nothing is pickled: a run starts as
fast as a synchronous one.

Weights go through ``SharedWeights`` as they do to a worker process (the learner copies its
parameters in after each update; a worker copies them into its engine between decode steps, or
before each request with ``weight_update: wait``): the learner never waits for a worker, and a
worker never samples from tensors the optimizer is writing. A worker whose request raises fails the
run with its traceback.
"""

from __future__ import annotations

import queue
import threading

from reinforge.orchestrate.rollout_worker import RolloutWorkers, worker_main


class ThreadRolloutWorkers(RolloutWorkers):
    """``RolloutWorkers`` over worker threads of this process."""

    NAME = "rollout thread"

    def _queue(self) -> queue.Queue:
        return queue.Queue()

    def _worker(self, args: tuple, name: str) -> threading.Thread:
        return threading.Thread(target=worker_main, args=(*args, False), name=name, daemon=True)  # own_process=False

    def close(self) -> None:
        """Each thread ends after its request in progress (a thread cannot be killed)."""
        for q in self.queues:
            q.put(None)
        for thread in self.procs:
            thread.join(timeout=30)
