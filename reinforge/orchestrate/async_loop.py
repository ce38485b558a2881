"""Asynchronous RL: rollout in worker processes, the learner here, bounded staleness in between.

The learner process keeps the synchronous loop's step (``SyncLoop``: batch, update, metrics,
evaluation, checkpoints) and replaces where a step's rollout batch comes from. Rollout workers
(``RolloutWorkers``: processes on this machine, the ``local`` backend; ``RayRolloutWorkers``:
Ray actors, the ``ray`` backend) sample batches continuously while the learner trains;
``AdmissionControl`` starts the request for update k only once the learner has published version
k - 1 - max_staleness, so no batch is staler than the bound (max_staleness = 0 is synchronous RL
through this same code path). New weights go to the workers through shared memory after every
update; with ``weight_update: inflight`` a worker takes them between two decode steps.

Off-policy correction: a batch sampled by older weights is off-policy for the learner. The
decoupled PPO objective (Hilton et al. 2022, arXiv:2110.00641; AReaL, Fu et al. 2025,
arXiv:2505.24298) keeps PPO's trust region around the proximal policy (the learner's log-probs
recomputed at the start of the update, ``old_logprobs``) and reweights by the truncated
importance ratio behaviour -> proximal, ``min(pi_prox / pi_behav, C)``: that is
``algo.mismatch.mode: token_tis`` (or the other TIS/masking variants) with ``cap`` C, which the
async loop turns on by default (``algo.mismatch.mode: none`` keeps it off explicitly).

Checkpoints record the requests in flight (their tasks), so a resumed run re-issues exactly the
batches the interrupted one had already drawn from the sampler.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from reinforge.data.base import Task
from reinforge.errors import ConfigError
from reinforge.orchestrate.components import Components
from reinforge.orchestrate.episodes import shape_overlong
from reinforge.orchestrate.rollout_worker import RolloutRequest, RolloutWorkers
from reinforge.orchestrate.staleness import AdmissionControl, split_stale
from reinforge.orchestrate.sync_loop import Rollout, SyncLoop, TrainResult
from reinforge.train.checkpoint import latest_checkpoint


def check_async_config(c: Components) -> None:
    cfg = c.cfg
    unsupported = {
        "env.name=agent": cfg.env.agent is not None,
        "algo.dynamic_sampling": cfg.algo.dynamic_sampling,
        "rollout.engine=openai": cfg.rollout.engine == "openai",
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ConfigError(f"orchestrate.mode=async does not support {', '.join(bad)} yet; use orchestrate.mode=sync")


class AsyncLoop(SyncLoop):
    def __init__(self, c: Components, run_dir, start: int, progress_every: int) -> None:
        check_async_config(c)
        super().__init__(c, run_dir, start, progress_every)
        o = self.cfg.orchestrate
        self.control = AdmissionControl(o.max_staleness)
        self.next_submit = start + 1
        self.in_flight: dict[int, RolloutRequest] = {}
        self.results: dict[int, Any] = {}
        self.dropped_groups = 0
        self._resubmit = self._pending_from_checkpoint() if start > 0 else []

    def _pending_from_checkpoint(self) -> list[RolloutRequest]:
        import json

        ckpt = latest_checkpoint(self.run_dir)
        state = json.loads((ckpt / "state.json").read_text()) if ckpt is not None else {}
        return [RolloutRequest(p["update"], [Task(**t) for t in p["tasks"]], p["seed"]) for p in state.get("async", [])]

    def run(self) -> TrainResult:
        import torch

        torch.set_num_threads(self.cfg.orchestrate.learner_threads)
        self.published = self.c.engine.version
        if self.cfg.orchestrate.backend == "ray":
            from reinforge.orchestrate.ray_backend import RayRolloutWorkers

            self.workers = RayRolloutWorkers(self.cfg, self.c.learner.model, self.published)
        else:
            self.workers = RolloutWorkers(self.cfg, self.c.learner.model, self.published)
        try:
            return super().run()
        finally:
            self.workers.close()

    # ------------------------------------------------------------------ rollout from the workers
    def _admit(self) -> None:
        """Submit every request admission control allows now (never past the last step)."""
        cfg = self.cfg
        for request in self._resubmit:
            self._submit(request)
        self._resubmit = []
        while self.next_submit <= cfg.train.steps and self.control.may_start(self.next_submit, self.published):
            tasks = self.c.sampler.next_batch(cfg.rollout.prompts_per_step)
            self._submit(RolloutRequest(self.next_submit, tasks, seed=self.next_submit))

    def _submit(self, request: RolloutRequest) -> None:
        request.on_error = self.c.reward_pool.on_error
        request.min_version = max(0, request.update - 1 - self.control.max_staleness)
        self.in_flight[request.update] = request
        self.workers.submit(request)
        self.next_submit = max(self.next_submit, request.update + 1)

    def collect(self, step: int) -> Rollout:
        cfg = self.cfg
        self._admit()
        t0 = time.perf_counter()
        while step not in self.results:
            result = self.workers.next_result(cfg.orchestrate.timeout_s)
            self.results[result.update] = result
        self.wait_s = time.perf_counter() - t0
        result = self.results.pop(step)
        self.in_flight.pop(step, None)
        kept, dropped = split_stale(result.trajectories, step, self.control)
        self.dropped_groups += dropped
        shape_overlong(kept, cfg.algo, cfg.rollout.max_new_tokens)
        lags = [self.control.lag(step, t.version) for t in result.trajectories]
        self.step_extra = {
            "async/wait_s": self.wait_s, "async/worker_generate_s": result.generate_s,
            "async/worker_reward_s": result.reward_s, "async/lag_mean": sum(lags) / max(len(lags), 1),
            "async/lag_max": float(max(lags, default=0)), "async/dropped_groups": float(self.dropped_groups),
            "async/worker_restarts": float(self.workers.restarts), "async/in_flight": float(len(self.in_flight)),
        }
        baseline = [result.baseline[t.group_id] for t in kept] if result.baseline is not None else None
        return Rollout(sampled=kept, kept=kept, baseline=baseline, rounds=1, reward_s=0.0)

    def train_step(self, step: int) -> dict[str, Any]:
        metrics = super().train_step(step)
        metrics.update(self.step_extra)
        return metrics

    def publish_weights(self, version: int) -> None:
        super().publish_weights(version)  # the learner-side engine, used for evaluation
        self.workers.publish(self.c.learner.model, version)
        self.published = version
        self._admit()  # the next batches may start now, while this process logs and evaluates

    def checkpoint_state(self) -> dict[str, Any]:
        pending = sorted(self.in_flight.values(), key=lambda r: r.update)
        return {**super().checkpoint_state(),
                "async": [{"update": r.update, "seed": r.seed, "tasks": [dataclasses.asdict(t) for t in r.tasks]}
                          for r in pending]}
