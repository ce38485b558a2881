"""Multi-turn episodes: the model and an environment alternate until the environment is done or a
limit is hit; every episode becomes one token-exact ``Trajectory``.

The context grows only by appending (``ChatSplicer``): the model's tokens exactly as sampled (loss
mask 1, their sampling log-probs and policy versions), then the template's turn end if the model
did not emit it, then the observation messages as the template renders them (mask 0). Prior turns
are never re-tokenised, so the learner trains on exactly the ids the rollout produced.

All active episodes advance together: one batched ``engine.generate`` call per turn (per distinct
token budget); a group whose G episodes start from the same prompt is prefilled once (``n`` = G).
Then the environment steps of the turn run concurrently (``EnvCalls``: at most ``concurrency`` at
once, each with a timeout; ``async def`` environments too) and are applied in episode order, so
the trajectories are the same whether the calls overlap or run one at a time. Turn by turn (not
each episode on its own) keeps the generation batches, and so the samples, independent of how
long each tool took: the price is that a turn waits for its slowest call.
An environment call that times out ends its episode (``metadata["truncated"] = "env_timeout"``,
reward 0 for that turn); one that raises stops the run, or with ``on_error="zero"`` ends its
episode the same way (``"env_error"``), as ``reward.on_error`` does for reward calls. A reset that fails
(a dead server) stops the run too, or under ``"zero"`` leaves an episode with no model turn (untrained).
Limits: ``max_turns`` model turns, ``max_total_tokens`` for the whole sequence (prompt included),
``max_turn_tokens`` per model turn. An episode stopped by a limit is truncated: ``finish_reason``
"length" and ``metadata["truncated"]`` names the limit.
Each trajectory's ``metadata["observations"]`` keeps, per turn, the texts of the messages the environment
answered with (empty after the last turn), for the parts that read what an environment returned
(StepSearch's retrieved documents, orchestrate/search_steps.py).
Roles (docs/multi_agent.md): an environment with ``role()`` says whose turn the model's next turn is; each
trajectory then lists its turns' roles (``metadata["turn_roles"]``) and each step's reward per role
(``metadata["role_rewards"]``: the step's ``info["role_rewards"]`` when it gives them, else its reward to
the role that played the turn). A turn of a role outside ``train_roles`` stays in the sequence as an
observation (loss mask 0).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from reinforge.envs.base import Environment
from reinforge.errors import ReinforgeError
from reinforge.orchestrate.env_calls import EnvCalls, EnvOutcome
from reinforge.rewards.pool import VerifierError
from reinforge.rollout.chat_splice import ChatSplicer
from reinforge.rollout.engines import context_limit
from reinforge.rollout.prompts import prompt_messages
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.rollout.vision import refuse_pictures
from reinforge.types import Task, Trajectory


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 4
    max_total_tokens: int = 512
    max_turn_tokens: int = 32

    def __post_init__(self) -> None:
        if min(self.max_turns, self.max_total_tokens, self.max_turn_tokens) < 1:
            raise ValueError(f"episode limits must be >= 1, got {self}")


@dataclass
class _Episode:
    task: Task
    group: int
    env: Environment
    splicer: ChatSplicer
    ids: list[int]
    prompt_len: int
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_states: list[str] = field(default_factory=list)
    observations: list[list[str]] = field(default_factory=list)  # per turn: the texts the environment answered
    state: str = ""  # the key of the state the next turn acts from (``state_key``)
    role: str | None = None  # whose turn the next model turn is (``role()``; None: the environment has no roles)
    turn_roles: list[str | None] = field(default_factory=list)
    role_rewards: list[dict[str, float]] = field(default_factory=list)  # per step: each role's reward
    texts: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    truncated: str | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        self.mask, self.logprobs, self.versions = [0] * n, [0.0] * n, [-1] * n

    def append_context(self, ids: Sequence[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def append_turn(self, gen: Generation, n_tokens: int, trained: bool = True) -> None:
        start = len(self.ids)
        self.ids += gen.token_ids[:n_tokens]
        self.mask += [int(trained)] * n_tokens
        self.logprobs += gen.logprobs[:n_tokens]
        self.versions += gen.token_versions[:n_tokens]
        self.turn_spans.append((start, len(self.ids)))
        self.turn_states.append(self.state)
        self.turn_roles.append(self.role)
        if self.version is None:
            self.version = gen.version

    def end(self, reason: str | None = None) -> None:
        self.done, self.truncated = True, reason

    def credit(self, reward: float, info: dict[str, Any]) -> None:
        """Record this step's reward (``turn_rewards``) and each role's: ``info["role_rewards"]`` when the
        step gives them, else the reward to the role that played the turn."""
        self.turn_rewards.append(reward)
        given = info.get("role_rewards")
        if isinstance(given, dict):
            self.role_rewards.append({str(k): float(v) for k, v in given.items()})
        else:
            self.role_rewards.append({self.turn_roles[-1] or "": reward} if self.turn_roles else {})


class _Splicers:
    """One ``ChatSplicer`` per distinct tool set (environments of one kind share theirs)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self._cache = tokenizer, {}

    def for_env(self, env: Environment) -> ChatSplicer:
        tools = getattr(getattr(env, "tools", None), "schemas", None)
        key = repr(tools)
        if key not in self._cache:
            self._cache[key] = ChatSplicer(self.tokenizer, tools)
        return self._cache[key]


