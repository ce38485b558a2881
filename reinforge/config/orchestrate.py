"""``orchestrate``: synchronous or asynchronous RL, and where the rollout workers run (docs/async.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from reinforge.config.base import _Strict


class OrchestrateConfig(_Strict):
    """Synchronous or asynchronous RL (docs/async.md)."""

    mode: Literal["sync", "async"] = Field("sync", description="async: rollout runs in its own workers (backend)")
    backend: Literal["local", "thread", "ray"] = Field(
        "local", description="local: worker processes on this machine; thread: worker threads of the learner's "
        "process (one process; with learner_threads=1 each side computes on its own core); ray: actors")
    max_staleness: int = Field(1, ge=0, description="async: a batch may be sampled by weights at most this many "
                               "updates older than the learner's (0 = synchronous through the same code path)")
    weight_update: Literal["inflight", "wait"] = Field(
        "inflight", description="inflight: workers take new weights between decode steps; wait: between requests"
    )
    rollout_workers: int = Field(1, ge=1)
    rollout_threads: int = Field(1, ge=1, description="torch threads per rollout worker process (backend=thread: "
                                 "the process's, learner_threads)")
    learner_threads: int = Field(1, ge=1, description="torch threads of the learner process in async mode")
    eval_threads: int | None = Field(
        None, ge=1, description="async: torch threads of the learner process while it evaluates (the rollout workers "
        "soon wait for its next weights); default: the learner's and the local workers' together, at most the "
        "machine's cores")
    timeout_s: float = Field(600.0, gt=0, description="longest wait for a rollout batch before the run stops")
    ray_address: str | None = Field(None, description="backend=ray: cluster address (default: start a local Ray)")

    @model_validator(mode="after")
    def _threads_of_one_process(self) -> OrchestrateConfig:
        if self.backend == "thread" and self.rollout_threads != 1:
            raise ValueError(f"rollout_threads={self.rollout_threads}: with backend=thread the workers are threads of "
                             "the learner's process and use its torch threads (learner_threads)")
        return self
