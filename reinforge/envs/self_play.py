"""The self-play environments, registered with their own tasks (``task.kind: env``; docs/multi_agent.md):
``guess_duel`` (a proposer and a guesser), ``tictactoe`` (X and O) and ``problem_synthesis`` (a proposer
writes arithmetic tasks, a solver solves them: Absolute Zero). Imported by reinforge/envs/registry.py."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from reinforge.data.base import TaskSplits
from reinforge.data.grid import grid_splits
from reinforge.envs.base import Environment
from reinforge.envs.guess_duel import GuessDuelEnv
from reinforge.envs.problem_synthesis import OPERATORS, ProblemSynthesisEnv, check_task
from reinforge.envs.registry import register_environment
from reinforge.envs.tictactoe import TicTacToeEnv
from reinforge.rewards.verifiers import Verifier
from reinforge.types import Task


def _game_task(index: int, name: str, metadata: dict[str, Any]) -> Task:
    return Task(id=f"{name}-{index}", prompt=[{"role": "user", "content": name}], answer="",
                metadata={**metadata, "game": index})


def _check_games(games: int, heldout_size: int) -> None:
    if isinstance(games, bool) or not isinstance(games, int) or games < 2:
        raise ValueError(f"games must be an integer >= 2, got {games!r}")


def _duel_tasks(heldout_size: int, seed: int, low: int = 1, high: int = 16, games: int = 256, **_: Any) -> TaskSplits:
    _check_games(games, heldout_size)
    if isinstance(low, bool) or isinstance(high, bool) or not isinstance(low, int) or not isinstance(high, int) \
            or not 0 <= low < high:
        raise ValueError(f"need integers 0 <= low < high, got low={low!r}, high={high!r}")
    return grid_splits(games, heldout_size, seed, partial(_game_task, name=f"duel {low}-{high}",
                                                          metadata={"low": low, "high": high}), f"guess_duel({low}-{high})")


@register_environment("guess_duel", task_kinds=("env",), tasks=_duel_tasks,
                      description="a proposer answers higher/lower/yes (committing to a secret in [low, high] as it "
                      "answers), a guesser guesses; zero-sum or shaped per role (docs/multi_agent.md)")
def _guess_duel(verifier: Verifier | None, system_prompt: str | None, low: int = 1, high: int = 16, games: int = 256,
                max_guesses: int = 5, reward: str = "shaped") -> Environment:
    """``low``..``high``: the range; ``games``: tasks; ``reward``: zero_sum or shaped (by guesses left)."""
    return GuessDuelEnv(max_guesses=max_guesses, reward=reward, system_prompt=system_prompt)


def _ttt_tasks(heldout_size: int, seed: int, games: int = 256, **_: Any) -> TaskSplits:
    _check_games(games, heldout_size)
    return grid_splits(games, heldout_size, seed, partial(_game_task, name="ttt", metadata={}), "tictactoe")


@register_environment("tictactoe", task_kinds=("env",), tasks=_ttt_tasks,
                      description="X and O play tic-tac-toe by cell number 1-9 (an illegal move forfeits): self-play "
                      "(opponent=self) or against a scripted opponent (random, optimal); docs/multi_agent.md")
def _tictactoe(verifier: Verifier | None, system_prompt: str | None, games: int = 256, opponent: str = "self",
               policy_role: str = "X") -> Environment:
    """``games``: tasks (the episode's seed drives a scripted opponent); ``policy_role``: X or O against a script."""
    return TicTacToeEnv(opponent=opponent, policy_role=policy_role, system_prompt=system_prompt)


def heldout_expressions(size: int, seed: int, ops: str, min_operand: int, max_operand: int, max_value: int) -> list[str]:
    """``size`` distinct fixed tasks ``a<op>b`` (seeded; operands min_operand..max_operand, value in [0, max_value])."""
    rng, out = np.random.default_rng(seed), dict[str, None]()
    for _ in range(100 * size):
        a, b = (int(v) for v in rng.integers(min_operand, max_operand + 1, size=2))
        text = f"{a}{ops[int(rng.integers(len(ops)))]}{b}"
        if check_task(text, ops, max_operand, max_value)[0] is None:
            out[text] = None
        if len(out) == size:
            return list(out)
    raise ValueError(f"could not draw {size} distinct held-out tasks with ops={ops!r}, max_operand={max_operand}")


def _synthesis_tasks(heldout_size: int, seed: int, proposals: int = 256, ops: str = "+", min_operand: int = 10,
                     max_operand: int = 99, max_value: int = 200, **_: Any) -> TaskSplits:
    if isinstance(proposals, bool) or not isinstance(proposals, int) or proposals < 1:
        raise ValueError(f"proposals must be an integer >= 1, got {proposals!r}")
    if not ops or set(ops) - set(OPERATORS):
        raise ValueError(f"ops must be operators from {OPERATORS!r}, got {ops!r}")
    if isinstance(min_operand, bool) or not isinstance(min_operand, int) or not 0 <= min_operand <= max_operand:
        raise ValueError(f"need integers 0 <= min_operand <= max_operand, got {min_operand!r}, {max_operand!r}")
    rng = np.random.default_rng([seed, 1])
    prefixes = [f"{int(rng.integers(min_operand, max_operand + 1))}{ops[i % len(ops)]}" for i in range(proposals)]
    train = [Task(id=f"propose-{i}", prompt=[{"role": "user", "content": p}], answer="", metadata={"prefix": p})
             for i, p in enumerate(prefixes)]
    heldout = [Task(id=f"solve-{e}", prompt=[{"role": "user", "content": f"{e}="}], answer="", metadata={"expression": e})
               for e in heldout_expressions(heldout_size, seed, ops, min_operand, max_operand, max_value)]
    return TaskSplits(train=train, heldout=heldout, name=f"problem_synthesis(ops={ops}, max_operand={max_operand})")


@register_environment("problem_synthesis", task_kinds=("env",), tasks=_synthesis_tasks,
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