def run_episodes(
    tasks: Sequence[Task], engine, make_env: Callable[[], Environment], params: SamplingParams,
    limits: EpisodeLimits, seed: int, group_offset: int = 0, env_calls: EnvCalls | None = None,
    on_error: str | Callable[[], str] = "raise", train_roles: Sequence[str] | None = None,
    role_adapters: Collection[str] = (),
) -> list[Trajectory]:
    """``params.n`` episodes per task (one group per task), played to the end; trajectories in
    task order, episode index fastest. ``env_calls`` runs the environments' calls (default: 64 at
    once, 60 s each); ``on_error`` ("raise" or "zero", or a function giving it) is the policy for an
    environment that raises; ``train_roles``: the roles whose turns are trained (None: every role), the
    others' turns have loss mask 0; ``role_adapters``: the roles with a LoRA adapter of their own (named by
    the role, ``env.role_adapters``): each of their turns is sampled with it (``GenerationRequest.adapter``)."""
    calls = env_calls or EnvCalls()
    splicers = _Splicers(engine.tokenizer)
    episodes = _start(tasks, make_env, params.n, seed, splicers, calls, on_error)
    limit = _context_limit(engine, limits)
    for ep in episodes:
        if ep.prompt_len >= limit:
            raise ReinforgeError(f"task {ep.task.id!r}: the first prompt has {ep.prompt_len} tokens, "
                                 f"at or over the episode limit of {limit} (env.max_total_tokens / model context)")
    turn_params = dataclasses.replace(params, n=1)
    for turn in range(limits.max_turns):
        active = [ep for ep in episodes if not ep.done]
        if not active:
            break
        played: list[tuple[_Episode, Generation]] = []
        for budget, eps in _by_budget(active, limit, limits.max_turn_tokens).items():
            gens = _generate(engine, eps, dataclasses.replace(turn_params, max_new_tokens=budget), turn == 0,
                             role_adapters)
            played += zip(eps, gens, strict=True)
        _step_all(played, calls, limit, turn == limits.max_turns - 1, on_error, train_roles)
    return [_trajectory(ep, group_offset, engine.tokenizer) for ep in episodes]


def _start(tasks: Sequence[Task], make_env: Callable[[], Environment], n: int, seed: int, splicers: _Splicers,
           calls: EnvCalls, on_error: str | Callable[[], str] = "raise") -> list[_Episode]:
    """``n`` fresh environments per task, reset concurrently. A reset that fails or times out stops the run,
    or under ``on_error="zero"`` ends its episode before the first turn (the task's own prompt, no model
    tokens: an untrained member of its group with reward 0, ``truncated: env_error``)."""
    refuse_pictures(tasks, "multi-turn episodes")
    envs = [(t, j, make_env()) for t in range(len(tasks)) for j in range(n)]
    outcomes = calls.run([partial(env.reset, tasks[t], seed * 1_000_003 + t * 997 + j) for t, j, env in envs])
    episodes = []
    for (t, _, env), outcome in zip(envs, outcomes, strict=True):
        failed = outcome.error is not None or outcome.timed_out
        if failed and (on_error() if callable(on_error) else on_error) != "zero":
            why = f"timed out after {calls.timeout_s:g} s" if outcome.timed_out else repr(outcome.error)
            raise ReinforgeError(f"environment {type(env).__name__}: reset on task {tasks[t].id!r} {why}") from outcome.error
        messages = prompt_messages(tasks[t].prompt, None) if failed else outcome.value
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        splicer = splicers.for_env(env)
        ids = splicer.prompt_ids(messages)
        ep = _Episode(tasks[t], t, env, splicer, ids, len(ids), state=state_key(env, messages),
                       role=None if failed else role_of(env))
        if failed:
            why = f"timed out after {calls.timeout_s:g} s" if outcome.timed_out else \
                f"{type(outcome.error).__name__}: {outcome.error}"
            ep.info["env_error"] = f"reset {why}"
            ep.end("env_timeout" if outcome.timed_out else "env_error")
        episodes.append(ep)
    return episodes


