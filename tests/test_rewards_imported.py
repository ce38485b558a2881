"""Your own reward function named in a recipe (module:function or file.py:function): checked when the
config loads, called in threads, worker processes and training runs, with clear errors."""

from __future__ import annotations

import pickle
import sys

import pytest

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.run import train
from reinforge.rewards.build import build_reward
from reinforge.rewards.imported import ImportedVerifier, resolve_verifier
from reinforge.rewards.pool import VerifierPool
from reinforge.rewards.verifiers import RewardResult, numeric_match
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Task

USER_REWARDS = '''
from reinforge.rewards.verifiers import RewardResult


def contains_answer(task, completion):
    return float(task.answer in completion)


def is_short(task, completion):
    return len(completion.strip()) <= 2


def graded(task, completion):
    return RewardResult(0.5, False, completion.strip())


def nan(task, completion):
    return float("nan")


def text(task, completion):
    return "yes"


class Scorers:
    @staticmethod
    def exact(task, completion):
        return completion == task.answer


NOT_A_FUNCTION = 3
'''

TASK = Task(id="t", prompt="2+2=", answer="4")


@pytest.fixture()
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def test_a_file_reference_scores_and_numbers_become_results(rewards_file):
    cfg = load_config(None, [f"task.verifier={rewards_file}:contains_answer"])
    verifier = build_reward(cfg.reward, cfg.task.verifier)
    assert verifier == ImportedVerifier(f"{rewards_file}:contains_answer")
    assert verifier(TASK, "it is 4") == RewardResult(1.0, True) and verifier(TASK, "5") == RewardResult(0.0, False)
    assert resolve_verifier(f"{rewards_file}:is_short")(TASK, "four") == RewardResult(0.0, False)  # a bool
    assert resolve_verifier(f"{rewards_file}:graded")(TASK, " x ") == RewardResult(0.5, False, "x")
    assert resolve_verifier(f"{rewards_file}:Scorers.exact")(TASK, "4").correct
    with pytest.raises(TypeError, match=r"returned nan: expected a RewardResult or a finite number"):
        resolve_verifier(f"{rewards_file}:nan")(TASK, "4")
    with pytest.raises(TypeError, match=r"returned 'yes'"):
        resolve_verifier(f"{rewards_file}:text")(TASK, "4")


def test_a_relative_file_is_made_absolute_and_a_module_is_found_from_the_working_directory(
        rewards_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(None, ["task.verifier=my_rewards.py:contains_answer"]).task.verifier == \
        f"{rewards_file}:contains_answer"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    cfg = load_config(None, ["task.verifier=my_rewards:contains_answer"])  # as `python -m` would import it
    assert cfg.task.verifier == "my_rewards:contains_answer"
    assert build_reward(cfg.reward, cfg.task.verifier)(TASK, "4").reward == 1.0


def test_a_reward_term_may_be_your_own_function(rewards_file):
    cfg = load_config(None, [f"reward.terms=[{{name: mine, verifier: '{rewards_file}:contains_answer'}}, "
                             "{name: short, verifier: numeric_match, weight: 0.5}]"])
    result = build_reward(cfg.reward, cfg.task.verifier)(TASK, "4")
    assert result.reward == 1.5 and result.terms == {"mine": 1.0, "short": 1.0}


@pytest.mark.parametrize(("reference", "message"), [
    ("missing.py:f", r"no such file '.*missing\.py'"),
    ("{file}:nothing", r"has no attribute 'nothing'"),
    ("{file}:NOT_A_FUNCTION", r"'NOT_A_FUNCTION' is not callable \(a int\)"),
    ("no_such_module_xyz:f", r"verifier module 'no_such_module_xyz' is not importable"),
    ("{broken}:f", r"importing '.*broken\.py' failed: ZeroDivisionError: division by zero"),
    ("{raises_value_error}:f", r"importing '.*raises_value_error\.py' failed: ValueError: bad setting"),
    (":f", r"expected module:function or path/to/file\.py:function"),
    ("nope", r"unknown verifier 'nope'; allowed: .*or your own function as module:function"),
])
def test_bad_references_are_config_errors_naming_the_field(reference, message, rewards_file, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1 / 0\n")
    raises_value_error = tmp_path / "raises_value_error.py"
    raises_value_error.write_text("raise ValueError('bad setting')\n")
    reference = reference.format(file=rewards_file, broken=broken, raises_value_error=raises_value_error)
    with pytest.raises(ConfigError, match=r"task\.verifier: .*" + message):
        load_config(None, [f"task.verifier={reference}"])


def test_it_pickles_as_its_reference_and_process_workers_import_it(rewards_file):
    verifier = resolve_verifier(f"{rewards_file}:contains_answer")
    assert pickle.loads(pickle.dumps(verifier)) == verifier
    tasks = [Task(id=str(i), prompt=f"{i}+0=", answer=str(i)) for i in range(6)]
    completions = [str(i) if i % 2 else "no" for i in range(6)]
    with VerifierPool(verifier, workers=2, timeout_s=60, kind="process") as pool:
        scores = pool.score(tasks, completions)
    assert [s.reward for s in scores] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert [s.reward for s in scores] == [numeric_match(t, c).reward for t, c in zip(tasks, completions, strict=True)]


@pytest.mark.slow
def test_a_training_run_scores_with_your_function(rewards_file, tmp_path):
    result = train(load_config(None, [
        f"output_dir={tmp_path}", "name=mine", f"task.verifier={rewards_file}:is_short", "train.steps=2",
        "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "train.time_limit_s=0", "task.heldout_size=8", "log.report=false",
        "log.samples_per_step=16"]))
    samples = read_jsonl(result.run_dir / "samples.jsonl")
    assert len(samples) == 2 * 16
    for s in samples:  # the reward is the user's (1 for at most 2 characters), not the default verifier's
        assert s["reward"] == float(len(s["completion"].strip()) <= 2)
