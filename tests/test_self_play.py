"""Self-play environments (docs/multi_agent.md): the guessing duel, tic-tac-toe and problem synthesis
(Absolute Zero), their rules played by hand, the proposer rewards against hand-computed values, the safe
expression parser, the environments' own tasks, and a short proposer/solver run."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.proposer_rewards import GaussianSettings, learnability, spell_gaussian
from reinforge.envs.expressions import ExpressionError, parse_expression
from reinforge.envs.guess_duel import GuessDuelEnv
from reinforge.envs.problem_synthesis import ProblemSynthesisEnv, check_task
from reinforge.envs.registry import EnvironmentConfigError, build_environment, environment_task_splits
from reinforge.envs.tictactoe import TicTacToeEnv, minimax_value, optimal_moves, winner_of
from reinforge.types import Task


def say(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def play(env, moves: list[str]) -> list:
    """Step ``env`` through ``moves``, recording (role before the move, step result)."""
    out = []
    for move in moves:
        role = env.role()
        out.append((role, env.step(say(move))))
    return out


# ---- the expression parser ---------------------------------------------------------------------------------


def test_the_parser_evaluates_with_precedence_and_parentheses():
    assert parse_expression("52+7").value == 59
    assert parse_expression("2+3*4").value == 14
    assert parse_expression("(2+3)*4").value == 20
    assert parse_expression("10-3-2").value == 5  # left to right
    assert parse_expression(" 7 * 3 ").value == 21
    parsed = parse_expression("1+(2*3)-4")
    assert parsed.numbers == (1, 2, 3, 4) and parsed.operators == "+*-" and parsed.value == 3
    assert parse_expression("12").operators == ""


@pytest.mark.parametrize("text", ["", "a+1", "-3", "2**3", "4/2", "()", "(1+2", "1+", "1 2", "__import__('os')",
                                  "12345+1", "1+" * 40 + "1"])
def test_the_parser_refuses_what_is_not_of_the_grammar(text):
    with pytest.raises(ExpressionError):
        parse_expression(text)


def test_a_task_is_valid_or_penalised_as_absolute_zero_says():
    assert check_task("52+7", "+", 99, 200) == (None, 59)
    assert check_task("52+x", "+", 99, 200) == (-1.0, None)  # format error
    assert check_task("52*7", "+", 99, 200) == (-0.5, None)  # an operator outside ops
    assert check_task("52+100", "+", 99, 200) == (-0.5, None)  # an operand over max_operand
    assert check_task("99+99+99", "+", 99, 200) == (-0.5, None)  # a value over max_value
    assert check_task("52", "+", 99, 200) == (-0.5, None)  # no operator: not a task
    assert check_task("5-9", "+-", 99, 200) == (-0.5, None)  # a negative value


# ---- proposer rewards ---------------------------------------------------------------------------------------


def test_learnability_is_zero_at_the_ends_and_one_minus_the_rate_between():
    p = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])
    assert learnability(p).tolist() == pytest.approx([0.0, 0.75, 0.5, 0.25, 0.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        learnability(torch.tensor([1.5]))


def test_spell_gaussian_peaks_at_half():
    p = torch.tensor([0.5, 0.3, 0.0])
    got = spell_gaussian(p, GaussianSettings(sigma=0.2)).tolist()
    assert got == pytest.approx([1.0, math.exp(-0.5), math.exp(-0.25 / 0.08)])
    assert spell_gaussian(torch.tensor([0.75]), GaussianSettings(mu=0.75, sigma=0.1)).item() == pytest.approx(1.0)


# ---- problem synthesis ---------------------------------------------------------------------------------------


PROPOSE = Task(id="p", prompt="52+", answer="", metadata={"prefix": "52+"})


def test_a_proposal_is_solved_n_times_and_rewarded_by_learnability():
    env = ProblemSynthesisEnv(solves=4)
    assert env.reset(PROPOSE, 0) == [{"role": "user", "content": "52+"}]
    steps = play(env, ["7", "59", "58", "59", "no"])
    assert [role for role, _ in steps] == ["proposer", "solver", "solver", "solver", "solver"]
    assert steps[0][1].observation == [{"role": "user", "content": "52+7="}]
    assert [s.info["role_rewards"] for _, s in steps] == [
        {"proposer": 0.0}, {"solver": 1.0}, {"solver": 0.0}, {"solver": 1.0},
        {"solver": -1.0, "proposer": 0.5}]  # p = 2/4: learnability 1 - 0.5; no integer: -1
    assert [s.reward for _, s in steps] == [0.0, 0.25, 0.0, 0.25, 0.0]  # the team stream sums to p
    assert steps[-1][1].done and steps[-1][1].info["correct"] and steps[-1][1].info["solve_rate"] == 0.5


def test_a_task_always_solved_teaches_the_proposer_nothing_and_bad_ones_are_penalised():
    env = ProblemSynthesisEnv(solves=2)
    env.reset(PROPOSE, 0)
    last = play(env, ["1", "53", "53"])[-1][1]
    assert last.info["role_rewards"] == {"solver": 1.0, "proposer": 0.0} and not last.info["correct"]
    for text, penalty in [("x", -1.0), ("100", -0.5), ("7*2", -0.5)]:
        env.reset(PROPOSE, 0)
        result = env.step(say(text))
        assert result.done and result.info["role_rewards"] == {"proposer": penalty} and not result.info["correct"]


def test_spell_gaussian_is_chosen_by_name_with_its_options():
    env = ProblemSynthesisEnv(solves=2, proposer_reward={"name": "spell_gaussian", "sigma": 0.5})
    env.reset(PROPOSE, 0)
    last = play(env, ["1", "53", "0"])[-1][1]
    assert last.info["role_rewards"]["proposer"] == pytest.approx(1.0)  # p = 0.5
    with pytest.raises(EnvironmentConfigError, match="proposer_reward: unknown 'nope'; allowed: learnability, spell_gaussian"):
        build_environment("problem_synthesis", None, None, {"proposer_reward": "nope"})
    with pytest.raises(Exception, match="sigma"):
        build_environment("problem_synthesis", None, None, {"proposer_reward": {"name": "spell_gaussian", "sigma": -1}})


def test_a_heldout_task_is_one_solver_turn():
    env = ProblemSynthesisEnv()
    task = Task(id="h", prompt="31+45=", answer="", metadata={"expression": "31+45"})
    assert env.reset(task, 0) == [{"role": "user", "content": "31+45="}] and env.role() == "solver"
    result = env.step(say("76"))
    assert result.done and result.reward == 1.0 and result.info == {"role_rewards": {"solver": 1.0}, "correct": True}


def test_problem_synthesis_tasks_are_seeded_prefixes_and_fixed_heldout_sums():
    a = environment_task_splits("problem_synthesis", {}, 64, 1234)
    b = environment_task_splits("problem_synthesis", {}, 64, 1234)
    assert [t.metadata for t in a.heldout] == [t.metadata for t in b.heldout]
    exprs = [t.metadata["expression"] for t in a.heldout]
    assert len(set(exprs)) == 64
    for e in exprs:
        x, y = (int(v) for v in e.split("+"))
        assert 10 <= x <= 99 and 10 <= y <= 99
    prefixes = [t.metadata["prefix"] for t in a.train]
    assert len(prefixes) == 256 and all(p.endswith("+") and 10 <= int(p[:-1]) <= 99 for p in prefixes)


# ---- tic-tac-toe -----------------------------------------------------------------------------------------------


GAME = Task(id="g", prompt="ttt", answer="")


def test_x_wins_a_row_in_self_play():
    env = TicTacToeEnv()
    assert env.reset(GAME, 0) == [{"role": "user", "content": "ttt 123456789: X"}]
    steps = play(env, ["1", "4", "2", "5", "3"])
    assert [r for r, _ in steps] == ["X", "O", "X", "O", "X"]
    assert steps[1][1].observation == [{"role": "user", "content": "x23o56789: X"}]
    last = steps[-1][1]
    assert last.done and last.info["winner"] == "X" and last.info["role_rewards"] == {"X": 1.0, "O": -1.0}
    assert last.reward == 0.0 and last.info["correct"] and last.info["board"] == "xxxoo...."


def test_an_illegal_move_forfeits_and_a_full_board_is_a_draw():
    env = TicTacToeEnv()
    env.reset(GAME, 0)
    last = play(env, ["5", "5"])[-1][1]  # O plays a taken cell
    assert last.info["winner"] == "X" and last.info["forfeit"] and not last.info["correct"]
    env.reset(GAME, 0)
    assert env.step(say("cell 0")).info["role_rewards"] == {"X": -1.0, "O": 1.0}
    env.reset(GAME, 0)
    last = play(env, ["1", "2", "3", "5", "4", "6", "8", "7", "9"])[-1][1]  # x o x / x o o / o x x
    assert last.done and "winner" not in last.info and last.info["role_rewards"] == {"X": 0.0, "O": 0.0}


def test_minimax_knows_the_game():
    assert minimax_value("." * 9, "x") == 0  # a draw with best play
    assert optimal_moves("xx.oo....", "x") == [2]  # complete the row
    assert optimal_moves("oo.x...x.", "x") == [2]  # block
    assert winner_of("o..o..o..") == "o" and winner_of("x........") is None


def test_the_optimal_opponent_never_loses_and_the_random_one_is_seeded():
    for seed in range(6):
        env = TicTacToeEnv(opponent="optimal", policy_role="O")
        env.reset(GAME, seed)
        result = None
        for cell in "123456789":  # the policy plays the first free cell
            if env.board[int(cell) - 1] == ".":
                result = env.step(say(cell))
                if result.done:
                    break
        assert result is not None and result.done and result.info.get("winner") != "O"
    boards = []
    for _ in range(2):
        env = TicTacToeEnv(opponent="random", policy_role="O")
        boards.append(env.reset(GAME, 11)[0]["content"])
    assert boards[0] == boards[1] and boards[0].count("x") == 1


def test_against_a_script_the_policy_sees_its_move_and_the_reward_is_its_result():
    env = TicTacToeEnv(opponent="optimal", policy_role="X")
    env.reset(GAME, 0)
    result = env.step(say("5"))
    board = result.observation[0]["content"]
    assert board[4] == "x" and board.count("o") == 1 and board.endswith(": X") and env.role() == "X"
    assert sorted(c for c in board[:9] if c.isdigit()) == [str(i + 1) for i in range(9) if env.board[i] == "."]


# ---- the guessing duel ------------------------------------------------------------------------------------------


DUEL = Task(id="d", prompt="duel 1-4", answer="", metadata={"low": 1, "high": 4})


def test_a_find_at_the_second_guess_scores_by_guesses_left():
    env = GuessDuelEnv(max_guesses=5)
    assert env.reset(DUEL, 0) == [{"role": "user", "content": "duel 1-4: guesser"}]
    steps = play(env, ["2", "higher", "3", "yes"])
    assert [r for r, _ in steps] == ["guesser", "proposer", "guesser", "proposer"]
    assert steps[0][1].observation == [{"role": "user", "content": "2? proposer"}]
    assert steps[1][1].observation == [{"role": "user", "content": "higher: guesser"}]
    last = steps[-1][1]
    assert last.info["role_rewards"] == {"guesser": pytest.approx(0.8), "proposer": pytest.approx(-0.8)}
    assert last.info["winner"] == "guesser" and last.reward == 0.0 and last.info["correct"]


def test_the_proposer_may_answer_by_pointing_with_a_number():
    env = GuessDuelEnv(max_guesses=5, reward="zero_sum")
    env.reset(DUEL, 0)
    steps = play(env, ["2", "4", "3", "1"])  # 4 > 2: higher; then 1 < 3: lower, but nothing in 3-4 is below 3
    assert steps[1][1].observation == [{"role": "user", "content": "higher: guesser"}]
    assert steps[-1][1].info["forfeit"] and steps[-1][1].info["winner"] == "guesser"
    env.reset(DUEL, 0)
    last = play(env, ["3", "the secret is 3"])[-1][1]
    assert last.info["winner"] == "guesser" and last.info["role_rewards"] == {"guesser": 1.0, "proposer": -1.0}


def test_an_answer_no_secret_agrees_with_forfeits():
    env = GuessDuelEnv()
    env.reset(DUEL, 0)
    last = play(env, ["2", "h", "3", "l"])[-1][1]  # after "higher" than 2, nothing below 3 is left
    assert last.info["role_rewards"] == {"proposer": -1.0, "guesser": 1.0} and last.info["forfeit"]
    env.reset(DUEL, 0)
    assert env.step(say("9")).done is False
    assert env.step(say("y")).info["winner"] == "guesser"  # "yes" to 9, outside 1-4: a forfeit
    env.reset(DUEL, 0)
    assert env.step(say("maybe")).info["role_rewards"] == {"guesser": -1.0, "proposer": 1.0}


def test_guesses_running_out_is_the_proposers_win():
    for reward, expected in [("shaped", {"guesser": 0.0, "proposer": 0.0}), ("zero_sum", {"guesser": -1.0, "proposer": 1.0})]:
        env = GuessDuelEnv(max_guesses=2, reward=reward)
        env.reset(DUEL, 0)
        last = play(env, ["2", "l", "1", "h"])  # "higher" than 1 after "lower" than 2: no secret left
        assert last[-1][1].info["forfeit"]
        env.reset(DUEL, 0)
        last = play(env, ["1", "h", "2", "h"])[-1][1]
        assert last.done and last.info["winner"] == "proposer" and last.info["role_rewards"] == expected


def test_the_environments_are_registered_with_their_own_tasks():
    for name in ("guess_duel", "tictactoe", "problem_synthesis"):
        splits = environment_task_splits(name, {}, 16, 7)
        assert len(splits.heldout) == 16 and build_environment(name, None, None, {})() is not None
    with pytest.raises(EnvironmentConfigError, match="reward must be one of zero_sum, shaped"):
        build_environment("guess_duel", None, None, {"reward": "nope"})
    with pytest.raises(EnvironmentConfigError, match="policy_role must be one of X, O"):
        build_environment("tictactoe", None, None, {"policy_role": "Z"})


def test_the_recipes_load():
    from reinforge.config import load_config

    for recipe, env in [("absolute_zero_arithmetic", "problem_synthesis"), ("self_play_tictactoe", "tictactoe"),
                        ("self_play_guess_duel", "guess_duel")]:
        assert load_config(recipe, []).env.name == env


# ---- a short proposer/solver run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_short_problem_synthesis_run_logs_both_roles(tmp_path):
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    cfg = load_config("absolute_zero_arithmetic", [f"output_dir={tmp_path}", "train.steps=2", "rollout.prompts_per_step=2",
                                                   "rollout.group_size=4", "log.report=false", "task.heldout_size=8",
                                                   "eval.final_samples=0"])
    records = [r for r in train(cfg).metrics() if "reward/role/proposer" in r]
    assert len(records) == 2
    for r in records:
        assert -1.0 <= r["reward/role/proposer"] <= 1.0 and r["episode/role/proposer/count"] == 8
