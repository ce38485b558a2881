"""A guessing duel for two roles: the ``proposer`` holds a secret in ``[low, high]`` and answers the
``guesser``'s guesses with ``higher``, ``lower`` or ``yes``; the guesser has ``max_guesses`` guesses.

One episode is one token sequence that both roles read, so a secret the proposer wrote down would be in
plain sight of the guesser. The proposer therefore commits as it answers: an answer is legal when at least
one secret in the range agrees with every answer so far (``yes`` only for a guess inside the interval the
answers allow, ``higher`` only when a larger secret is left, ``lower`` only when a smaller one is); the
secret is fixed when the interval is one number. This is the game with a secret chosen in advance
against any guesser that does not read minds, and it keeps the proposer's choice its own: a proposer that
answers ``yes`` early, or narrows the interval fast, loses sooner. An illegal answer forfeits, as does a
guesser turn without an integer. The proposer answers with a number ``m`` (the last integer of its turn):
``higher`` when ``m`` is above the guess, ``lower`` below, ``yes`` equal (it points to where its secret
lies; tiny-agent writes digits, not words); a turn without an integer answers by its first letter (``h``,
``l`` or ``y``: the words ``higher`` / ``lower`` / ``yes`` start with them).

Prompts: ``"duel 1-16: guesser"``, then ``"8? proposer"`` and ``"higher: guesser"``. Rewards, zero-sum on
the last step (``info["role_rewards"]``, ``info["winner"]``): ``reward="zero_sum"``: the winner +1 (the
guesser on ``yes``, the proposer when the guesses run out), the loser -1. ``reward="shaped"``: a find at
guess ``k`` of ``G`` gives the guesser ``s = (G - k + 1) / G`` and the proposer ``-s``; guesses running out
give 0 each; a forfeit is -1 / +1 under both. Why shaped: a bisecting guesser always finds the secret in
``ceil(log2(n + 1))`` guesses, so with enough guesses the zero-sum proposer always loses and learns only
to stay legal; under ``shaped`` every guess it forces is worth ``1/G``. The step reward (team) is 0;
``info["correct"]``: the game ended without a forfeit. No randomness: deterministic.
"""

from __future__ import annotations

from reinforge.envs.base import Message, StepResult
from reinforge.envs.calculator import last_integer
from reinforge.types import Task

PROPOSER, GUESSER = "proposer", "guesser"
REWARDS = ("zero_sum", "shaped")
ANSWERS = {"h": "higher", "l": "lower", "y": "yes"}


class GuessDuelEnv:
    """The range is ``task.metadata["low"]``..``["high"]``; ``role()`` is whose turn the next model turn is."""

    def __init__(self, max_guesses: int = 5, reward: str = "shaped", system_prompt: str | None = None) -> None:
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or max_guesses < 1:
            raise ValueError(f"max_guesses must be an integer >= 1, got {max_guesses!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        self.max_guesses, self.reward, self.system_prompt = max_guesses, reward, system_prompt
        self.done, self.turn = True, GUESSER

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        low, high = task.metadata.get("low"), task.metadata.get("high")
        if not isinstance(low, int) or not isinstance(high, int) or low > high:
            raise ValueError(f"GuessDuelEnv needs integer metadata low <= high; task {task.id!r} has {low!r}, {high!r}")
        self.lo, self.hi, self.guesses, self.guess = low, high, 0, 0
        self.done, self.turn = False, GUESSER
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*system, {"role": "user", "content": f"duel {low}-{high}: {GUESSER}"}]

    def role(self) -> str:
        return self.turn

    def state_key(self) -> str:
        return f"{self.lo}-{self.hi}:{self.guesses}:{self.turn}"

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        text = (assistant.get("content") or "").strip()
        if self.turn == GUESSER:
            guess = last_integer(text)
            if guess is None:
                return self._forfeit(GUESSER)
            self.guess, self.guesses, self.turn = guess, self.guesses + 1, PROPOSER
            return StepResult([{"role": "user", "content": f"{guess}? {PROPOSER}"}], 0.0, False)
        g, pointed = self.guess, last_integer(text)
        answer = ANSWERS.get(text[:1].lower()) if pointed is None else \
            "yes" if pointed == g else "higher" if pointed > g else "lower"
        if answer == "yes" and self.lo <= g <= self.hi:
            return self._found()
        if answer == "higher" and self.hi > g:
            self.lo = max(self.lo, g + 1)
        elif answer == "lower" and self.lo < g:
            self.hi = min(self.hi, g - 1)
        else:
            return self._forfeit(PROPOSER)
        if self.guesses >= self.max_guesses:
            return self._end({GUESSER: 0.0, PROPOSER: 0.0} if self.reward == "shaped" else
                             {GUESSER: -1.0, PROPOSER: 1.0}, PROPOSER)
        self.turn = GUESSER
        return StepResult([{"role": "user", "content": f"{answer}: {GUESSER}"}], 0.0, False)

    def _found(self) -> StepResult:
        s = (self.max_guesses - self.guesses + 1) / self.max_guesses if self.reward == "shaped" else 1.0
        return self._end({GUESSER: s, PROPOSER: -s}, GUESSER)

    def _forfeit(self, role: str) -> StepResult:
        other = PROPOSER if role == GUESSER else GUESSER
        return self._end({role: -1.0, other: 1.0}, other, forfeit=True)

    def _end(self, rewards: dict[str, float], winner: str, forfeit: bool = False) -> StepResult:
        self.done = True
        return StepResult([], 0.0, True, {"role_rewards": rewards, "winner": winner, "forfeit": forfeit,
                                          "correct": not forfeit, "guesses": self.guesses})