def role_of(env: Environment) -> str | None:
    """The role whose turn the model's next turn is: the environment's ``role()``, None without one."""
    role = getattr(env, "role", None)
    return str(role()) if callable(role) else None


def state_key(env: Environment, observation: Any) -> str:
    """The key of the environment's current state (GiGPO's anchor state, ``Trajectory.turn_states``):
    its ``state_key()`` when it has one, else the text of the observation it just gave."""
    key = getattr(env, "state_key", None)
    if callable(key):
        return str(key())
    return observation if isinstance(observation, str) else json.dumps(observation, sort_keys=True, default=str)


def _context_limit(engine, limits: EpisodeLimits) -> int:
    model_limit = context_limit(engine)
    return min(limits.max_total_tokens, model_limit) if model_limit else limits.max_total_tokens


def _by_budget(active: list[_Episode], limit: int, max_turn_tokens: int) -> dict[int, list[_Episode]]:
    out: dict[int, list[_Episode]] = {}
    for ep in active:
        out.setdefault(min(max_turn_tokens, limit - len(ep.ids)), []).append(ep)
    return out


def _request(ep: _Episode, role_adapters: Collection[str]) -> GenerationRequest:
    """The request of an episode's next turn: its role's adapter when the role has one."""
    return GenerationRequest(list(ep.ids), ep.task.id, adapter=ep.role if ep.role in role_adapters else None)


def _generate(engine, eps: list[_Episode], params: SamplingParams, first: bool,
              role_adapters: Collection[str] = ()) -> list[Generation]:
    """One turn for every episode; on the first turn a group with one shared prompt is one request
    with ``n`` = group size (its prompt is prefilled once; the same state, so the same role)."""
    if first:
        runs: list[list[_Episode]] = []
        for ep in eps:
            if runs and runs[-1][0].group == ep.group and runs[-1][0].ids == ep.ids:
                runs[-1].append(ep)
            else:
                runs.append([ep])
        if len(runs) < len(eps):
            out: list[Generation] = []
            for size in sorted({len(r) for r in runs}):
                batch = [r for r in runs if len(r) == size]
                gens = engine.generate([_request(r[0], role_adapters) for r in batch],
                                       dataclasses.replace(params, n=size))
                out += gens
            order = [ep for size in sorted({len(r) for r in runs}) for r in runs if len(r) == size for ep in r]
            by_episode = {id(ep): g for ep, g in zip(order, out, strict=True)}
            return [by_episode[id(ep)] for ep in eps]
    return engine.generate([_request(ep, role_adapters) for ep in eps], params)


def _step_all(played: list[tuple[_Episode, Generation]], calls: EnvCalls, limit: int, last_turn: bool,
              on_error: str | Callable[[], str], train_roles: Sequence[str] | None = None) -> None:
    """Record every episode's turn, run the environments' steps concurrently, apply them in order."""
    for ep, gen in played:
        trained = train_roles is None or ep.role is None or ep.role in train_roles
        ep.append_turn(gen, len(gen.token_ids), trained)
        ep.texts.append(gen.text)
    outcomes = calls.run([partial(ep.env.step, {"role": "assistant", "content": gen.text}) for ep, gen in played])
    for (ep, gen), outcome in zip(played, outcomes, strict=True):
        _advance(ep, gen, outcome, limit, last_turn, on_error, calls.timeout_s)


