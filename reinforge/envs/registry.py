"""Environments by name, for recipes: ``env.name`` picks one, its keyword arguments written beside it.

Each entry makes an environment from ``(verifier, system_prompt, **params)``; its parameters and
their defaults are read from that function's signature, so this table is the one place that
lists them. `build_environment` checks a choice once and returns a factory that makes a fresh
environment per episode. ``task_kinds`` records which task sources an environment is built for.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from reinforge.data.base import TaskSplits
from reinforge.envs.base import Environment
from reinforge.envs.calculator import CalculatorEnv
from reinforge.envs.code_interpreter import CodeInterpreterEnv
from reinforge.envs.guess_duel import GuessDuelEnv
from reinforge.envs.guessing import GuessingEnv
from reinforge.envs.mcp_tools import mcp_toolbox_of
from reinforge.envs.nim import NimEnv
from reinforge.envs.openenv_env import OpenEnvEnv, openenv_splits
from reinforge.envs.problem_synthesis import ProblemSynthesisEnv
from reinforge.envs.retry import RetryEnv
from reinforge.envs.search import SearchEnv
from reinforge.envs.self_play import duel_tasks, synthesis_tasks, ttt_tasks
from reinforge.envs.simulated_user import DEFAULT_USER_PROMPT, SimulatedUserEnv, simulated_user_settings
from reinforge.envs.single_turn import SingleTurnEnv
from reinforge.envs.textarena_env import TextArenaEnv, textarena_splits
from reinforge.envs.tictactoe import TicTacToeEnv
from reinforge.envs.verifiers_env import VerifiersEnv, load_verifiers, verifiers_splits
from reinforge.errors import ConfigError
from reinforge.registry import Registry, kind
from reinforge.rewards.verifiers import Verifier


class EnvironmentConfigError(ConfigError, ValueError):
    """An unknown environment name or a bad parameter; the message names the allowed ones."""


AGENT = "agent"
ENV_TASKS = "env"  # task.kind of an environment's own tasks (envs/adapter_tasks.py)


@dataclass(frozen=True)
class EnvSpec:
    """``make(verifier, system_prompt, **params)``; ``task_kinds``: the task sources (``task.kind``)
    it is built for, None for any task with a verifier; ``uses_verifier``: scores with the task's verifier;
    ``multi_turn``: its episodes alternate model turns and observations (played token by token from the
    chat template), else one completion is sampled per episode and scored in the reward pool."""

    name: str
    make: Callable[..., Environment]
    uses_verifier: bool
    task_kinds: tuple[str, ...] | None
    description: str
    multi_turn: bool = True
    agent_driven: bool = False  # episodes are played by a black-box agent (env.agent) through the proxy
    tasks: Callable[..., TaskSplits] | None = None  # its own tasks (task.kind=env): (heldout_size, seed, **params)

    @property
    def params(self) -> dict[str, Any]:
        """Parameter name -> default."""
        return {p.name: p.default for p in list(inspect.signature(self.make).parameters.values())[2:]}


ENVIRONMENTS: Registry[EnvSpec] = kind("env", Registry("environment"))


def register_environment(
    name: str, *, description: str, paper: str = "-", uses_verifier: bool = False,
    task_kinds: tuple[str, ...] | None = None, multi_turn: bool = True, agent_driven: bool = False,
    tasks: Callable[..., TaskSplits] | None = None,
) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Register ``make(verifier, system_prompt, **params) -> Environment`` as environment ``name``
    (``env.name`` in a recipe; its keyword parameters are written beside it, their defaults its own).
    ``tasks(heldout_size, seed, **params)``: the environment's own train / held-out splits (``task.kind=env``)."""

    def deco(make: Callable[..., Environment]) -> Callable[..., Environment]:
        spec = EnvSpec(name, make, uses_verifier, task_kinds, description, multi_turn, agent_driven, tasks)
        ENVIRONMENTS.register(name, description=description, paper=paper)(spec)
        return make

    return deco


@register_environment("single_turn", description="one completion scored by the task's verifier", uses_verifier=True,
                      multi_turn=False)
def _single_turn(verifier: Verifier | None, system_prompt: str | None) -> Environment:
    assert verifier is not None  # checked by build_environment
    return SingleTurnEnv(verifier, system_prompt)


@register_environment("calculator", task_kinds=("calculator", "arithmetic"),
                      description="calc tool calls, then a final integer answer (last integer == task.answer)")
