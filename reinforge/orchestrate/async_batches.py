"""Asynchronous RL: rollout in worker processes, the learner here, bounded staleness in between.

``WorkerBatches`` is the loop's batch source in ``orchestrate.mode: async``: rollout workers
(``RolloutWorkers``: processes on this machine, the ``local`` backend; ``ThreadRolloutWorkers``: threads
of this process, the ``thread`` backend; ``RayRolloutWorkers``: Ray actors, the ``ray`` backend) sample batches continuously while the learner trains, each round with
the same ``batch_sources.sample_round`` as the synchronous loop. ``AdmissionControl`` starts the
request for update k only once the learner has published version k - 1 - max_staleness, so no
batch is staler than the bound (max_staleness = 0 is synchronous RL through this same code path).
New weights go to the workers through shared memory after every update; with
``weight_update: inflight`` a worker takes them between two decode steps.

Dynamic sampling (DAPO): the first round of update k is sampled ahead like any request; when it
has fewer groups with reward spread than needed, further rounds are drawn from the task sampler
and requested when the batch is consumed (they wait: they are sampled by the newest weights).

Off-policy correction: a batch sampled by older weights is off-policy for the learner. The
decoupled PPO objective (Hilton et al. 2022, arXiv:2110.00641; AReaL, Fu et al. 2025,
arXiv:2505.24298) keeps PPO's trust region around the proximal policy (the learner's log-probs
recomputed at the start of the update, ``old_logprobs``) and reweights by the truncated
importance ratio behaviour -> proximal, ``min(pi_prox / pi_behav, C)``: that is
``algo.mismatch.mode: token_tis`` (or the other TIS/masking variants) with ``cap`` C, which async
mode turns on by default (``algo.mismatch.mode: none`` keeps it off explicitly).

Checkpoints record the requests in flight (their tasks) and, to resume exactly, their results:
writing a checkpoint first waits for every request in flight to finish (they were sampled by
weights older than the checkpoint's, which a resumed run no longer has), so a resumed run trains
on exactly the batches the interrupted one would have. A checkpoint without results (an older
one) re-issues the requests instead: the same tasks, sampled by the restored weights.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from reinforge.config import RunConfig
from reinforge.orchestrate.batch_sources import Rounds
from reinforge.orchestrate.rollout_worker import RolloutRequest, RolloutResult, RolloutWorkers
from reinforge.orchestrate.rollouts import Rollout, Round
from reinforge.orchestrate.stages import Stages
from reinforge.orchestrate.staleness import AdmissionControl, split_stale
from reinforge.orchestrate.thread_workers import ThreadRolloutWorkers
from reinforge.types import Task, Trajectory


class WorkerBatches:
    """The batch source of asynchronous RL (see the module docstring)."""

    def __init__(self, cfg: RunConfig, sampler, reward_pool, model: torch.nn.Module, version: int,
                 stages: Stages | None = None, resumed: Mapping[str, Any] | None = None) -> None:
        """``stages``: the run's stages after collection (orchestrate/stages.py), run here on each step's
        rollout; ``resumed``: the ``state.json`` of the checkpoint the run resumes from (None: a new run)."""
        self.cfg, self.sampler, self.reward_pool = cfg, sampler, reward_pool
        self.stages = stages or Stages()
        self.control = AdmissionControl(cfg.orchestrate.max_staleness)
        self.next_submit = int(resumed["step"]) + 1 if resumed else 1
        self.in_flight: dict[tuple[int, int], RolloutRequest] = {}
        self.results: dict[tuple[int, int], RolloutResult] = {}
        self.dropped_groups = 0
        requests, finished = pending_from_state(resumed) if resumed else ([], [])
        self.results.update({r.key: r for r in finished})
        self._resubmit = [r for r in requests if r.key not in self.results]
        for request in requests:
            if request.key in self.results:  # finished before the checkpoint: consumed as it is
                self.in_flight[request.key] = request
                self.next_submit = max(self.next_submit, request.update + 1)
        self.published_version = version
        if cfg.orchestrate.backend == "ray":
            from reinforge.orchestrate.ray_backend import RayRolloutWorkers

            self.workers: Any = RayRolloutWorkers(cfg, model, version)
        elif cfg.orchestrate.backend == "thread":
            self.workers = ThreadRolloutWorkers(cfg, model, version)
        else:
            self.workers = RolloutWorkers(cfg, model, version)

    # ------------------------------------------------------------------ BatchSource
    def collect(self, step: int) -> Rollout:
        self._admit()
        n = self.cfg.rollout.prompts_per_step
        t0 = time.perf_counter()
        rounds, results, drawn = Rounds(self.cfg.algo, self.cfg.rollout.max_new_tokens, n), [], {}
        while True:
            request, result = self._wait((step, rounds.out.rounds + 1))
            drawn.update((t.id, t) for t in request.tasks)
            results.append(result)
            kept, dropped = split_stale(result.trajectories, step, self.control)
            self.dropped_groups += dropped
            offset = rounds.out.rounds * n
            rounds.add(Round(kept, result.baseline, result.generate_s, 0.0, 0.0, result.metrics), offset)
            if rounds.done():
                break
            self._submit(self._request(step, round_=rounds.out.rounds + 1, group_offset=rounds.out.rounds * n))
        self.stages.run(rounds.out, drawn, step)  # in this process, as in the synchronous loop
        rounds.out.metrics.update(self._metrics(step, results, time.perf_counter() - t0))
        return rounds.out

    def published(self, model: torch.nn.Module, version: int) -> None:
        self.workers.publish(model, version)
        self.published_version = version
        self._admit()  # the next batches may start now, while the loop logs and evaluates

    def state(self) -> dict[str, Any]:
        """The requests in flight and, once each has finished (waited for here), their results."""
        pending = sorted(self.in_flight.values(), key=lambda r: r.key)
        for request in pending:
            self._receive(request.key)
        return {**self.stages.state_dict(),
                "async": [{"update": r.update, "round": r.round, "group_offset": r.group_offset, "sizes": r.sizes,
                           "tasks": [dataclasses.asdict(t) for t in r.tasks]} for r in pending],
                "async_results": [result_to_json(self.results[r.key]) for r in pending]}

    def close(self) -> None:
        self.workers.close()

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """The learner evaluates with ``evaluation_threads(cfg)`` torch threads, then goes back to its own."""
        threads = torch.get_num_threads()
        torch.set_num_threads(evaluation_threads(self.cfg))
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    # ------------------------------------------------------------------ requests
    def _admit(self) -> None:
        """Submit every request admission control allows now (never past the last step)."""
        for request in self._resubmit:
            self._submit(request)
        self._resubmit = []
        while (self.next_submit <= self.cfg.train.steps
               and self.control.may_start(self.next_submit, self.published_version)):
            self._submit(self._request(self.next_submit))

    def _request(self, update: int, round_: int = 1, group_offset: int = 0) -> RolloutRequest:
        """The next tasks of the sampler, with the budget's samples per task (orchestrate/stages.py)."""
        tasks = self.sampler.next_batch(self.cfg.rollout.prompts_per_step)
        return RolloutRequest(update, tasks, round=round_, group_offset=group_offset,
                              sizes=self.stages.sizes(tasks, self.cfg.rollout.group_size))

    def _submit(self, request: RolloutRequest) -> None:
        request.on_error = self.reward_pool.on_error
        request.min_version = max(0, request.update - 1 - self.control.max_staleness)
        self.in_flight[request.key] = request
        self.workers.submit(request)
        self.next_submit = max(self.next_submit, request.update + 1)

    def _receive(self, key: tuple[int, int]) -> None:
        """Gather results until the one for ``key`` has arrived."""
        while key not in self.results:
            result = self.workers.next_result(self.cfg.orchestrate.timeout_s)
            self.results[result.key] = result

    def _wait(self, key: tuple[int, int]) -> tuple[RolloutRequest, RolloutResult]:
        self._receive(key)
        return self.in_flight.pop(key), self.results.pop(key)

    def _metrics(self, step: int, results: list[RolloutResult], wait_s: float) -> dict[str, float]:
        lags = [self.control.lag(step, t.version) for r in results for t in r.trajectories]
        return {
            "async/wait_s": wait_s, "async/worker_generate_s": sum(r.generate_s for r in results),
            "async/worker_reward_s": sum(r.reward_s for r in results),
            "async/worker_env_s": sum(r.env_s for r in results), "async/lag_mean": sum(lags) / max(len(lags), 1),
            "async/lag_max": float(max(lags, default=0)), "async/dropped_groups": float(self.dropped_groups),
            "async/worker_restarts": float(self.workers.restarts),
            "async/in_flight": float(len(self.in_flight)),
        }