def _failed(ep: _Episode, outcome: EnvOutcome, on_error: str | Callable[[], str], timeout_s: float) -> bool:
    """End the episode of a step that timed out (or raised, under ``on_error="zero"``); True if it ended."""
    if outcome.timed_out:
        ep.credit(0.0, {})
        ep.info["env_error"] = f"step timed out after {timeout_s:g} s"
        ep.end("env_timeout")
        return True
    e = outcome.error
    if e is None:
        return False
    if isinstance(e, VerifierError):  # the reward pool's on_error policy said stop (rewards/pool.py)
        raise e
    text = ep.texts[-1]
    if (on_error() if callable(on_error) else on_error) != "zero":  # an environment bug fails loudly
        raise ReinforgeError(f"environment {type(ep.env).__name__} raised {type(e).__name__}: {e} on task "
                             f"{ep.task.id!r}, turn {len(ep.turn_rewards) + 1}, assistant text {text!r}") from e
    ep.credit(0.0, {})
    ep.info["env_error"] = f"{type(e).__name__}: {e}"
    ep.end("env_error")
    return True


def _advance(ep: _Episode, gen: Generation, outcome: EnvOutcome, limit: int, last_turn: bool,
             on_error: str | Callable[[], str], timeout_s: float) -> None:
    if _failed(ep, outcome, on_error, timeout_s):
        return
    result = outcome.value
    ep.credit(float(result.reward), result.info or {})
    ep.observations.append([str(m.get("content") or "") for m in result.observation or []])
    ep.info.update(result.info)
    if result.done:
        ep.end()
        return
    close = ep.splicer.close_turn_ids(gen.token_ids)
    if last_turn:
        ep.end("max_turns")
        return
    if gen.finish_reason == "length" and len(ep.ids) >= limit:
        ep.end("max_total_tokens")
        return
    obs = ep.splicer.observation_ids(result.observation) if result.observation else []
    if len(ep.ids) + len(close) + len(obs) >= limit:
        ep.end("max_total_tokens")
        return
    ep.append_context(close)
    ep.append_context(obs)
    ep.state = state_key(ep.env, result.observation)
    ep.role = role_of(ep.env)


def _trajectory(ep: _Episode, group_offset: int, tokenizer) -> Trajectory:
    finish = "length" if ep.truncated else "stop"
    return Trajectory(
        token_ids=ep.ids,
        loss_mask=ep.mask,
        logprobs=ep.logprobs,
        version=ep.version if ep.version is not None else -1,
        group_id=group_offset + ep.group,
        task_id=ep.task.id,
        reward=sum(ep.turn_rewards),
        turn_rewards=ep.turn_rewards,
        turn_spans=ep.turn_spans,
        turn_states=ep.turn_states,
        finish_reason=finish,
        completion_text=tokenizer.decode(ep.ids[ep.prompt_len:], skip_special_tokens=False),
        metadata={"correct": bool(ep.info.get("correct", False)), "turns": len(ep.turn_rewards),
                  "truncated": ep.truncated, "reward_status": "ok",
                  "final_text": ep.texts[-1].strip() if ep.texts and not ep.truncated else None,
                  "observations": ep.observations,
                  **{k: ep.info[k] for k in ("reward_terms", "reward_term_errors") if isinstance(ep.info.get(k), dict)},
                  **({"turn_roles": ep.turn_roles, "role_rewards": ep.role_rewards}
                     if any(r is not None for r in ep.turn_roles) else {}),
                  **{k: v for k, v in ep.info.items() if k != "correct" and isinstance(v, int | float | str | bool)}},
        token_versions=ep.versions,
        trainable=bool(ep.turn_spans),  # an episode whose reset failed has no model tokens
    )


def episode_player(engine, make_env: Callable[[], Environment], limits: EpisodeLimits, seed: int = 0):
    """An ``eval.heldout`` player: ``per_task`` episodes per task; an episode is correct when its
    environment says so at the end; majority voting compares the final assistant texts."""

    def play(tasks: Sequence[Task], params: SamplingParams, per_task: int):
        import numpy as np

        trajs = run_episodes(tasks, engine, make_env, dataclasses.replace(params, n=per_task), limits, seed)
        correct = np.array([float(t.metadata["correct"]) for t in trajs]).reshape(len(tasks), per_task)
        answers = [[trajs[p * per_task + j].metadata["final_text"] for j in range(per_task)] for p in range(len(tasks))]
        return correct, answers

    return play
