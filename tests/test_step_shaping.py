"""Step-reward shaping (rewards/step_shaping.py): Clip and Delta of Gao et al. 2024 against hand-computed values,
the bound they put on a completion's return, and their place in the process-reward pipeline."""

from __future__ import annotations

import pytest

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.rewards.step_shaping import STEP_SHAPERS, ClipSettings, shape_steps
from reinforge.rewards.steps import ArithmeticStepSettings, StepRewards
from reinforge.types import Task, Trajectory

SCORES = [0.9, 0.2, 0.6, 0.8]  # the four steps of the paper's figure: high, low, middle, high


def test_clip_values() -> None:
    # eta 0.7: 0.9 -> 0, 0.2 -> -0.5, 0.6 -> -0.1, 0.8 -> 0
    assert shape_steps("clip", ClipSettings(eta=0.7), SCORES) == pytest.approx([0.0, -0.5, -0.1, 0.0])
    assert shape_steps("clip", ClipSettings(), [1.0, -1.0]) == [0.0, -2.0]  # arithmetic_steps' scores, eta 1


def test_delta_values_and_telescoping_sum() -> None:
    out = shape_steps("delta", None, SCORES)
    assert out == pytest.approx([0.9 - 0.2, 0.2 - 0.6, 0.6 - 0.8, 0.8])
    assert sum(out) == pytest.approx(SCORES[0])
    assert shape_steps("delta", None, [0.5]) == [0.5] and shape_steps("delta", None, []) == []


def test_clip_delta_values() -> None:
    # clip (eta 0.7): [0, -0.5, -0.1, 0]; delta: [0.5, -0.4, -0.1, 0]
    assert shape_steps("clip_delta", ClipSettings(eta=0.7), SCORES) == pytest.approx([0.5, -0.4, -0.1, 0.0])


@pytest.mark.parametrize("name", ["clip", "delta", "clip_delta"])
def test_repeating_a_correct_step_earns_nothing_more(name: str) -> None:
    """The hack the paper describes: the same correct step written n times. Summed raw scores grow with n; the
    shaped return is bounded (clip: 0; delta and clip_delta: the first step's value)."""
    settings = STEP_SHAPERS.entry(name).make_settings({}, "test")
    returns = [sum(shape_steps(name, settings, [1.0] * n)) for n in (1, 2, 5, 20)]
    assert returns == pytest.approx([returns[0]] * 4)


def test_step_rewards_apply_the_shaper() -> None:
    pieces = ["4*", "2=", "8\n", "3+8", "=12", "\n11"]
    traj = Trajectory([100, 101] + list(range(6)), [0, 0] + [1] * 6, [0.0] * 8, 0, 0, "t", reward=0.0,
                      completion_text="".join(pieces))
    steps = StepRewards("arithmetic_steps", ArithmeticStepSettings(), coef=0.5, shaper="delta")
    metrics = steps.apply([Task("t", "3+4*2=", "11")], [traj], lambda p: "".join(pieces[i] for i in p), [2])
    # raw scores +1 (ends in token 2), -1 (token 4); delta: [1 - (-1), -1] = [2, -1]; times coef 0.5
    assert traj.token_rewards == [0, 0, 0, 0, 1.0, 0, -0.5, 0]
    assert metrics == {"reward/steps": 2.0, "reward/step_score": 1.0}


def test_config_names_a_shaper_and_needs_a_step_verifier() -> None:
    cfg = load_config(None, ["reward.step_verifier=arithmetic_steps", "reward.step_shaping={name: clip, eta: 0.5}"])
    assert cfg.reward.step_shaping.name == "clip" and cfg.reward.step_shaping.settings().eta == 0.5
    with pytest.raises(ConfigError, match="step verifier"):
        load_config(None, ["reward.step_shaping=delta"])
    with pytest.raises(ConfigError, match="step_shaping"):
        load_config(None, ["reward.step_verifier=arithmetic_steps", "reward.step_shaping=nope"])


def test_the_reward_pool_carries_the_shaper() -> None:
    from reinforge.rewards.build import build_reward_pool

    cfg = load_config(None, ["reward.step_verifier=arithmetic_steps", "reward.step_shaping={name: clip, eta: 0.5}"])
    pool = build_reward_pool(cfg.reward, lambda task, text: None, "thread")
    try:
        assert (pool.steps.shaper, pool.steps.shaper_settings.eta) == ("clip", 0.5)
    finally:
        pool.close()
