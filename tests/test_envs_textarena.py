"""The TextArena adapter (reinforge/envs/textarena_env.py): TicTacToe (shipped offline) against scripted and
random opponents; outcomes map to the documented rewards; the collector plays whole games with tiny-base."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

# a skip without importing textarena here: collecting the suite should not pay for its import
pytestmark = pytest.mark.skipif(importlib.util.find_spec("textarena") is None, reason="the envs extra is not installed")

from reinforge.envs.registry import EnvironmentConfigError, build_environment  # noqa: E402
from reinforge.envs.textarena_env import no_downloads, random_opponent, textarena_splits  # noqa: E402
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes  # noqa: E402
from reinforge.rollout.types import SamplingParams  # noqa: E402

GAME = "TicTacToe-v0"

OPPONENTS = textwrap.dedent('''
    def lowest_free(observation, player_id, rng):
        """The lowest-numbered free cell of the last board shown."""
        moves = observation.rsplit("Available Moves:", 1)[-1]
        return min(moves.replace("'", "").replace(",", " ").split(), key=lambda m: int(m.strip("[]")))


    def one(observation, player_id, rng):
        return "[1]"
''')


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    (tmp_path / "rf_ta_opponents.py").write_text(OPPONENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "rf_ta_opponents:lowest_free"


def _task(seed=0):
    splits = textarena_splits(GAME, 8, 2, 0)
    return next(t for t in [*splits.train, *splits.heldout] if t.metadata["game_seed"] == seed)


def _play(env, moves):
    first = env.reset(_task(), 0)
    results = []
    for move in moves:
        results.append(env.step({"role": "assistant", "content": move}))
        if results[-1].done:
            break
    return first, results


def test_we_win_draw_and_lose_with_the_documented_rewards(scripted):
    make = build_environment("textarena", None, None, {"game": GAME, "opponent": scripted, "player": 0,
                                                       "win": 1.0, "draw": 0.25, "loss": -2.0})
    # we are Player 0 (O) and move first; the opponent takes the lowest free cell
    first, res = _play(make(), ["[4]", "[8]", "[5]", "[3]"])  # opp: 0, 1, 2 -> it wins on the top row
    assert "You are Player 0 in Tic Tac Toe" in first[-1]["content"] and "Available Moves" in first[-1]["content"]
    assert [r.done for r in res] == [False, False, True] and res[-1].reward == -2.0
    assert res[-1].info["outcome"] == "loss" and not res[-1].info["correct"] and res[-1].info["opponent_moves"] == 3
    assert "[Player 1] [0]" in res[0].observation[0]["content"]  # the opponent's move, not ours
    assert "[Player 0]" not in res[0].observation[0]["content"]
    _, res = _play(make(), ["[3]", "[4]", "[5]"])  # opp: 0, 1 ; we fill the middle row
    assert res[-1].done and res[-1].reward == 1.0 and res[-1].info["outcome"] == "win" and res[-1].info["correct"]
    # a draw: O at 2, 3, 4, 8 ... the opponent (X) fills the lowest free cell each time
    _, res = _play(make(), ["[2]", "[4]", "[3]", "[7]", "[8]"])  # X: 0, 1, 5, 6
    assert res[-1].done and res[-1].info["outcome"] == "draw" and res[-1].reward == 0.25


def test_invalid_moves_lose_after_the_games_allowance(scripted):
    env = build_environment("textarena", None, None, {"game": GAME, "opponent": scripted})()
    _, res = _play(env, ["no move", "still none"])
    assert not res[0].done and "invalid move" in res[0].observation[0]["content"]
    assert res[1].done and res[1].info["outcome"] == "loss" and res[1].reward == 0.0


def test_we_play_second_seat_after_the_opponent_moves(scripted):
    env = build_environment("textarena", None, None, {"game": GAME, "opponent": scripted, "player": 1})()
    first = env.reset(_task(), 0)
    assert "You are Player 1" in first[-1]["content"] and "[Player 0] [0]" in first[-1]["content"]


def test_random_opponent_picks_a_listed_move_and_replays_by_seed():
    import random

    obs = "Current Board ... Available Moves: '[1]', '[5]', '[7]'"
    picks = [random_opponent(obs, 1, random.Random(3)) for _ in range(3)]
    assert picks[0] in {"[1]", "[5]", "[7]"} and len(set(picks)) == 1


class CountGame:
    """A two-player game defined here (short enough for tiny-base's 64-token context): players add [1] or
    [2] to a count from 0; who reaches 4 wins; any other move loses at once."""

    def __new__(cls):
        import textarena as ta

        class _Count(ta.Env):
            def reset(self, num_players, seed=None):
                self.state = ta.TwoPlayerState(num_players=num_players, seed=seed)
                self.state.reset(game_state={"n": 0}, player_prompt_function=lambda player_id, game_state: "1or2")

            def step(self, action):
                pid = self.state.current_player_id
                self.state.add_observation(from_id=pid, message=action, observation_type=ta.ObservationType.PLAYER_ACTION)
                k = 1 if "[1]" in action else 2 if "[2]" in action else 0
                if k == 0:
                    self.state.set_winner(player_id=1 - pid, reason="bad move")
                else:
                    self.state.game_state["n"] += k
                    self.state.add_observation(message=f"n={self.state.game_state['n']}",
                                               observation_type=ta.ObservationType.GAME_BOARD)
                    if self.state.game_state["n"] >= 4:
                        self.state.set_winner(player_id=pid, reason="reached 4")
                return self.state.step()

        return _Count()


@pytest.fixture
def count_game():
    import textarena as ta

    if "RFCount-v0" not in ta.envs.registration.ENV_REGISTRY:
        ta.register(id="RFCount-v0", entry_point=CountGame)
    return "RFCount-v0"


def test_game_defined_here_plays_by_the_rules(count_game, scripted):
    env = build_environment("textarena", None, None, {"game": count_game, "opponent": scripted.replace("lowest_free", "one")})()
    splits = textarena_splits(count_game, 4, 1, 0)
    assert env.reset(splits.train[0], 0)[-1]["content"] == "1or2"
    res = env.step({"role": "assistant", "content": "[2]"})
    assert res.observation == [{"role": "user", "content": "n=2\n[Player 1] [1]\nn=3"}] and not res.done
    res = env.step({"role": "assistant", "content": "[2]"})
    assert res.done and res.info["outcome"] == "win" and res.reward == 1.0 and res.info["reason"] == "reached 4"
    env.reset(splits.train[0], 0)
    res = env.step({"role": "assistant", "content": "pass"})
    assert res.done and res.info["outcome"] == "loss" and res.info["reason"] == "bad move"


def test_tiny_base_plays_whole_games_through_the_collector(count_game):
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    tok = load_tokenizer("tiny-base")
    engine = TorchRolloutEngine(load_model("tiny-base", "float32", "cpu"), tok, "cpu", seed=0)
    splits = textarena_splits(count_game, 6, 2, 0)
    make = build_environment("textarena", None, None, {"game": count_game})
    trajs = run_episodes(splits.train, engine, make, SamplingParams(max_new_tokens=4, n=2, temperature=1.0),
                         EpisodeLimits(max_turns=4, max_total_tokens=64, max_turn_tokens=4), seed=0)
    assert len(trajs) == 8
    finished = [t for t in trajs if not t.metadata["truncated"]]
    assert finished  # a game ends at the first move that is not [1] or [2]
    for t in trajs:
        if t in finished:
            assert t.reward == {"win": 1.0, "draw": 0.5, "loss": 0.0}[t.metadata["outcome"]]
            assert t.turn_rewards[:-1] == [0.0] * (len(t.turn_rewards) - 1)
        else:
            assert t.reward == 0.0


def test_bad_config_names_the_field(scripted):
    cases = {"env.game": {"game": "NoSuchGame-v0"}, "env.player": {"game": GAME, "player": 2},
             "env.opponent": {"game": GAME, "opponent": "smart"}, "env.win": {"game": GAME, "win": "lots"}}
    for message, params in cases.items():
        with pytest.raises(EnvironmentConfigError, match=message):
            build_environment("textarena", None, None, params)
    with pytest.raises(ValueError, match="env.games"):
        textarena_splits(GAME, 1, 1, 0)


def test_nothing_downloads(monkeypatch):
    import nltk

    def missing(path):
        raise LookupError(path)

    monkeypatch.setattr(nltk.data, "find", missing)
    with no_downloads("Hangman-v0"), pytest.raises(RuntimeError, match="NLTK data 'words'.*not installed"):
        nltk.download("words")
    assert nltk.download is not None and nltk.download.__name__ == "download"


def test_task_kind_env_takes_the_environments_own_tasks():
    from reinforge.config import config_from_dict
    from reinforge.data.sources import build_task_splits
    from reinforge.errors import ConfigError

    cfg = config_from_dict({"task": {"kind": "env", "heldout_size": 2},
                            "env": {"name": "textarena", "game": GAME, "games": 6, "max_turns": 5}})
    splits = build_task_splits(cfg.task, cfg.env)
    assert len(splits.train) == 4 and len(splits.heldout) == 2 and splits.name == f"textarena({GAME})"
    assert sorted(t.metadata["game_seed"] for t in [*splits.train, *splits.heldout]) == list(range(6))
    with pytest.raises(ConfigError, match="env 'single_turn' has no tasks of its own"):
        config_from_dict({"task": {"kind": "env"}})
    with pytest.raises(ConfigError, match="env 'textarena' needs task.kind in env"):
        config_from_dict({"task": {"kind": "arithmetic"}, "env": {"name": "textarena", "game": GAME}})
    with pytest.raises(ConfigError, match="task.kind=env: the tasks come from the run's env section"):
        build_task_splits(cfg.task)


def test_a_view_and_a_move_format_for_small_models():
    """The shipped TicTacToe view (reinforge/envs/examples/textarena_views.py) and env.move: the model writes a
    bare digit, the game gets "[4]"; the model sees the board as one short line; the opponent still reads the
    game's own text (the random opponent picks among its Available Moves)."""
    from reinforge.envs.examples.textarena_views import tictactoe

    make = build_environment("textarena", None, None, {
        "game": GAME, "move": "[{}]", "view": "reinforge.envs.examples.textarena_views:tictactoe"})
    env = make()
    assert env.reset(_task(), 0) == [{"role": "user", "content": "board 012 345 678"}]
    res = env.step({"role": "assistant", "content": " 4\n"})
    (opp,) = [c for c in "01235678" if c not in res.observation[0]["content"]]  # the cell the opponent took
    expected = "".join("o" if c == "4" else "x" if c == opp else c for c in "012345678")
    assert res.observation == [{"role": "user", "content": f"board {expected[:3]} {expected[3:6]} {expected[6:]}"}]
    res = env.step({"role": "assistant", "content": "x"})  # "[x]": not a cell; the game warns once
    assert not res.done and res.observation[0]["content"].startswith("invalid board ")
    # the view as a function: player 1 is X, so its own marks are the X's
    text = "Current Board:\n\n O | 1 | X \n---+---+---\n 3 | 4 | 5 \n---+---+---\n 6 | 7 | 8 \n"
    assert tictactoe(text, 0) == "board o1x 345 678" and tictactoe(text, 1) == "board x1o 345 678"
    for message, params in {"env.move": {"game": GAME, "move": "[]"}, "env.view": {"game": GAME, "view": "nope"}}.items():
        with pytest.raises(EnvironmentConfigError, match=message):
            build_environment("textarena", None, None, params)
