"""Tic-tac-toe for two roles, ``X`` (moves first) and ``O``: a move is a cell number 1-9 (rows from the top,
left to right), the last integer of the model's turn; a move that is not 1-9 or names a taken cell forfeits.

The board is written as nine characters, ``x``, ``o`` or the free cell's own number, in every prompt with the
role to move: ``"ttt 123456789: X"``, then ``"x23o56789: X"`` (free cells as digits: tiny-agent answers a
board of dots with a letter, one of digits with a digit). ``opponent="self"``: the policy plays both
roles; ``"random"`` or ``"optimal"`` (minimax, ties broken at random): a scripted player inside the
environment plays the role that is not ``policy_role``, and its move is already on the board the policy is
shown. Rewards are zero-sum on the last step: ``info["role_rewards"] = {winner: 1, loser: -1}`` (a draw:
0 each), ``info["winner"]`` (absent on a draw). The step's own reward (the team reward) is 0 in self-play
and the policy's result (1, 0 or -1) against a script; ``info["correct"]``: the policy did not lose
(against a script: a win or a draw), or, in self-play, the game ended without a forfeit. Deterministic
given the seed (the scripted player's random choices draw from it).
"""

from __future__ import annotations

import random
from functools import cache

from reinforge.envs.base import Message, StepResult
from reinforge.envs.calculator import last_integer
from reinforge.types import Task

ROLES = ("X", "O")
OPPONENTS = ("self", "random", "optimal")
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
EMPTY = "."


def winner_of(board: str) -> str | None:
    """``"x"`` or ``"o"`` when that mark holds a line, else None."""
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def shown(board: str) -> str:
    """The board as a prompt shows it: the marks, and each free cell's number (1-9)."""
    return "".join(str(i + 1) if c == EMPTY else c for i, c in enumerate(board))


def _mark(role: str) -> str:
    return role.lower()


@cache
def minimax_value(board: str, mark: str) -> int:
    """The game's value for ``mark`` to move on ``board``: 1 win, 0 draw, -1 loss, with best play by both."""
    won = winner_of(board)
    if won is not None:
        return 1 if won == mark else -1
    if EMPTY not in board:
        return 0
    other = "o" if mark == "x" else "x"
    return max(-minimax_value(board[:i] + mark + board[i + 1:], other) for i in range(9) if board[i] == EMPTY)


def optimal_moves(board: str, mark: str) -> list[int]:
    """The cells (0-8) whose move keeps the best value for ``mark``."""
    other = "o" if mark == "x" else "x"
    free = [i for i in range(9) if board[i] == EMPTY]
    values = {i: -minimax_value(board[:i] + mark + board[i + 1:], other) for i in free}
    best = max(values.values())
    return [i for i in free if values[i] == best]


class TicTacToeEnv:
    """3x3 tic-tac-toe; ``role()`` is whose turn the model's next turn is."""

    def __init__(self, opponent: str = "self", policy_role: str = "X", system_prompt: str | None = None) -> None:
        if opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {', '.join(OPPONENTS)}, got {opponent!r}")
        if policy_role not in ROLES:
            raise ValueError(f"policy_role must be one of {', '.join(ROLES)}, got {policy_role!r}")
        self.opponent, self.policy_role, self.system_prompt = opponent, policy_role, system_prompt
        self.board, self.turn, self.done = EMPTY * 9, ROLES[0], True

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        self.rng, self.board, self.done, self.turn = random.Random(seed), EMPTY * 9, False, ROLES[0]
        if self.opponent != "self" and self.policy_role != ROLES[0]:
            self._opponent_move()
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*system, {"role": "user", "content": f"ttt {shown(self.board)}: {self.turn}"}]

    def role(self) -> str:
        return self.turn

    def state_key(self) -> str:
        return f"{self.board}:{self.turn}"

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        mover = self.turn
        cell = last_integer(assistant.get("content") or "")
        if cell is None or not 1 <= cell <= 9 or self.board[cell - 1] != EMPTY:
            return self._end(winner=self._other(mover), forfeit=True)
        ended = self._play(cell - 1)
        if ended is not None:
            return ended
        if self.opponent != "self":
            self._opponent_move()
            ended = self._outcome()
            if ended is not None:
                return ended
        return StepResult([{"role": "user", "content": f"{shown(self.board)}: {self.turn}"}], 0.0, False)

    def _play(self, cell: int) -> StepResult | None:
        self.board = self.board[:cell] + _mark(self.turn) + self.board[cell + 1:]
        self.turn = self._other(self.turn)
        return self._outcome()

    def _outcome(self) -> StepResult | None:
        won = winner_of(self.board)
        if won is not None:
            return self._end(winner=won.upper(), forfeit=False)
        if EMPTY not in self.board:
            return self._end(winner=None, forfeit=False)
        return None

    def _opponent_move(self) -> None:
        mark = _mark(self.turn)
        cells = optimal_moves(self.board, mark) if self.opponent == "optimal" else \
            [i for i in range(9) if self.board[i] == EMPTY]
        cell = self.rng.choice(cells)
        self.board = self.board[:cell] + mark + self.board[cell + 1:]
        self.turn = self._other(self.turn)

    @staticmethod
    def _other(role: str) -> str:
        return ROLES[1] if role == ROLES[0] else ROLES[0]

    def _end(self, winner: str | None, forfeit: bool) -> StepResult:
        self.done = True
        info: dict = {"forfeit": forfeit, "board": self.board}
        if winner is None:
            info["role_rewards"] = {ROLES[0]: 0.0, ROLES[1]: 0.0}
        else:
            info |= {"role_rewards": {winner: 1.0, self._other(winner): -1.0}, "winner": winner}
        if self.opponent == "self":
            return StepResult([], 0.0, True, {**info, "correct": not forfeit})
        result = 0.0 if winner is None else 1.0 if winner == self.policy_role else -1.0
        return StepResult([], result, True, {**info, "correct": result >= 0})
