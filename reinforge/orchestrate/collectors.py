"""One rollout path: a collector per episode kind turns tasks into scored trajectories.

The synchronous loop, the asynchronous rollout workers (processes and Ray actors) and evaluation
all sample through a ``Collector``; which one a run uses is declared by its environment
(``EnvSpec.agent_driven``, ``EnvSpec.multi_turn``), never chosen by a part's name:

* ``SingleTurn``: one completion per sample (a group sampler decides how a group's completions are
  produced), scored in the reward pool (parallel calls, timeouts, ``reward.on_error``);
* ``MultiTurn``: the model and an environment alternate (``multi_turn.run_episodes``); the
  environment's rewards go through the same pool (``VerifierPool.as_verifier``);
* ``AgentDriven``: a black-box agent plays through the OpenAI-compatible proxy.

``play`` makes any collector an evaluation player (``eval.heldout.Player``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from reinforge.config import EnvConfig, GroupSamplerConfig, RolloutConfig
from reinforge.envs.base import Environment
from reinforge.errors import ConfigError
from reinforge.orchestrate.env_calls import EnvCalls
from reinforge.orchestrate.episodes import generate_single_turn, score_single_turn
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes
from reinforge.rewards.pool import VerifierPool
from reinforge.rollout.continuation import continue_budgeted
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory

EVAL_SEED = 0  # environments of held-out episodes are reset from this seed


@dataclass
class Collected:
    """What one collection produced: trajectories (group id = ``group_offset`` + task index), the
    seconds spent scoring them outside generation (0 when rewards interleave with generation) and
    waiting on environments, and the environment calls' counters (``EnvCallStats.metrics``)."""

    trajectories: list[Trajectory] = field(default_factory=list)
    reward_s: float = 0.0
    env_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


class Collector(Protocol):
    def collect(self, tasks: Sequence[Task], params: SamplingParams, seed: int, group_offset: int = 0,
                independent: bool = False) -> Collected:
        """``params.n`` samples per task, scored. ``independent``: every sample drawn independently
        from its prompt (evaluation), whatever group sampler the run trains with."""
        ...

    def outcome(self, trajectory: Trajectory) -> tuple[bool, str | None]:
        """Is this sample correct, and the answer majority voting compares (None: no answer)."""
        ...

    def close(self) -> None: ...


@dataclass
class Continued:
    """``ContinuesStates.continue_states``'s result: the rewards of each state's continuations, the
    tokens the engine decoded for them, the seconds spent scoring them."""

    rewards: list[list[float]]
    tokens_generated: int = 0
    reward_s: float = 0.0


class ContinuesStates(Protocol):
    """A collector that can sample more of a partial completion and score the result with the run's
    reward (single-turn episodes); what a part's Monte Carlo values of states need
    (orchestrate/state_values.py, which also decodes completions with its ``engine.tokenizer``)."""

    def continue_states(self, tasks: Sequence[Task], prompts: Sequence[list[int]], prefixes: Sequence[list[int]],
                        params: SamplingParams) -> Continued: ...