def _calculator(
    verifier: Verifier | None, system_prompt: str | None, max_tool_calls: int = 3, mcp: dict[str, Any] | None = None,
) -> Environment:
    """``mcp``: the tools of an MCP server instead of the built-in ``calc`` (reinforge/envs/mcp_tools.py)."""
    return CalculatorEnv(max_tool_calls=max_tool_calls, system_prompt=system_prompt,
                         toolbox=None if mcp is None else mcp_toolbox_of(mcp))


@register_environment("guessing", task_kinds=("guessing",),
                      description="guess the secret (task.answer) with higher/lower hints")
def _guessing(verifier: Verifier | None, system_prompt: str | None, max_guesses: int = 6) -> Environment:
    return GuessingEnv(max_guesses=max_guesses, system_prompt=system_prompt)


@register_environment("retry", uses_verifier=True,
                      description="single-turn verifier task with 'wrong, try again' and more attempts")
def _retry(
    verifier: Verifier | None, system_prompt: str | None, max_attempts: int = 3,
    feedback: str = "wrong, try again", decay: float = 1.0,
) -> Environment:
    assert verifier is not None  # checked by build_environment
    return RetryEnv(SingleTurnEnv(verifier, system_prompt), max_attempts=max_attempts, feedback=feedback, decay=decay)


@register_environment("code_interpreter", task_kinds=("code_interpreter", "calculator", "arithmetic"),
                      paper="ReTool (Feng et al. 2025)",
                      description="python tool calls run in the sandbox, then a final integer answer (last integer == task.answer)")
def _code_interpreter(
    verifier: Verifier | None, system_prompt: str | None, max_tool_calls: int = 3, timeout_s: float = 3.0,
    memory_mb: int = 256, max_output_chars: int = 300,
) -> Environment:
    return CodeInterpreterEnv(max_tool_calls, timeout_s, memory_mb, max_output_chars, system_prompt)


@register_environment("search", task_kinds=("search",), paper="Search-R1 (Jin et al. 2025), ZeroSearch (Sun et al. 2025)",
                      description="search tool calls (BM25 top-k over the task's corpus), then an exact-match answer")
def _search(
    verifier: Verifier | None, system_prompt: str | None, k: int = 3, max_tool_calls: int = 3, max_query_chars: int = 200,
) -> Environment:
    return SearchEnv(k, max_tool_calls, max_query_chars, system_prompt)


@register_environment("nim", task_kinds=("nim",),
                      description="two roles (first, second) take 1 or 2 from a pile, the last take wins: self-play "
                      "(opponent=self) or against a scripted opponent (random, optimal); docs/multi_agent.md")
def _nim(verifier: Verifier | None, system_prompt: str | None, opponent: str = "self",
         policy_role: str = "first") -> Environment:
    return NimEnv(opponent=opponent, policy_role=policy_role, system_prompt=system_prompt)


@register_environment("guess_duel", task_kinds=(ENV_TASKS,), tasks=duel_tasks,
                      description="a proposer answers higher/lower/yes (committing to a secret in [low, high] as it "
                      "answers), a guesser guesses; zero-sum or shaped per role (docs/multi_agent.md)")
def _guess_duel(verifier: Verifier | None, system_prompt: str | None, low: int = 1, high: int = 16, games: int = 256,
                max_guesses: int = 5, reward: str = "shaped") -> Environment:
    """``low``..``high``: the range; ``games``: tasks; ``reward``: zero_sum or shaped (by guesses left)."""
    return GuessDuelEnv(max_guesses=max_guesses, reward=reward, system_prompt=system_prompt)


@register_environment("tictactoe", task_kinds=(ENV_TASKS,), tasks=ttt_tasks,
                      description="X and O play tic-tac-toe by cell number 1-9 (an illegal move forfeits): self-play "
                      "(opponent=self) or against a scripted opponent (random, optimal); docs/multi_agent.md")
def _tictactoe(verifier: Verifier | None, system_prompt: str | None, games: int = 256, opponent: str = "self",
               policy_role: str = "X") -> Environment:
    """``games``: tasks (the episode's seed drives a scripted opponent); ``policy_role``: X or O against a script."""
    return TicTacToeEnv(opponent=opponent, policy_role=policy_role, system_prompt=system_prompt)


@register_environment("problem_synthesis", task_kinds=(ENV_TASKS,), tasks=synthesis_tasks,
                      paper="Absolute Zero (Zhao et al. 2025); SPELL (Yang et al. 2025)",
                      description="a proposer writes an arithmetic task (checked by a safe parser), a solver answers it "
                      "`solves` times; proposer reward a registered proposer_reward of the solve rate (docs/multi_agent.md)")
