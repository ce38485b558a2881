"""TextArena games (textarena 0.7): our policy plays one seat, a fixed opponent the others.

``game`` is a TextArena env id (``TicTacToe-v0``, ``ConnectFour-v0``, ...), made with ``ta.make`` and
stripped of its observation / action wrappers: the raw game gives each player the messages since its
last turn, which is exactly the delta our growing context needs (the wrappers re-send the whole history).
Each task is one seeded game (``task: {kind: env}``: ``games`` seeds, `textarena_splits`); the game's
seed is ``reset(num_players, seed)``'s, so an episode replays exactly.

Episode: ``reset`` plays the opponents' moves until it is our seat's turn and returns the game's messages
as one user message (the game's messages as they are, another player's move as ``[Player k] move``,
one a line; our own moves are not echoed). Each
``step`` sends the model's text to the game as our move (the game reads the bracketed move, e.g.
``[4]``; an invalid move gets the game's own warning and, past its error allowance, loses), then the
opponents move. When the game is over, its per-player reward for our seat ``r`` (TextArena: +1 win,
0 draw, -1 loss) becomes ours by its sign: ``win`` (r > 0, default 1.0), ``draw`` (r == 0, 0.5),
``loss`` (r < 0, 0.0); ``info``: ``outcome``, ``reason``, ``correct`` (a win), ``opponent_moves``.

Opponents (``opponent``): ``random`` picks uniformly (seeded by the game) among the bracketed moves the
opponent's latest observation lists (``Available Moves: '[0]', '[4]'``; ``[0]`` when it lists none);
``module:function`` is a scripted opponent, called ``fn(observation: str, player_id: int,
rng: random.Random) -> str``. Not supported: the trained policy as the opponent (its turns would need the
engine inside the environment), games of more than one trained seat.

For small models (``view``, ``move``): ``view: module:function`` shows the model ``fn(text, player_id) -> str``
in place of each of our observations (the opponents still read the game's text), e.g. a compact board for a
model whose context is a few hundred characters; ``move`` formats the model's text (stripped) into the move
sent to the game, e.g. ``"[{}]"`` for a model that writes a bare cell number.

Nothing downloads: a game whose module fetches NLTK data (``nltk.download``: Wordle, Hangman, ...) is refused
with the resource's name unless the data is already installed (``python -m nltk.downloader words``).
"""

from __future__ import annotations

import contextlib
import importlib
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

from reinforge.data.base import TaskSplits
from reinforge.envs.base import Message, StepResult
from reinforge.types import Task

EXTRA = 'pip install "reinforge[envs]"'
MOVE = re.compile(r"\[[^\[\]\n]{1,20}\]")
PLAYER_ACTION = "PLAYER_ACTION"


def import_textarena() -> Any:
    try:
        import textarena as ta
    except ImportError as e:
        raise ImportError(f"env.name=textarena needs the textarena package: {EXTRA}") from e
    return ta


@contextlib.contextmanager
def no_downloads(game: str) -> Iterator[None]:
    """Refuse ``nltk.download`` of data not installed (TextArena's word games call it at import and reset)."""
    try:
        import nltk
    except ImportError:
        yield
        return
    original = nltk.download

    def offline(resource: Any = None, *args: Any, **kwargs: Any) -> bool:
        names = resource if isinstance(resource, list | tuple) else [resource]
        for name in names:
            if not any(_installed(nltk, f"{kind}/{name}") for kind in ("corpora", "taggers", "tokenizers")):
                raise RuntimeError(f"env.game={game!r} needs the NLTK data {name!r}, which is not installed; nothing is "
                                   f"downloaded during training: install it beforehand (python -m nltk.downloader {name})")
        return True

    nltk.download = offline
    try:
        yield
    finally:
        nltk.download = original


def _installed(nltk: Any, path: str) -> bool:
    for suffix in ("", ".zip"):
        try:
            nltk.data.find(path + suffix)
            return True
        except LookupError:
            continue
    return False


def random_opponent(observation: str, player_id: int, rng: random.Random) -> str:
    """A uniformly random move among the bracketed moves the observation lists (``[0]`` when none)."""
    tail = observation.rsplit("Available Moves", 1)[-1] if "Available Moves" in observation else observation
    moves = sorted(set(MOVE.findall(tail)))
    return rng.choice(moves) if moves else "[0]"


OPPONENTS: dict[str, Callable[[str, int, random.Random], str]] = {"random": random_opponent}


def resolve_opponent(opponent: Any) -> Callable[[str, int, random.Random], str]:
    if isinstance(opponent, str) and opponent in OPPONENTS:
        return OPPONENTS[opponent]
    if not isinstance(opponent, str) or ":" not in opponent:
        raise ValueError(f"env.opponent must be 'random' or 'module:function', got {opponent!r}")
    return resolve_function("opponent", opponent)


