"""Where a step's rollout batch comes from: a ``BatchSource``.

    tasks (the task sampler) -> rollout (a collector) -> rewards (the reward pool) -> shaped rewards

``LocalBatches`` samples in this process, one round after another (``Rounds``); the asynchronous
``WorkerBatches`` (orchestrate/async_batches.py) has rollout workers sample ahead while the learner
trains. Both go through the same pieces: ``sample_round`` (what a rollout worker runs too) and
``Rounds`` (reward shaping and DAPO's dynamic sampling). The loop (orchestrate/loop.py) does not
know which source it has.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from reinforge.algo.objective import required_inputs
from reinforge.config import AlgoConfig, RolloutConfig
from reinforge.learn import distributed
from reinforge.orchestrate.collectors import Collected, Collector, greedy_baseline
from reinforge.orchestrate.episodes import groups_with_spread, shape_rewards
from reinforge.orchestrate.rollouts import Rollout, Round
from reinforge.orchestrate.stages import Stages
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, declares_stage


def collect_sized(collector: Collector, tasks: Sequence[Task], params: SamplingParams, step: int, group_offset: int,
                  sizes: Sequence[int] | None = None) -> Collected:
    """``sizes[i]`` scored samples for task i (``params.n`` each when None): one collection per distinct
    size, in increasing size, the group ids then set to ``group_offset`` + task index and the
    trajectories put back in task order. Every size equal to ``params.n`` is one plain collection.
    ``step`` is the collector's environment seed (environments are reset from the step number)."""
    if sizes is None or all(n == params.n for n in sizes):
        return collector.collect(tasks, params, step, group_offset=group_offset)
    out = Collected()
    by_task: list[list] = [[] for _ in tasks]
    for n in sorted(set(sizes)):
        index = [i for i, s in enumerate(sizes) if s == n]
        part = collector.collect([tasks[i] for i in index], dataclasses.replace(params, n=n), step)
        for t in part.trajectories:
            task = index[t.group_id]
            t.group_id = group_offset + task
            by_task[task].append(t)
        out.reward_s += part.reward_s
        out.env_s += part.env_s
        merge_counters(out.metrics, part.metrics)
    out.trajectories = [t for group in by_task for t in group]
    return out


@declares_stage("collect", reads=("tasks", "sizes"),
                writes=("trajectories", "trajectories.group_id", "baseline", "generate_s", "reward_s", "env_s", "metrics"))
def sample_round(collector: Collector, tasks: Sequence[Task], params: SamplingParams, step: int, group_offset: int,
                 with_baseline: bool, sizes: Sequence[int] | None = None) -> Round:
    """``params.n`` (or ``sizes[i]``) scored samples per task (group id = ``group_offset`` + task index)
    and, when the advantage needs it, the task's greedy baseline (ReMax). ``step`` is the step the round
    is for (the collector's environment seed). The same in this process and in a worker."""
    t0 = time.perf_counter()
    collected = collect_sized(collector, tasks, params, step, group_offset, sizes)
    baseline = greedy_baseline(collector, tasks, params, step) if with_baseline else None
    total = time.perf_counter() - t0
    return Round(collected.trajectories, baseline, total - collected.reward_s - collected.env_s, collected.reward_s,
                 collected.env_s, collected.metrics)


