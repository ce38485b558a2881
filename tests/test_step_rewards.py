"""Process rewards (rewards/steps.py): a step verifier's scores as per-token rewards, by hand."""

from __future__ import annotations

import pytest
from part_calls import advantage

from reinforge.algo.advantage_estimators import grpo_advantage
from reinforge.config import load_config
from reinforge.rewards.steps import ArithmeticStepSettings, StepRewards, arithmetic_steps, token_of_offsets
from reinforge.types import Batch, Task, Trajectory

TASK = Task("t", "3+4*2=", "11")


def test_arithmetic_steps_scores_each_equation():
    text = "4*2=8\n3+8=12\n11"
    assert arithmetic_steps(TASK, text, ArithmeticStepSettings()) == [(5, 1.0), (12, -1.0)]
    assert arithmetic_steps(TASK, "11", ArithmeticStepSettings()) == []


def test_offsets_map_to_the_token_they_end_in():
    pieces = ["4*", "2=", "8\n", "3+8", "=12", "\n11"]
    ids = list(range(len(pieces)))

    def decode(prefix):
        return "".join(pieces[i] for i in prefix)

    assert token_of_offsets(decode, ids, [5, 12]) == [2, 4]  # "4*2=8" ends in "8\n"; "3+8=12" in "=12"


def test_step_rewards_become_the_batch_token_rewards():
    pieces = ["4*", "2=", "8\n", "3+8", "=12", "\n11"]
    prompt = [100, 101]
    traj = Trajectory(prompt + list(range(6)), [0, 0] + [1] * 6, [0.0] * 8, 0, 0, "t", reward=0.0,
                      completion_text="".join(pieces))
    steps = StepRewards("arithmetic_steps", ArithmeticStepSettings(), coef=0.5)
    metrics = steps.apply([TASK], [traj], lambda p: "".join(pieces[i] for i in p), [2])
    assert traj.token_rewards == [0, 0, 0, 0, 0.5, 0, -0.5, 0]
    assert metrics == {"reward/steps": 2.0, "reward/step_score": 0.0}  # totals: +1 and -1
    batch = Batch.from_trajectories([traj, Trajectory([1, 2], [0, 1], [0.0, 0.0], 0, 0, "t")], pad_id=0)
    assert batch.token_rewards[0].tolist() == traj.token_rewards and batch.token_rewards[1].tolist() == [0.0] * 8
    # outcome 0 for both (GRPO advantage 0): each token gets the returns-to-go of the step rewards
    adv = advantage(grpo_advantage, batch.rewards, batch.group_index, batch.loss_mask,
                    token_rewards=batch.token_rewards)
    assert adv[0].tolist() == pytest.approx([0, 0, 0, 0, 0, -0.5, -0.5, 0])


def test_the_config_names_a_registered_step_verifier():
    cfg = load_config(None, ["reward.step_verifier={name: arithmetic_steps, coef: 0.2, wrong: -2.0}"])
    assert cfg.reward.step_verifier.coef == 0.2 and cfg.reward.step_verifier.settings().wrong == -2.0
    with pytest.raises(Exception, match="step verifier"):
        load_config(None, ["reward.step_verifier={name: nope}"])


@pytest.mark.slow
def test_the_single_turn_collector_applies_the_step_verifier(tmp_path):
    from reinforge.orchestrate.components import build_components

    c = build_components(load_config(None, [
        f"output_dir={tmp_path}", "rollout.prompts_per_step=2", "rollout.group_size=2", "task.heldout_size=4",
        "eval.final_samples=0", "log.report=false", "reward.step_verifier={name: arithmetic_steps, coef: 0.5}"]))
    collected = c.make_collector().collect(c.sampler.next_batch(2), c.sampling_params(), 0)
    assert set(collected.metrics) == {"reward/steps", "reward/step_score"}
    for t in collected.trajectories:
        assert len(t.token_rewards) == len(t.token_ids)
        assert sum(t.token_rewards) == pytest.approx(0.5 * sum(s for _, s in arithmetic_steps(
            None, t.completion_text, ArithmeticStepSettings())))