def _problem_synthesis(verifier: Verifier | None, system_prompt: str | None, proposals: int = 256, ops: str = "+",
                       min_operand: int = 10, max_operand: int = 99, max_value: int = 200, solves: int = 4,
                       proposer_reward: str | dict[str, Any] = "learnability") -> Environment:
    """``proposals``: training tasks (prompts ``<a><op>``, a seeded operand ``a`` in min_operand..max_operand and the
    operators in turn); ``max_operand``: the largest operand a task may hold (the proposer's too); held-out: ``task.heldout_size`` fixed ``a<op>b`` tasks (operands
    min_operand..max_operand) for the solver alone; ``solves``: the solver's samples per task; ``proposer_reward``: a registered part."""
    return ProblemSynthesisEnv(solves=solves, ops=ops, max_operand=max_operand, max_value=max_value,
                               proposer_reward=proposer_reward, system_prompt=system_prompt)


@register_environment("simulated_user", description="the policy as assistant, the user's replies from a model "
                      "served through an OpenAI-compatible API (observations); reward the verifier on the last "
                      "assistant turn (docs/multi_agent.md)")
def _simulated_user(
    verifier: Verifier | None, system_prompt: str | None, user_url: str = "", user_model: str = "",
    user_system_prompt: str | None = DEFAULT_USER_PROMPT, user_max_tokens: int = 64, user_temperature: float = 1.0,
    user_api_key: str | None = None, user_stop: str | None = "[done]", user_timeout_s: float = 60.0,
) -> Environment:
    """``user_url``: the server's base URL (``.../v1``); ``user_model``: its model; ``user_system_prompt``: the
    simulator's persona (``{stop}``: user_stop); ``user_stop``: a reply containing it ends the episode;
    ``user_timeout_s``: the client's limit on one reply (env.step_timeout_s bounds the step)."""
    settings = simulated_user_settings(
        user_url=user_url, user_model=user_model, user_system_prompt=user_system_prompt,
        user_max_tokens=user_max_tokens, user_temperature=user_temperature, user_api_key=user_api_key,
        user_stop=user_stop, user_timeout_s=user_timeout_s)
    return SimulatedUserEnv(settings, verifier, system_prompt)


@register_environment(AGENT, agent_driven=True, description="a black-box agent written for the OpenAI API (env.agent), through the "
                      "proxy (reinforge/serve/proxy.py)")
def _agent(verifier: Verifier | None, system_prompt: str | None) -> Environment:
    raise ConfigError("env.name=agent: episodes are played by the agent (env.agent = 'module:function') through "
                      "the OpenAI-compatible proxy, not by an Environment")


def _verifiers_tasks(heldout_size: int, seed: int, id: str = "", env_id: str = "", args: dict | None = None,
                     env_args: dict | None = None, limit: int | None = None, **_: Any) -> TaskSplits:
    return verifiers_splits(load_verifiers(id, env_id, args, env_args, limit), heldout_size, seed)


@register_environment("verifiers", task_kinds=(ENV_TASKS,), tasks=_verifiers_tasks,
                      description="a verifiers (0.4) taskset and Env by id: its tasks, its Env's turns, its rubric's "
                      "scores (reinforge/envs/verifiers_env.py)")
def _verifiers(
    verifier: Verifier | None, system_prompt: str | None, id: str = "", env_id: str = "", args: dict | None = None,
    env_args: dict | None = None, limit: int | None = None, timeout_s: float = 60.0, correct_at: float = 1.0,
) -> Environment:
    """``id``: the taskset (module or package); ``env_id``: its Env ('' = the taskset's own); ``args`` / ``env_args``:
    their config fields; ``limit``: tasks taken; ``timeout_s``: one wait on the Env's coroutine."""
    return VerifiersEnv(load_verifiers(id, env_id, args, env_args, limit), system_prompt, timeout_s, correct_at)


def _textarena_tasks(heldout_size: int, seed: int, game: str = "", games: int = 256, **_: Any) -> TaskSplits:
    return textarena_splits(game, games, heldout_size, seed)


@register_environment("textarena", task_kinds=(ENV_TASKS,), tasks=_textarena_tasks,
                      description="a TextArena game: the policy in one seat, a random or scripted opponent in the "
                      "others; reward by win / draw / loss (reinforge/envs/textarena_env.py)")