class Rounds:
    """Gathers rounds into one step's ``Rollout``: each round is reward-shaped (``algo.reward_shapers``);
    without dynamic sampling the first round is the batch. With DAPO's dynamic sampling
    (``algo.dynamic_sampling``) groups without reward spread are set aside and rounds go on until
    ``want`` groups with spread are in hand, or ``dynamic_sampling_max_rounds`` rounds were drawn."""

    def __init__(self, algo: AlgoConfig, max_new_tokens: int, want: int) -> None:
        self.algo, self.max_new_tokens, self.want, self.out = algo, max_new_tokens, want, Rollout()
        self.groups_kept: set[int] = set()

    @declares_stage("shape", reads=("trajectories", "baseline", "reward_s", "env_s", "metrics"),
                    writes=("sampled", "kept", "baseline", "rounds", "reward_s", "env_s", "metrics",
                            "sampled.reward", "sampled.trainable", "sampled.metadata.<shaper>"))
    def add(self, round_: Round, group_offset: int) -> None:
        algo, out = self.algo, self.out
        trajs = round_.trajectories
        shape_rewards(trajs, algo.reward_shapers, self.max_new_tokens)
        baseline = ([round_.baseline[t.group_id - group_offset] for t in trajs]
                    if round_.baseline is not None else None)
        out.rounds += 1
        out.reward_s += round_.reward_s
        out.env_s += round_.env_s
        merge_counters(out.metrics, round_.metrics)
        out.sampled += trajs
        take = set(sorted(groups_with_spread(trajs))[:self.room()]) if algo.dynamic_sampling else None
        keep = [take is None or t.group_id in take for t in trajs]
        out.kept += [t for t, k in zip(trajs, keep, strict=True) if k]
        if baseline is not None:
            out.baseline = (out.baseline or []) + [b for b, k in zip(baseline, keep, strict=True) if k]
        self.groups_kept |= {t.group_id for t, k in zip(trajs, keep, strict=True) if k}

    def room(self) -> int:
        return self.want - len(self.groups_kept)

    def done(self) -> bool:
        algo = self.algo
        return not algo.dynamic_sampling or self.room() <= 0 or self.out.rounds >= algo.dynamic_sampling_max_rounds


def needs_greedy_baseline(algo: AlgoConfig) -> bool:
    """Does the run's advantage estimator declare a greedy baseline (``Entry.needs``)?"""
    return "greedy_baseline" in required_inputs(algo)


class BatchSource(Protocol):
    def collect(self, step: int) -> Rollout:
        """The rollout batch of update ``step``."""
        ...

    def published(self, model: torch.nn.Module, version: int) -> None:
        """The learner has new weights (after the loop updated its own engine)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint records about this source (beyond the task sampler)."""
        ...

    def close(self) -> None: ...


class LocalBatches:
    """Rollout in this process with the loop's engine: rounds of ``prompts_per_step`` tasks. With
    several ranks every rank draws the same tasks and samples its share ``[lo, hi)`` of them. The run's
    ``stages`` (orchestrate/stages.py: budget, replay, prompt values, state values) then run on the step's
    rollout, as they do on a ``WorkerBatches`` one."""

    def __init__(self, algo: AlgoConfig, rollout: RolloutConfig, seed: int, sampler, collector: Collector,
                 params: SamplingParams, generator, stages: Stages | None = None) -> None:
        self.algo, self.rollout, self.seed = algo, rollout, seed
        self.sampler, self.collector, self.params, self.generator = sampler, collector, params, generator
        self.with_baseline = needs_greedy_baseline(algo)
        self.stages = stages or Stages()

    def collect(self, step: int) -> Rollout:
        n_prompts = self.rollout.prompts_per_step
        lo, hi = distributed.shard(n_prompts)
        distributed.seed_rollout(self.generator, self.seed, step)
        rounds = Rounds(self.algo, self.rollout.max_new_tokens, hi - lo)
        drawn: dict[str, Task] = {}
        while True:
            held = getattr(self.collector, "held", lambda: [])() if not rounds.out.rounds else []
            tasks = self.sampler.next_batch(n_prompts - len(held))[lo:hi]  # every rank draws the same tasks
            offset = rounds.out.rounds * n_prompts + lo
            sizes = self.stages.sizes(tasks, self.params.n)
            if held:  # generations a group sampler carries over (T-PPO) come first, with their counts
                sizes = [k for _, k in held] + (sizes or [self.params.n] * len(tasks))
                tasks = [t for t, _ in held] + tasks
            drawn.update((t.id, t) for t in tasks)
            rounds.add(sample_round(self.collector, tasks, self.params, step, offset, self.with_baseline, sizes),
                       offset)
            if distributed.all_ranks(rounds.done()):  # a rank already full samples on, unused: same draws
                self.stages.run(rounds.out, drawn, step)
                return rounds.out

    def published(self, model: torch.nn.Module, version: int) -> None:
        pass  # the loop's engine is this source's engine

    def state(self) -> dict[str, Any]:
        return self.stages.state_dict()

    def close(self) -> None:
        pass


def merge_counters(into: dict[str, float], more: dict[str, float]) -> None:
    """Add per-round counters into a step's: ``*_max`` keys take the maximum, the others add up."""
    for key, value in more.items():
        into[key] = max(into.get(key, value), value) if key.endswith("_max") else into.get(key, 0.0) + value
