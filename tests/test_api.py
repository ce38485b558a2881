"""The one-call Python API (reinforge.train) mirrors `reinforge train`: keyword arguments become the
command line's overrides, a reward function of yours is named by its module, the run comes back."""

from __future__ import annotations

import pytest
import yaml

import reinforge
from reinforge.api import _overrides, _verifier_alias
from reinforge.rewards.verifiers import RewardResult

CALLS: list[str] = []


def half_credit(task, completion: str) -> RewardResult:
    """A user's reward function: 1 for the right answer, 0.5 for a wrong number, 0 otherwise."""
    CALLS.append(completion)
    if completion.strip() == task.answer:
        return RewardResult(1.0, True)
    return RewardResult(0.5 if completion.strip().isdigit() else 0.0, False)


def test_arguments_become_the_command_lines_overrides():
    assert _overrides(model="tiny-base", task="arithmetic", verifier="exact_match", preset="dapo", plugins=["p.py"],
                      train={"steps": 5, "lr": 1e-4}, **{"algo.policy_loss.clip_high": 0.28}) == [
        "preset=dapo", 'plugins=["p.py"]', 'model.path="tiny-base"', 'task.kind="arithmetic"',
        'task.verifier="exact_match"', "train.steps=5", "train.lr=0.0001", "algo.policy_loss.clip_high=0.28"]
    assert _overrides(model=None, task={"kind": "arithmetic", "digits": 1}, verifier=half_credit, preset=None,
                      plugins=None) == [f'task.verifier="{__name__}:half_credit"', 'task.kind="arithmetic"',
                                        "task.digits=1"]
    with pytest.raises(ValueError, match="top level"):
        _overrides(model=None, task=None, verifier=lambda t, c: 1.0, preset=None, plugins=None)


def test_reward_with_a_name_or_function_is_the_deprecated_spelling_of_verifier():
    with pytest.warns(DeprecationWarning, match="use verifier=") as caught:
        assert _verifier_alias(None, {"reward": half_credit, "train": {"steps": 1}}) == (half_credit,
                                                                                          {"train": {"steps": 1}})
    assert caught[0].filename == __file__  # the warning names the caller's line
    with pytest.raises(TypeError, match="verifier= alone"):
        _verifier_alias("exact_match", {"reward": "numeric_match"})
    section = {"reward": {"pool": "thread"}}  # a mapping is the reward section, as train={...} is the train section
    assert _verifier_alias(None, section) == (None, section)
    assert _verifier_alias("exact_match", {"reward": None}) == ("exact_match", {})
    assert _overrides(model=None, task=None, verifier=None, preset=None, plugins=None, **section) == [
        'reward.pool="thread"']


@pytest.mark.slow
def test_train_in_one_call_with_your_own_reward(tmp_path):
    CALLS.clear()
    run = reinforge.train(
        preset="grpo", model="tiny-base", task="arithmetic", verifier=half_credit, output_dir=str(tmp_path),
        train={"steps": 2, "time_limit_s": 0}, rollout={"prompts_per_step": 4, "group_size": 4},
        eval={"final_samples": 0}, log={"report": False}, **{"algo.policy_loss.clip_high": 0.28, "task.heldout_size": 8},
    )
    assert run.steps == 2 and run.heldout_before is not None
    saved = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert saved["algo"]["policy_loss"]["clip_high"] == 0.28 and saved["task"]["verifier"] == f"{__name__}:half_credit"
    steps = [m for m in run.metrics() if "reward/mean" in m]
    assert len(steps) == 2 and len(CALLS) >= 2 * 16  # every training completion went through it
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in steps)