def evaluation_threads(cfg: RunConfig) -> int:
    """``orchestrate.eval_threads``, by default the learner's threads and the local workers' together, at most the
    machine's cores (a worker thread counts one): an evaluation runs after a publish, while the workers finish the
    one batch admission control lets them start and then wait for the learner's next weights, so their cores are
    idle for most of it (Ray actors may run elsewhere: the learner's own threads)."""
    o = cfg.orchestrate
    if o.eval_threads is not None:
        return o.eval_threads
    workers = {"local": o.rollout_workers * o.rollout_threads, "thread": o.rollout_workers}.get(o.backend, 0)
    return max(o.learner_threads, min(o.learner_threads + workers, os.cpu_count() or 1))


def result_to_json(result: RolloutResult) -> dict[str, Any]:
    """A finished request's result as JSON (floats round-trip exactly)."""
    return dataclasses.asdict(result)


def result_from_json(data: dict[str, Any]) -> RolloutResult:
    trajs = [Trajectory(**{**t, "turn_spans": [tuple(span) for span in t["turn_spans"]]}) for t in data["trajectories"]]
    return RolloutResult(**{**data, "trajectories": trajs})


def pending_from_state(state: Mapping[str, Any]) -> tuple[list[RolloutRequest], list[RolloutResult]]:
    """What was in flight when the checkpoint the run resumes from was written (``state``: its
    ``state.json``): its requests, and the results it holds for them (none in a checkpoint from before
    results were saved)."""
    finished = [result_from_json(r) for r in state.get("async_results", [])]
    requests = [RolloutRequest(p["update"], [Task(**t) for t in p["tasks"]], round=p.get("round", 1),
                               group_offset=p.get("group_offset", 0), sizes=p.get("sizes"))
                for p in state.get("async", [])]
    return requests, finished