def resolve_function(field: str, spec: Any) -> Callable[..., Any]:
    """``module:function`` imported, or a ValueError naming ``env.<field>``."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"env.{field} must be 'module:function', got {spec!r}")
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"env.{field}={spec!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"env.{field}={spec!r} is not a function")
    return fn


def check_move_format(move: Any) -> str:
    if not isinstance(move, str) or move.count("{}") != 1:
        raise ValueError(f"env.move must be a format string with one '{{}}' (the model's text), got {move!r}")
    return move


def make_game(game: str) -> Any:
    """The raw game ``game`` (its wrappers removed): a ValueError naming ``env.game`` when unknown."""
    ta = import_textarena()
    if not isinstance(game, str) or not game:
        raise ValueError(f"env.game: name a TextArena game (e.g. TicTacToe-v0), got {game!r}")
    if game not in ta.envs.registration.ENV_REGISTRY:
        raise ValueError(f"env.game: unknown TextArena game {game!r}")
    with no_downloads(game):
        env = ta.make(env_id=game)
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


def textarena_splits(game: str, games: int, heldout_size: int, seed: int) -> TaskSplits:
    """``games`` seeded games of ``game`` (seed ``i`` for task ``i``), split (seeded) into train / held-out."""
    from reinforge.envs.adapter_tasks import seeded_splits

    if isinstance(games, bool) or not isinstance(games, int) or games < 2:
        raise ValueError(f"env.games must be an integer >= 2, got {games!r}")
    tasks = [Task(id=f"ta-{game}-{i}", prompt=f"{game} game {i}", answer="", metadata={"game": game, "game_seed": i})
             for i in range(games)]
    return seeded_splits(tasks, heldout_size, seed, f"textarena({game})")


class TextArenaEnv:
    """One game of ``game`` with our policy in seat ``player`` (module docstring)."""

    def __init__(self, game: str, player: int = 0, num_players: int = 2, opponent: Any = "random",
                 win: float = 1.0, draw: float = 0.5, loss: float = 0.0, system_prompt: str | None = None,
                 view: str = "", move: str = "{}") -> None:
        if isinstance(num_players, bool) or not isinstance(num_players, int) or num_players < 1:
            raise ValueError(f"env.num_players must be an integer >= 1, got {num_players!r}")
        if isinstance(player, bool) or not isinstance(player, int) or not 0 <= player < num_players:
            raise ValueError(f"env.player must be a seat in 0..{num_players - 1}, got {player!r}")
        for name, value in (("win", win), ("draw", draw), ("loss", loss)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"env.{name} must be a number, got {value!r}")
        self.game_id, self.player, self.num_players = game, player, num_players
        self.opponent = resolve_opponent(opponent)
        self.values = {1: float(win), 0: float(draw), -1: float(loss)}
        self.system_prompt = system_prompt
        self.view = resolve_function("view", view) if view else None
        self.move = check_move_format(move)
        make_game(game)  # a bad game fails when the recipe is checked

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        if task.metadata.get("game") != self.game_id or not isinstance(task.metadata.get("game_seed"), int):
            raise ValueError(f"task {task.id!r} is not a game of {self.game_id!r} (use task.kind=env)")
        self.game = make_game(self.game_id)
        game_seed = task.metadata["game_seed"]
        with no_downloads(self.game_id):
            self.game.reset(num_players=self.num_players, seed=game_seed)
        self.rng, self.opponent_moves, self.done = random.Random(game_seed), 0, False
        text = self._until_our_turn()
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if self.done:
            raise RuntimeError(f"game {task.id!r} ended before our seat (player {self.player}) moved")
        return messages + [{"role": "user", "content": text}]

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            raise RuntimeError("step() after the game ended: call reset() first")
        text = assistant.get("content") or ""
        done, _ = self.game.step(text if self.move == "{}" else self.move.format(text.strip()))
        text = "" if done else self._until_our_turn()
        if done or self.done:
            return self._end()
        return StepResult([{"role": "user", "content": text}], 0.0, False, {})

    def _until_our_turn(self) -> str:
        """Play the opponents until our seat is to move (or the game ends); our seat's new messages."""
        while True:
            pid, observation = self.game.get_observation()
            if pid == self.player:
                text = self._render(observation)
                return str(self.view(text, self.player)) if self.view is not None else text
            done, _ = self.game.step(self.opponent(self._render(observation), pid, self.rng))
            self.opponent_moves += 1
            if done:
                self.done = True
                return ""

    def _render(self, observation: Any) -> str:
        if isinstance(observation, str):
            return observation
        lines = []
        for from_id, message, kind in observation:
            if from_id == self.player and getattr(kind, "name", "") == PLAYER_ACTION:
                continue  # our own move, already in the context
            lines.append(message if from_id < 0 else f"[Player {from_id}] {message}")
        return "\n".join(lines)

    def _end(self) -> StepResult:
        self.done = True
        rewards, game_info = self.game.close()
        r = (rewards or {}).get(self.player, 0)
        sign = (r > 0) - (r < 0)
        outcome = {1: "win", 0: "draw", -1: "loss"}[sign]
        info = {"outcome": outcome, "correct": sign > 0, "opponent_moves": self.opponent_moves,
                "reason": str((game_info or {}).get(self.player, {}).get("reason", ""))}
        return StepResult([], self.values[sign], True, info)
