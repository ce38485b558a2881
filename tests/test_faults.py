"""Numerical faults stop the run at the step where they happen, say what was non-finite, and name
the last good checkpoint (injected NaN rewards and NaN weights on the shipped model)."""

import dataclasses
import math

import pytest
import torch

from reinforge.config import load_config
from reinforge.errors import TrainingDiverged
from reinforge.learn.faults import check_rewards, nonfinite_inputs
from reinforge.learn.learner import Learner
from reinforge.orchestrate.batch_sources import LocalBatches
from reinforge.orchestrate.run import train
from reinforge.types import Batch, Trajectory


def _cfg(tmp_path, *overrides):
    return load_config(None, [
        f"output_dir={tmp_path}", "name=f", "rollout.prompts_per_step=4", "rollout.group_size=4", "train.steps=4",
        "task.heldout_size=8", "train.time_limit_s=0", "eval.every=0", "eval.final_samples=0", "log.report=false",
        "checkpoint.every=2", "algo.skip_equal_reward_groups=false", *overrides,
    ])


def test_nan_reward_stops_the_run_naming_tasks_and_the_last_checkpoint(tmp_path, monkeypatch):
    collect = LocalBatches.collect

    def poisoned(self, step):
        rollout = collect(self, step)
        if step == 3:
            rollout.kept[1].reward = float("nan")
        return rollout

    monkeypatch.setattr(LocalBatches, "collect", poisoned)
    with pytest.raises(TrainingDiverged) as err:
        train(_cfg(tmp_path))
    msg = str(err.value)
    assert msg.startswith("run stopped at step 3: 1 of 16 trajectories have a non-finite reward: ")
    assert "(nan)" in msg and "the other 15 rewards: min" in msg
    assert f"last good checkpoint is {tmp_path / 'f' / 'checkpoints' / 'step_2'}" in msg
    assert f"reinforge train --resume {tmp_path / 'f'}" in msg


def test_nan_weights_stop_the_update_with_finite_inputs_named(tmp_path, monkeypatch):
    prepare = Learner.prepare

    def poison_then_prepare(self, batch):
        if self.step == 2:  # after two good updates and the step-2 checkpoint: NaN logits from now on
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[:64] = float("nan")
        return prepare(self, batch)

    monkeypatch.setattr(Learner, "prepare", poison_then_prepare)
    with pytest.raises(TrainingDiverged) as err:
        train(_cfg(tmp_path))
    msg = str(err.value)
    assert msg.startswith("run stopped at step 3: step 3: the loss is nan (non-finite)")
    assert "every input of the batch is finite, so the policy's forward" in msg
    assert "last good checkpoint is" in msg and msg.rstrip(".").endswith("lower train.lr)")


def test_a_fault_before_any_checkpoint_says_so(tmp_path, monkeypatch):
    collect = LocalBatches.collect

    def poisoned(self, step):
        rollout = collect(self, step)
        rollout.kept[0].reward = float("inf")
        return rollout

    monkeypatch.setattr(LocalBatches, "collect", poisoned)
    with pytest.raises(TrainingDiverged, match=r"run stopped at step 1: .*\(inf\).*No checkpoint was written"):
        train(_cfg(tmp_path))


def _traj(task_id, reward):
    return Trajectory(token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], version=0, group_id=0,
                      task_id=task_id, reward=reward)


def test_check_rewards_names_at_most_five_tasks():
    check_rewards([_traj("a", 1.0), _traj("b", 0.0)])  # finite: nothing raised
    trajs = [_traj(f"t{i}", math.nan) for i in range(7)] + [_traj("ok", 2.0)]
    with pytest.raises(TrainingDiverged, match=r"7 of 8 .*t0 \(nan\), .*t4 \(nan\) \.\.\.; the other 1 rewards: min 2"):
        check_rewards(trajs)
    with pytest.raises(TrainingDiverged, match="no finite reward at all"):
        check_rewards([_traj("x", math.inf)])


def test_nonfinite_inputs_names_the_tensors_on_trained_positions():
    batch = Batch.from_trajectories([_traj("a", 1.0), _traj("b", 0.0)], pad_id=0)
    assert nonfinite_inputs(batch).startswith("every input of the batch is finite")
    adv = torch.zeros(2, 2)
    adv[0, 0] = math.nan  # a prompt position: not trained, not counted
    adv[1, 1] = math.inf
    batch = dataclasses.replace(batch, advantages=adv, rewards=torch.tensor([math.nan, 0.0]))
    assert nonfinite_inputs(batch) == "non-finite inputs: rewards (1 non-finite), advantages (1 non-finite)."
