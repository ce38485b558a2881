"""Nim with one pile, for two roles: each move takes 1 or 2, and whoever takes the last one wins.

The roles are ``first`` and ``second``. ``opponent="self"``: the policy plays both roles (self-play; the
environment's ``role()`` says whose turn the model's next turn is). ``opponent="random"`` or ``"optimal"``:
the policy plays ``policy_role`` and a scripted player, inside the environment, plays the other (its moves
are observations). The pile is ``int(task.answer)``; the role is written in every prompt the model sees:
``"nim 7: first, take 1 or 2"``, then ``"left 5: second"`` (self-play) or ``"they took 2, left 3: first"``.

A move is the last integer of the model's turn; anything but 1 or 2, or more than the pile, forfeits.
Rewards are zero-sum, on the last step: ``info["role_rewards"] = {winner: 1, loser: -1}`` and ``info["winner"]``.
The step's own reward (the team reward) is 0 in self-play (no team), and the policy's result (1 or -1)
against a scripted opponent. ``info["correct"]``: the policy's role won (against a scripted opponent), or
the game ended by a legal last move (self-play). Deterministic given the seed (the random opponent's).
"""

from __future__ import annotations

import random

from reinforge.envs.base import Message, StepResult
from reinforge.envs.calculator import last_integer
from reinforge.types import Task

ROLES = ("first", "second")
OPPONENTS = ("self", "random", "optimal")


def optimal_move(pile: int, rng: random.Random) -> int:
    """Leave a multiple of 3 when the pile allows it; otherwise a random legal move."""
    return pile % 3 if pile % 3 else rng.choice([m for m in (1, 2) if m <= pile])


class NimEnv:
    """One pile, moves of 1 or 2, the last take wins; ``role()`` is whose turn the model's next turn is."""

    def __init__(self, opponent: str = "self", policy_role: str = "first", system_prompt: str | None = None) -> None:
        if opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {', '.join(OPPONENTS)}, got {opponent!r}")
        if policy_role not in ROLES:
            raise ValueError(f"policy_role must be one of {', '.join(ROLES)}, got {policy_role!r}")
        self.opponent, self.policy_role, self.system_prompt = opponent, policy_role, system_prompt
        self.pile = 0
        self.turn = ROLES[0]
        self.done = True

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        try:
            self.pile = int(task.answer)
        except ValueError:
            raise ValueError(f"NimEnv needs an integer answer (the pile); task {task.id!r} has {task.answer!r}") from None
        if self.pile < 1:
            raise ValueError(f"NimEnv needs a pile of at least 1; task {task.id!r} has {self.pile}")
        self.rng, self.done = random.Random(seed), False
        self.turn = ROLES[0] if self.opponent == "self" else self.policy_role  # against a script: always the policy's
        start = self.pile
        text = f"nim {start}: {{role}}, take 1 or 2"
        if self.opponent != "self" and self.policy_role != ROLES[0]:
            taken = self._opponent_move()
            if self.pile == 0:  # cannot happen for a pile of 3 or more; a pile of 1 or 2 is the opponent's win
                raise ValueError(f"task {task.id!r}: a pile of {start} is won by the first move; the policy "
                                 "plays second (policy_role), so give piles of 3 or more")
            text = f"nim {start}, they took {taken}, left {self.pile}: {{role}}, take 1 or 2"
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*system, {"role": "user", "content": text.format(role=self.turn)}]

    def role(self) -> str:
        return self.turn

    def state_key(self) -> str:
        return f"{self.pile}:{self.turn}"

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        mover = self.turn
        move = last_integer(assistant.get("content") or "")
        if move not in (1, 2) or move > self.pile:
            return self._end(winner=self._other(mover), forfeit=True)
        self.pile -= move
        if self.pile == 0:
            return self._end(winner=mover, forfeit=False)
        if self.opponent == "self":
            self.turn = self._other(mover)
            return StepResult([{"role": "user", "content": f"left {self.pile}: {self.turn}"}], 0.0, False)
        taken = self._opponent_move()
        if self.pile == 0:
            return self._end(winner=self._other(mover), forfeit=False)
        return StepResult([{"role": "user", "content": f"they took {taken}, left {self.pile}: {self.turn}"}], 0.0, False)

    def _opponent_move(self) -> int:
        move = optimal_move(self.pile, self.rng) if self.opponent == "optimal" else \
            self.rng.choice([m for m in (1, 2) if m <= self.pile])
        self.pile -= move
        return move

    @staticmethod
    def _other(role: str) -> str:
        return ROLES[1] if role == ROLES[0] else ROLES[0]

    def _end(self, winner: str, forfeit: bool) -> StepResult:
        self.done = True
        loser = self._other(winner)
        info = {"role_rewards": {winner: 1.0, loser: -1.0}, "winner": winner, "forfeit": forfeit}
        if self.opponent == "self":
            return StepResult([], 0.0, True, {**info, "correct": not forfeit})
        won = winner == self.policy_role
        return StepResult([], 1.0 if won else -1.0, True, {**info, "correct": won})