def _textarena(
    verifier: Verifier | None, system_prompt: str | None, game: str = "", games: int = 256, player: int = 0,
    num_players: int = 2, opponent: str = "random", win: float = 1.0, draw: float = 0.5, loss: float = 0.0,
    view: str = "", move: str = "{}",
) -> Environment:
    """``game``: a TextArena env id; ``games``: seeded games (tasks); ``player``: our seat; ``opponent``: random
    or 'module:function'; ``win`` / ``draw`` / ``loss``: the reward of each outcome; ``view``: 'module:function'
    rewriting our observations ('' = the game's text); ``move``: the format of our move ('{}' = the text)."""
    return TextArenaEnv(game, player, num_players, opponent, win, draw, loss, system_prompt, view, move)


def _openenv_tasks(heldout_size: int, seed: int, url: str = "", episodes: int = 256, **_: Any) -> TaskSplits:
    return openenv_splits(episodes, heldout_size, seed, url)


@register_environment("openenv", task_kinds=(ENV_TASKS,), tasks=_openenv_tasks,
                      description="an OpenEnv server over HTTP (one connection per episode): its observations, the "
                      "model's text as the action, its rewards (reinforge/envs/openenv_env.py)")
def _openenv(
    verifier: Verifier | None, system_prompt: str | None, url: str = "", episodes: int = 256,
    action_field: str = "message", observation_field: str = "", reset_args: dict | None = None,
    action_args: dict | None = None, seeded: bool = True, timeout_s: float = 30.0,
) -> Environment:
    """``url``: the server; ``episodes``: reset seeds (tasks); ``action_field``: the action's text field;
    ``observation_field``: the observation's text field ('' = every field); ``timeout_s``: one call."""
    return OpenEnvEnv(url, action_field, observation_field, reset_args, action_args, seeded, timeout_s, system_prompt)


def environment_spec(name: str) -> EnvSpec:
    if name not in ENVIRONMENTS:
        raise EnvironmentConfigError(f"env.name: unknown environment {name!r}; allowed: {', '.join(ENVIRONMENTS.in_order())}")
    return ENVIRONMENTS.get(name)


def build_environment(
    name: str, verifier: Verifier | None, system_prompt: str | None, params: dict[str, Any] | None = None
) -> Callable[[], Environment]:
    """A factory making a fresh ``name`` environment per episode; the parameters are checked now
    by building one environment, so a bad recipe fails before training starts."""
    spec = environment_spec(name)
    params = dict(params or {})
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(f"{k} (default {v!r})" for k, v in spec.params.items()) or "none"
        raise EnvironmentConfigError(f"env: {name!r} has no parameter {', '.join(map(repr, unknown))}; allowed: {allowed}")
    if spec.agent_driven:
        return partial(spec.make, verifier, system_prompt)  # never called: the loop runs the agent
    if spec.uses_verifier and verifier is None:
        raise EnvironmentConfigError(f"env {name!r} scores with the task's verifier, but none was given")
    factory = partial(spec.make, verifier, system_prompt, **params)
    try:
        factory()
    except (TypeError, ValueError) as e:
        raise EnvironmentConfigError(f"env: {name!r}: {e}") from None
    return factory


def check_task_kind(env_name: str, task_kind: str) -> None:
    """Raise when environment ``env_name`` is not built for task source ``task_kind``."""
    spec = environment_spec(env_name)
    if task_kind == ENV_TASKS and spec.tasks is None:
        raise EnvironmentConfigError(f"task.kind={ENV_TASKS}: env {env_name!r} has no tasks of its own")
    kinds = spec.task_kinds
    if kinds is not None and task_kind not in kinds:
        raise EnvironmentConfigError(f"env {env_name!r} needs task.kind in {', '.join(kinds)}, got {task_kind!r}")


def environment_task_splits(env_name: str, params: dict[str, Any], heldout_size: int, seed: int) -> TaskSplits:
    """``task.kind=env``: the splits environment ``env_name`` makes from its parameters (a ConfigError naming
    the field)."""
    spec = environment_spec(env_name)
    if spec.tasks is None:
        with_tasks = [n for n in ENVIRONMENTS.in_order() if ENVIRONMENTS.get(n).tasks is not None]
        raise EnvironmentConfigError(f"task.kind={ENV_TASKS}: env.name={env_name} has no tasks of its own; "
                                     f"environments that have: {', '.join(with_tasks)}")
    try:
        return spec.tasks(heldout_size=heldout_size, seed=seed, **{**spec.params, **params})
    except (TypeError, ValueError) as e:
        raise EnvironmentConfigError(f"task.kind={ENV_TASKS} (env.name={env_name}): {e}") from None