class SingleTurn:
    """One completion per sample, then the reward pool."""

    def __init__(self, engine, make_env: Callable[[], Environment], pool: VerifierPool,
                 group_sampler: GroupSamplerConfig | None = None) -> None:
        self.engine, self.make_env, self.pool = engine, make_env, pool
        self.group_sampler = (build_group_sampler(group_sampler.name, group_sampler.settings())
                              if group_sampler is not None else None)
        self._tasks: dict[str, Task] = {}  # the tasks a group sampler holds over (``held``), by id

    def collect(self, tasks: Sequence[Task], params: SamplingParams, seed: int, group_offset: int = 0,
                independent: bool = False) -> Collected:
        sampler = None if independent else self.group_sampler
        _, generations = generate_single_turn(tasks, self.engine, self.make_env, params, seed=seed,
                                              group_sampler=sampler)
        if sampler is not None:  # the tasks whose generations the sampler carries over, and only those
            held = sampler.held()
            self._tasks = {k: t for k, t in ({**self._tasks, **{t.id: t for t in tasks}}).items() if k in held}
        # a sampler's own namespaced counters (e.g. spec_rl/verify_s); the step's rollout/tokens_* are counted
        # from each sample's extra['tokens_reused'] (orchestrate/step_metrics.token_metrics)
        counters = ({f"rollout/{k}": v for k, v in sampler.counters().items() if "/" in k}
                    if sampler is not None else {})
        t0 = time.perf_counter()
        trajectories = score_single_turn(tasks, generations, params.n, self.pool, group_offset=group_offset)
        metrics, steps = dict(counters), self.pool.steps  # a step verifier's (reward.step_verifier)
        if not independent:  # training batches only (evaluations and value estimates draw independently)
            done = [i for i, t in enumerate(trajectories) if not t.continues]
            metrics |= self.pool.observe([tasks[i // params.n] for i in done],  # a reward that learns from them
                                         [trajectories[i].completion_text for i in done])
        if steps is not None:  # process rewards: per-token rewards at the steps' ends
            metrics |= steps.apply([tasks[i // params.n] for i in range(len(trajectories))], trajectories,
                                  self.engine.tokenizer.decode, [len(g.prompt_ids) for g in generations])
        return Collected(trajectories, time.perf_counter() - t0, metrics=metrics)

    def continue_states(self, tasks: Sequence[Task], prompts: Sequence[list[int]], prefixes: Sequence[list[int]],
                        params: SamplingParams) -> Continued:
        """``params.n`` continuations of each state (``prompts[i]`` and the partial completion ``prefixes[i]``
        of task ``tasks[i]``), each within the rest of ``max_new_tokens``, in one engine call
        (``continuation.continue_budgeted``); each whole completion is scored in the pool like a sample."""
        gens, decoded = continue_budgeted(self.engine, prompts, prefixes, params)
        t0 = time.perf_counter()
        outcomes = self.pool.score([tasks[i // params.n] for i in range(len(gens))], [g.text for g in gens])
        r = [o.reward for o in outcomes]
        return Continued([r[i * params.n: (i + 1) * params.n] for i in range(len(prompts))], decoded,
                         time.perf_counter() - t0)

    def held(self) -> list[tuple[Task, int]]:
        """The tasks whose generations the group sampler carries into the next step (T-PPO's truncated
        rollouts: ``held()`` of the sampler), each with how many samples it has in flight."""
        held = getattr(self.group_sampler, "held", None)
        return [(self._tasks[rid], n) for rid, n in held().items()] if held is not None else []

    def state_dict(self) -> dict[str, Any]:
        """The group sampler's state (e.g. SPEC-RL's earlier rollouts), for checkpoints; with the tasks it
        holds over (``held``) under ``held_tasks``."""
        state = self.group_sampler.state_dict() if self.group_sampler is not None else {}
        held = self.held()
        return {**state, "held_tasks": [dataclasses.asdict(t) for t, _ in held]} if held else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self._tasks.update({d["id"]: Task(**d) for d in state.pop("held_tasks", [])})
        if self.group_sampler is not None:
            self.group_sampler.load_state_dict(state)

    def outcome(self, trajectory: Trajectory) -> tuple[bool, str | None]:
        """Correct only if the completion ended by itself and the verifier says so; its answer is the
        verifier's reading of it (or the stripped text)."""
        ended = trajectory.finish_reason == "stop" and trajectory.metadata.get("reward_status", "ok") == "ok"
        if not ended:
            return False, None
        answer = trajectory.metadata.get("answer")
        return bool(trajectory.metadata["correct"]), answer if answer is not None else trajectory.completion_text.strip()

    def close(self) -> None:
        pass


class MultiTurn:
    """Episodes of model turns and environment steps, all active episodes advancing together; the
    environments' calls run through ``env_calls`` (concurrent, with timeouts) under the reward pool's
    ``on_error`` policy (when a pool is given)."""

    def __init__(self, engine, make_env: Callable[[], Environment], limits: EpisodeLimits,
                 env_calls: EnvCalls | None = None, pool: VerifierPool | None = None,
                 train_roles: Sequence[str] | None = None, role_adapters: Sequence[str] = ()) -> None:
        self.engine, self.make_env, self.limits = engine, make_env, limits
        self.env_calls, self.pool, self.train_roles = env_calls or EnvCalls(), pool, train_roles
        self.role_adapters = tuple(role_adapters)  # roles sampled with their own LoRA adapter

    def collect(self, tasks: Sequence[Task], params: SamplingParams, seed: int, group_offset: int = 0,
                independent: bool = False) -> Collected:
        on_error = (lambda: self.pool.on_error) if self.pool is not None else "raise"
        trajectories = run_episodes(tasks, self.engine, self.make_env, params, self.limits, seed,
                                    group_offset=group_offset, env_calls=self.env_calls, on_error=on_error,
                                    train_roles=self.train_roles, role_adapters=self.role_adapters)
        stats = self.env_calls.take_stats()
        return Collected(trajectories, env_s=stats.wait_s, metrics=stats.metrics())

    def outcome(self, trajectory: Trajectory) -> tuple[bool, str | None]:
        """Correct when the environment said so at the end; the answer is the final assistant text."""
        return bool(trajectory.metadata["correct"]), trajectory.metadata.get("final_text")

    def close(self) -> None:
        pass


class AgentDriven:
    """A black-box agent (``env.agent``) plays each episode through the proxy over the engine."""

    def __init__(self, runner) -> None:
        self.runner = runner

    def collect(self, tasks: Sequence[Task], params: SamplingParams, seed: int, group_offset: int = 0,
                independent: bool = False) -> Collected:
        trajectories = self.runner.run(tasks, params.n, group_offset=group_offset, greedy=params.greedy)
        refused = self.runner.proxy.take_refused_rewards()  # reward posts without their episode's token
        return Collected(trajectories, metrics={"agent/refused_rewards": float(refused)})

    def outcome(self, trajectory: Trajectory) -> tuple[bool, str | None]:
        """Correct when the agent reported ``correct`` or, without it, for a reward of at least 1; no
        answer to vote on."""
        ok = trajectory.metadata.get("correct")
        return (bool(ok) if ok is not None else trajectory.reward >= 1.0), None

    def close(self) -> None:
        self.runner.close()


def sampling_params(rollout: RolloutConfig) -> SamplingParams:
    """A training step's sampling: ``group_size`` samples per prompt at the rollout temperature."""
    r = rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          n=r.group_size, stop=tuple(r.stop), ignore_eos=r.ignore_eos)


def episode_limits(env: EnvConfig, rollout: RolloutConfig, model_context: int | None) -> EpisodeLimits:
    """Multi-turn limits; 0 in the recipe means the model's context (total) or ``max_new_tokens`` (turn)."""
    return EpisodeLimits(max_turns=env.max_turns, max_total_tokens=env.max_total_tokens or model_context or 4096,
                         max_turn_tokens=env.max_turn_tokens or rollout.max_new_tokens)


def build_collector(env: EnvConfig, rollout: RolloutConfig, engine, make_env: Callable[[], Environment],
                    pool: VerifierPool, model_context: int | None) -> Collector:
    """The collector the environment declares (``EnvSpec.agent_driven`` / ``multi_turn``) over ``engine``;
    ``model_context``: the policy's context length (the default episode limit)."""
    from reinforge.envs.registry import environment_spec

    spec = environment_spec(env.name)
    limits = episode_limits(env, rollout, model_context)
    if env.latency is not None:
        from reinforge.envs.latency import with_latency

        make_env = with_latency(make_env, env.latency)
    if spec.agent_driven:
        from reinforge.orchestrate.agent_episodes import AgentRunner

        assert env.agent is not None  # EnvConfig checks it
        return AgentDriven(AgentRunner(env.agent, engine, max_tokens=limits.max_turn_tokens,
                                       temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                                       workers=env.agent_workers, api_key=env.agent_api_key,
                                       reward_endpoint=env.agent_reward_endpoint))
    if pool.steps is not None and (spec.multi_turn or spec.agent_driven):
        raise ConfigError(f"reward.step_verifier: env {env.name} is multi-turn; step rewards are for single-turn "
                          "completions (a multi-turn environment's steps have their own turn rewards)")
    if spec.multi_turn:
        return MultiTurn(engine, make_env, limits, EnvCalls(env.concurrency, env.step_timeout_s), pool,
                         train_roles=env.train_roles, role_adapters=env.role_adapters or ())
    return SingleTurn(engine, make_env, pool, rollout.group_sampler)


def greedy_baseline(collector: Collector, tasks: Sequence[Task], params: SamplingParams, seed: int) -> list[float]:
    """ReMax's baseline: the reward of one greedy sample (completion or episode) per task, the same
    in the synchronous loop and the rollout workers."""
    greedy = dataclasses.replace(params, greedy=True, n=1)
    trajectories = collector.collect(tasks, greedy, seed, independent=True).trajectories
    return [_first_per_group(trajectories, len(tasks), 1)[i][0].reward for i in range(len(tasks))]


def play(collector: Collector, texts: list[list[str]] | None = None):
    """An evaluation player (``eval.heldout.Player``): ``per_task`` samples per task, correctness
    [P, per_task] and answers [P][per_task] by the collector's ``outcome``; each call's completion texts
    (P x per_task, task by task) are appended to ``texts`` when given (a report's examples)."""

    def player(tasks: Sequence[Task], params: SamplingParams, per_task: int):
        trajectories = collector.collect(tasks, dataclasses.replace(params, n=per_task), EVAL_SEED,
                                         independent=True).trajectories
        correct = np.zeros((len(tasks), per_task))
        answers: list[list[str | None]] = [[None] * per_task for _ in tasks]
        completions = [""] * (len(tasks) * per_task)
        for p, group in enumerate(_first_per_group(trajectories, len(tasks), per_task)):
            for j, t in enumerate(group):
                ok, answer = collector.outcome(t)
                correct[p, j], answers[p][j] = float(ok), answer
                completions[p * per_task + j] = t.completion_text
        if texts is not None:
            texts.append(completions)
        return correct, answers

    return player


def _first_per_group(trajectories: list[Trajectory], n_groups: int, per_group: int) -> list[list[Trajectory]]:
    """The trajectories of each group (group ids 0..n_groups-1), one per episode (an agent episode whose
    history was rewritten comes back as several segments sharing ``metadata['episode_id']``), at most
    ``per_group``."""
    groups: list[dict[object, Trajectory]] = [{} for _ in range(n_groups)]
    for i, t in enumerate(trajectories):
        groups[t.group_id].setdefault(t.metadata.get("episode_id", i), t)
    return [list(g.values())[:per_group] for g in groups]
