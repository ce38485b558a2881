"""Rollout worker processes for asynchronous RL (the ``local`` backend).

A worker owns a rollout engine (its own copy of the model, weights from ``SharedWeights``), the
environment and the reward; it takes ``RolloutRequest``s (the tasks of one rollout batch) from its
queue and returns ``RolloutResult``s (scored trajectories, or the error that stopped it). With
``weight_update: inflight`` the engine polls the shared weights between decode steps; with
``wait`` it takes them before each request.

``RolloutWorkers`` (in the learner process) starts the workers (spawned: never fork a process
running torch threads), assigns requests round-robin, restarts a worker that died and re-issues
the requests it held, and never waits forever: ``next_result`` raises after ``timeout_s``.

``wait`` samples every request with exactly the weights that were published when it was
submitted (its admission version), whatever the timing: a worker counts the requests it has
started (weights taken), and ``publish`` first waits until every request submitted so far has
started. Without that gate a worker descheduled between two requests would take weights published
meanwhile, and an uninterrupted run would depend on timing (so could not be resumed bit-exactly).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

from reinforge.config import RunConfig
from reinforge.errors import ReinforgeError
from reinforge.orchestrate.shared_weights import SharedWeights
from reinforge.types import Task, Trajectory


@dataclass
class RolloutRequest:
    update: int  # the learner update that will consume this batch (1-based); its step number resets the environments
    tasks: list[Task]
    on_error: str = "raise"  # the reward pool's policy for this batch
    min_version: int = 0  # admission control: sample with weights of at least this version
    round: int = 1  # > 1: a further round of dynamic sampling for the same update
    group_offset: int = 0  # group id of the first task
    sizes: list[int] | None = None  # samples per task (a rollout budget's); None: rollout.group_size each

    @property
    def key(self) -> tuple[int, int]:
        return self.update, self.round


@dataclass
class RolloutResult:
    update: int
    worker: int
    trajectories: list[Trajectory] = field(default_factory=list)
    generate_s: float = 0.0
    reward_s: float = 0.0
    env_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    baseline: list[float] | None = None  # per task: its greedy reward, when the advantage needs a baseline
    round: int = 1

    @property
    def key(self) -> tuple[int, int]:
        return self.update, self.round


def request_seed(run_seed: int, update: int, round_: int) -> int:
    """The sampling seed of the request for ``update`` (its ``round_``-th round) of the run seeded ``run_seed``."""
    return (run_seed * 1_000_003 + update * 1_009 + round_) % (2**63)


class RolloutWorkerCore:
    """What a rollout worker runs, whatever hosts it (a process here, a Ray actor): its
    ``components.RolloutSide`` (the engine on its own model copy, the reward pool, the run's collector),
    one round per ``run`` (``batch_sources.sample_round``, as in the synchronous loop)."""

    def __init__(self, worker_id: int, cfg: RunConfig, own_process: bool = True) -> None:
        """``own_process=False``: a thread of the learner's process (``thread_workers.py``), which keeps the
        process's torch threads and global random state as the learner set them."""
        from reinforge.orchestrate.batch_sources import needs_greedy_baseline
        from reinforge.orchestrate.components import build_rollout_side

        seed = cfg.seed + 1000 * (worker_id + 1)
        if own_process:
            torch.set_num_threads(cfg.orchestrate.rollout_threads)
            torch.manual_seed(seed)
        self.worker_id, self.cfg = worker_id, cfg
        self.side = build_rollout_side(cfg, seed)  # replicable engine: the config checks it
        self.engine, self.collector, self.params = self.side.engine, self.side.collector, self.side.params
        self.engine.version = -1  # until the learner's weights arrive
        self.with_baseline = needs_greedy_baseline(cfg.algo)

    def run(self, request: RolloutRequest) -> RolloutResult:
        from reinforge.orchestrate.batch_sources import sample_round

        try:
            self.side.pool.on_error = request.on_error  # type: ignore[assignment]
            # Each request samples from its own stream, whichever worker runs it and whatever it ran
            # before: a resumed run (fresh workers) samples exactly what the interrupted one would have.
            self.engine.generator.manual_seed(request_seed(self.cfg.seed, request.update, request.round))
            r = sample_round(self.collector, request.tasks, self.params, request.update, request.group_offset,
                             self.with_baseline, request.sizes)
            return RolloutResult(request.update, self.worker_id, r.trajectories, r.generate_s, r.reward_s, r.env_s,
                                 r.metrics, baseline=r.baseline, round=request.round)
        except Exception:
            return RolloutResult(request.update, self.worker_id, error=traceback.format_exc(), round=request.round)

    def close(self) -> None:
        self.side.close()


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the learner process dies, even by SIGKILL (a worker
    blocked on its request queue would otherwise outlive a crashed run)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import os
    import signal

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the learner died before the line above
        os._exit(1)


def worker_main(worker_id: int, cfg: RunConfig, shared: SharedWeights, requests: mp.Queue, results: mp.Queue,
                started, own_process: bool = True) -> None:
    """The worker process (``own_process=False``: a thread of the learner's, ``thread_workers.py``): build the
    core, then serve requests until None (or until the learner dies); ``started`` counts the requests begun,
    each after taking the weights it samples with."""
    if own_process:
        _die_with_parent()
    try:
        core = RolloutWorkerCore(worker_id, cfg, own_process)
        shared.sync_engine(core.engine)
        inflight = cfg.orchestrate.weight_update == "inflight"
        if inflight:
            core.engine.weight_poll = lambda: (shared.sync_engine(core.engine), None)[1]
    except Exception:
        results.put(RolloutResult(-1, worker_id, error=traceback.format_exc()))
        return
    results.put(RolloutResult(0, worker_id))  # ready
    while True:
        request = requests.get()
        if request is None:
            core.close()
            return
        if not inflight:
            shared.sync_engine(core.engine)
        started.value += 1
        results.put(core.run(request))


class RolloutWorkers:
    """The learner side: worker processes, their queues, and recovery from a dead worker."""

    READY_TIMEOUT_S = 300.0
    NAME = "rollout worker"  # in messages

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, version: int) -> None:
        self.cfg = cfg
        self.shared = SharedWeights(model)
        self.shared.publish(model, version)
        self._ctx = mp.get_context("spawn")
        self.results = self._queue()
        self.procs: list = [None] * cfg.orchestrate.rollout_workers
        self.queues: list = [None] * cfg.orchestrate.rollout_workers
        self.assigned: list[dict[tuple[int, int], RolloutRequest]] = [{} for _ in range(cfg.orchestrate.rollout_workers)]
        self.started: list = [None] * cfg.orchestrate.rollout_workers  # per worker: requests begun (shared)
        self.sent: list[int] = [0] * cfg.orchestrate.rollout_workers  # per worker: requests put on its queue
        self.restarts = 0
        self._next = 0
        self._early: list[RolloutResult] = []
        for i in range(cfg.orchestrate.rollout_workers):
            self._start(i)
        self._wait_ready(set(range(cfg.orchestrate.rollout_workers)))

    def _queue(self):
        return self._ctx.Queue()

    def _worker(self, args: tuple, name: str):
        """A worker running ``worker_main(*args)``, not yet started: here a spawned process."""
        return self._ctx.Process(target=worker_main, args=args, name=name, daemon=True)

    def _start(self, i: int) -> None:
        self.queues[i] = self._queue()
        self.started[i], self.sent[i] = self._ctx.Value("q", 0, lock=False), 0
        self.procs[i] = self._worker((i, self.cfg, self.shared, self.queues[i], self.results, self.started[i]),
                                     f"reinforge-rollout-{i}")
        self.procs[i].start()

    def _wait_ready(self, waiting: set[int]) -> None:
        deadline = time.monotonic() + self.READY_TIMEOUT_S
        while waiting:
            try:
                result = self.results.get(timeout=1.0)
            except queue.Empty:
                for i in waiting:
                    if not self.procs[i].is_alive():
                        raise ReinforgeError(f"{self.NAME} {i} exited while starting "
                                             f"(exit code {getattr(self.procs[i], 'exitcode', None)})") from None
                if time.monotonic() > deadline:
                    raise ReinforgeError(f"rollout workers {sorted(waiting)} did not start in "
                                         f"{self.READY_TIMEOUT_S:g}s") from None
                continue
            if result.error is not None:
                raise ReinforgeError(f"{self.NAME} {result.worker} failed to start:\n{result.error}")
            if result.update == 0 and result.worker in waiting:
                waiting.discard(result.worker)
            else:
                self._early.append(result)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """New weights for every worker (they take them between decode steps or requests); with
        ``wait``, only once every request submitted so far has taken the weights it was admitted for."""
        if self.cfg.orchestrate.weight_update == "wait":
            self._wait_started(self.cfg.orchestrate.timeout_s)
        self.shared.publish(model, version)

    def _wait_started(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(started.value < sent for started, sent in zip(self.started, self.sent, strict=True)):
            if time.monotonic() > deadline:
                raise ReinforgeError(f"rollout workers did not start their requests in {timeout_s:g}s "
                                     f"(orchestrate.timeout_s); started {[s.value for s in self.started]} of "
                                     f"{self.sent}; workers alive: {[p.is_alive() for p in self.procs]}")
            self._recover()
            time.sleep(0.0005)

    def submit(self, request: RolloutRequest) -> None:
        i = self._next % len(self.procs)
        self._next += 1
        self.assigned[i][request.key] = request
        self._put(i, request)

    def _put(self, i: int, request: RolloutRequest) -> None:
        self.sent[i] += 1
        self.queues[i].put(request)

    def next_result(self, timeout_s: float) -> RolloutResult:
        """The next finished batch; restarts dead workers (re-issuing their requests) meanwhile."""
        if self._early:
            return self._take(self._early.pop(0))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = self.results.get(timeout=max(min(0.5, deadline - time.monotonic()), 0.001))
            except queue.Empty:
                self._recover()
                if time.monotonic() > deadline:
                    waiting = sorted(u for a in self.assigned for u in a)
                    raise ReinforgeError(f"no rollout batch arrived in {timeout_s:g}s (orchestrate.timeout_s); "
                                         f"waiting for updates {waiting}; workers alive: "
                                         f"{[p.is_alive() for p in self.procs]}") from None
                continue
            if result.update == 0:  # a restarted worker is ready
                continue
            if result.error is not None:
                raise ReinforgeError(f"{self.NAME} {result.worker} failed on the batch for update "
                                     f"{result.update}:\n{result.error}")
            return self._take(result)

    def _take(self, result: RolloutResult) -> RolloutResult:
        self.assigned[result.worker].pop(result.key, None)
        return result

    def _recover(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.is_alive():
                continue
            self.restarts += 1
            lost = sorted(self.assigned[i].values(), key=lambda r: r.key)
            self._start(i)
            for request in lost:
                self._put(i, request)

    def close(self) -> None:
        for q in self.queues:
            try:
                q.put(None)
            except (ValueError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
