"""The ``ray`` backend of asynchronous RL: rollout workers as Ray actors.

Same contract as ``RolloutWorkers`` (``submit``, ``next_result``, ``publish``, ``restarts``,
``close``), so ``WorkerBatches`` runs unchanged. Each actor hosts a ``RolloutWorkerCore``; new weights
go into Ray's object store once per update (``ray.put`` of the parameters) and every actor gets
the reference. Actors have two concurrency groups (one thread each), so ``set_weights`` runs while
a ``generate`` is under way: with ``weight_update: inflight`` the engine applies the weights
between two decode steps. Calls in different groups are not ordered, so a ``generate`` may arrive
before the ``set_weights`` the learner sent first: it waits until the actor holds weights of the
request's ``min_version`` (admission control). With ``wait`` every request carries the reference
of the weights published when it was submitted (its admission version) and samples with exactly
those, whatever the timing, as the ``local`` backend does.

``ray.init()`` starts a local Ray when ``orchestrate.ray_address`` is unset (this machine: about
5 s and 0.5-0.9 GB), or joins the cluster at that address. Ray is an optional extra, imported here
only. A dead actor is replaced and its requests re-issued, as for processes.
"""

from __future__ import annotations

import threading
import time

import torch

from reinforge.config import RunConfig
from reinforge.errors import ReinforgeError
from reinforge.learn.lora import merged_weights
from reinforge.orchestrate.rollout_worker import RolloutRequest, RolloutResult, RolloutWorkerCore


def _ray():
    try:
        import ray
    except ImportError:
        raise ReinforgeError("orchestrate.backend=ray needs Ray: pip install 'reinforge[ray]'") from None
    return ray


class RolloutActor:
    """A Ray actor around ``RolloutWorkerCore``. ``set_weights`` and ``generate`` run in separate
    concurrency groups (one thread each), so new weights are taken while a batch is generated and
    batches never run two at a time on one engine."""

    def __init__(self, worker_id: int, cfg: RunConfig) -> None:
        self.core = RolloutWorkerCore(worker_id, cfg)
        self.inflight = cfg.orchestrate.weight_update == "inflight"
        self.timeout_s = cfg.orchestrate.timeout_s
        self._waiting: tuple | None = None
        self._received = threading.Condition()
        self._latest = self.core.engine.version  # the newest version received

    def ready(self) -> int:
        return self.core.worker_id

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        with self._received:
            if version <= self._latest:
                return
            if self.inflight:
                self.core.engine.stage_weights(state, version)
            else:
                self._waiting = (state, version)
            self._latest = version
            self._received.notify_all()

    def generate(self, request: RolloutRequest, weights: tuple[list, int] | None = None) -> RolloutResult:
        """One round; ``weights`` (``wait``): ``([state or its object reference], version)`` to sample with."""
        if weights is not None:
            (state,), version = weights
            if version != self.core.engine.version:
                self.core.engine.update_weights(state if isinstance(state, dict) else _ray().get(state), version)
            return self.core.run(request)
        with self._received:
            if not self._received.wait_for(lambda: self._latest >= request.min_version, self.timeout_s):
                return RolloutResult(request.update, self.core.worker_id,
                                     error=f"weights of version {request.min_version} did not arrive in "
                                           f"{self.timeout_s:g}s (orchestrate.timeout_s); newest: {self._latest}")
            waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self.core.engine.update_weights(*waiting)
        return self.core.run(request)  # staged in-flight weights are applied as generation starts


def _remote_actor_class(ray):
    """``RolloutActor`` as a Ray actor class with its two concurrency groups."""
    methods = {"set_weights": "weights", "generate": "rollout", "ready": "rollout"}
    cls = type("RayRolloutActor", (RolloutActor,), {
        name: ray.method(concurrency_group=group)(getattr(RolloutActor, name)) for name, group in methods.items()
    })
    return ray.remote(num_cpus=1, concurrency_groups={"weights": 1, "rollout": 1})(cls)


class RayRolloutWorkers:
    def __init__(self, cfg: RunConfig, model: torch.nn.Module, version: int) -> None:
        ray = self.ray = _ray()
        self.cfg = cfg
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            if cfg.orchestrate.ray_address:
                ray.init(address=cfg.orchestrate.ray_address)
            else:
                ray.init(num_cpus=max(2, cfg.orchestrate.rollout_workers), include_dashboard=False,
                         log_to_driver=False)
        self._actor_cls = _remote_actor_class(ray)
        self.actors = [self._new_actor(i) for i in range(cfg.orchestrate.rollout_workers)]
        self.pending: dict = {}  # object ref -> (actor index, request)
        self.restarts = 0
        self._next = 0
        self._weights: tuple | None = None
        self.inflight = cfg.orchestrate.weight_update == "inflight"
        self.publish(model, version)

    def _new_actor(self, i: int):
        actor = self._actor_cls.remote(i, self.cfg)
        self.ray.get(actor.ready.remote())
        return actor

    def publish(self, model: torch.nn.Module, version: int) -> None:
        state = {name: p.detach().clone() for name, p in merged_weights(model).items()}
        self._weights = (self.ray.put(state), version)
        if self.inflight:  # wait: each request carries its admission version's reference instead
            for actor in self.actors:
                actor.set_weights.remote(*self._weights)

    def submit(self, request: RolloutRequest) -> None:
        i = self._next % len(self.actors)
        self._next += 1
        self._generate(i, request)

    def _generate(self, i: int, request: RolloutRequest) -> None:
        """Hand ``request`` to actor ``i``; with ``wait``, with the weights published now (by reference)."""
        weights = None if self.inflight or self._weights is None else ([self._weights[0]], self._weights[1])
        self.pending[self.actors[i].generate.remote(request, weights)] = (i, request)

    def next_result(self, timeout_s: float) -> RolloutResult:
        ray = self.ray
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = sorted(r.update for _, r in self.pending.values())
                raise ReinforgeError(f"no rollout batch arrived in {timeout_s:g}s (orchestrate.timeout_s); "
                                     f"waiting for updates {waiting}")
            done, _ = ray.wait(list(self.pending), num_returns=1, timeout=min(remaining, 1.0))
            if not done:
                continue
            ref = done[0]
            i, request = self.pending.pop(ref)
            try:
                result: RolloutResult = ray.get(ref)
            except ray.exceptions.RayActorError:
                self._replace(i, request)
                continue
            if result.error is not None:
                raise ReinforgeError(f"rollout actor {i} failed on the batch for update {result.update}:\n"
                                     f"{result.error}")
            return result

    def _replace(self, i: int, failed: RolloutRequest) -> None:
        """A dead actor: a fresh one with the latest weights takes its requests."""
        self.restarts += 1
        lost = [failed] + [r for ref, (j, r) in list(self.pending.items()) if j == i]
        self.pending = {ref: v for ref, v in self.pending.items() if v[0] != i}
        self.actors[i] = self._new_actor(i)
        if self._weights is not None and self.inflight:
            self.actors[i].set_weights.remote(*self._weights)
        for request in sorted(lost, key=lambda r: r.update):
            self._generate(i, request)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        if self.started_ray:
            self.ray.shutdown()
