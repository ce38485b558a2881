"""Length and budget control (algo/length_shapers.py, rollout/budget_groups.py) against hand-computed values,
their edge cases, the recipe keys that name them and one short run through all of them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reinforge.algo.length_shapers import hbpo_reward, subgroup_budgets
from reinforge.algo.shaping import REWARD_SHAPERS, ShapeInputs
from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.episodes import shape_rewards
from reinforge.rewards.verifiers import numeric_match
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Task, Trajectory

CONCISER, HBPO, KIMI = "conciser_length", "hbpo_budget", "kimi_length"


def _inputs(lengths, correct, groups, max_new_tokens=40, rewards=None, with_correct=True) -> ShapeInputs:
    n = len(lengths)
    r = torch.tensor(rewards if rewards is not None else [float(c) for c in correct], dtype=torch.float64)
    return ShapeInputs(rewards=r, lengths=torch.tensor(lengths), truncated=torch.zeros(n, dtype=torch.bool),
                       group_index=torch.tensor(groups), max_new_tokens=max_new_tokens,
                       correct=torch.tensor(correct, dtype=torch.bool) if with_correct else None)


def _shape(name, inputs, **options):
    settings = REWARD_SHAPERS.entry(name).make_settings(options, "test")
    return REWARD_SHAPERS.call(name, inputs, settings)


# ----------------------------------------------------------------------------------------- Kimi k1.5


def test_kimi_length_hand_values():
    """Group 0, lengths 10/20/30: lambda = 0.5 - (L - 10) / 20 = 0.5, 0, -0.5; the 30-token one is wrong:
    min(0, -0.5) = -0.5. Group 1, lengths 40/10 both wrong: lambda = -0.5, 0.5 -> min(0, .) = -0.5, 0
    (a short wrong answer is not rewarded). Group 2, one sample: 0. Group 3, lengths 7/7: 0 (0/0)."""
    out = _shape(KIMI, _inputs([10, 20, 30, 40, 10, 5, 7, 7], [True, True, False, False, False, True, True, False],
                               [0, 0, 0, 1, 1, 2, 3, 3]))
    assert out.trainable is None
    np.testing.assert_allclose(out.reward.numpy(), [0.5, 0.0, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0])


def test_kimi_length_weight_and_a_correct_long_answer():
    """lengths 4/12 correct: lambda 0.5, -0.5 (a correct long answer is penalised too); weight 0.2 -> 0.1, -0.1."""
    out = _shape(KIMI, _inputs([4, 12], [True, True], [5, 5]), weight=0.2)
    np.testing.assert_allclose(out.reward.numpy(), [0.1, -0.1])


# ----------------------------------------------------------------------------------------- ConciseR


def test_conciser_length_hand_values():
    """L_max = 40. Group 0 all correct, lengths 10/30: (40 - 10) / 40 = 0.75, (40 - 30) / 40 = 0.25.
    Group 1 has a wrong rollout: 0. Group 2, one correct rollout (all correct): (40 - 20) / 40 = 0.5.
    Group 3 no correct answer: 0."""
    out = _shape(CONCISER, _inputs([10, 30, 10, 30, 20, 5, 6], [True, True, True, False, True, False, False],
                                   [0, 0, 1, 1, 2, 3, 3]))
    np.testing.assert_allclose(out.reward.numpy(), [0.75, 0.25, 0.0, 0.0, 0.5, 0.0, 0.0])


def test_conciser_length_alpha_budget_and_equal_lengths():
    """alpha 2, L_max 100 (not max_new_tokens): lengths 20/20 -> 2 * 0.8 = 1.6 each (no spread to learn from)."""
    out = _shape(CONCISER, _inputs([20, 20], [True, True], [0, 0]), alpha=2.0, max_length=100)
    np.testing.assert_allclose(out.reward.numpy(), [1.6, 1.6])


def test_grpo_advantages_do_not_depend_on_conciser_alpha():
    """In an all-correct group the bonus is affine in the length, so std-scaled group advantages are the same
    for every alpha (the paper's unreadable constant cannot change GRPO's update)."""
    from reinforge.algo.advantage_estimators import group_mean_std

    inputs = _inputs([10, 25, 30, 12], [True] * 4, [0] * 4)
    advs = []
    for alpha in (0.01, 1.0, 7.0):
        r = inputs.rewards + _shape(CONCISER, inputs, alpha=alpha).reward
        mean, std, _ = group_mean_std(r, inputs.group_index)
        advs.append(((r - mean) / std).numpy())
    np.testing.assert_allclose(advs[0], advs[1], atol=1e-9)
    np.testing.assert_allclose(advs[1], advs[2], atol=1e-9)


# -------------------------------------------------------------------------------------------- HBPO


def test_hbpo_reward_piecewise_hand_values():
    """L_max 4096, beta 4, alpha 1/4096 (the authors' settings). Within the budget (n <= b): f_2(b) =
    4 cos(pi b / 8192): b = 512 -> 4 cos(pi/16) = 3.923141. Past it: f_1 = 4 cos(pi n / 8192) - |n - b| / 4096:
    n = 1024, b = 512 -> 4 cos(pi/8) - 0.125 = 3.695518 - 0.125 = 3.570518. n = 4096, b = 2560 -> 0 - 0.375.
    Over L_max or wrong: 0."""
    n = torch.tensor([256, 512, 1024, 4096, 5000, 256])
    b = torch.tensor([512, 512, 512, 2560, 2560, 512])
    ok = torch.tensor([True, True, True, True, True, False])
    out = hbpo_reward(n, b, ok, 4096.0, 4.0, 1 / 4096)
    np.testing.assert_allclose(out.numpy(), [3.923141, 3.923141, 3.570518, -0.375, 0.0, 0.0], atol=1e-6)
    assert 4 * math.cos(math.pi / 16) == pytest.approx(3.923141, abs=1e-6)


def test_hbpo_smaller_budgets_pay_more_for_a_short_answer_and_less_for_a_long_one():
    """n = 300: every budget >= n gives f_2(b), decreasing in b; n = 3000: the deviation penalty favours large b."""
    b = torch.tensor([512, 1024, 2048, 2560])
    ok = torch.ones(4, dtype=torch.bool)
    short = hbpo_reward(torch.full((4,), 300), b, ok, 4096.0, 4.0, 1 / 4096)
    long = hbpo_reward(torch.full((4,), 3000), b, ok, 4096.0, 4.0, 1 / 4096)
    assert torch.all(short[:-1] > short[1:]) and torch.all(long[:-1] < long[1:])


def test_hbpo_subgroups_split_each_group_in_order():
    """G = 8, K = 4: rows 0-1 -> 512, 2-3 -> 1024, 4-5 -> 2048, 6-7 -> 2560 (of L_max 4096). G = 2: rows 0, 1 ->
    k = 0, 2. G = 1 and a demonstration (group -1, a group of its own): k = 0. Groups interleaved in the batch
    keep their own order."""
    budgets = [0.125, 0.25, 0.5, 0.625]
    b = subgroup_budgets(torch.tensor([3] * 8), budgets, 4096)
    assert b.tolist() == [512, 512, 1024, 1024, 2048, 2048, 2560, 2560]
    b = subgroup_budgets(torch.tensor([0, 1, 0, 2, 1, -1]), budgets, 4096)
    assert b.tolist() == [512, 512, 2048, 512, 2048, 512]


def test_hbpo_budget_shaper_replaces_the_reward():
    """L_max 40, budgets 0.25 / 0.5 -> b = 10, 20; deviation 1 -> alpha = 1/40. Group of 2: row 0 (b 10),
    n 8 <= 10: 4 cos(pi 10 / 80) = 3.695518; row 1 (b 20) wrong: 0. Group of 2: row 0 (b 10), n 12 > 10:
    4 cos(pi 12 / 80) - 2/40 = 3.564026 - 0.05 = 3.514026; row 1 (b 20), n 20: 4 cos(pi/4) = 2.828427.
    The shaped reward r + term is R (the verifier's 1/0 is replaced, a format bonus of 0.5 included)."""
    inputs = _inputs([8, 30, 12, 20], [True, False, True, True], [0, 0, 1, 1], rewards=[1.5, 0.5, 1.0, 1.0])
    out = _shape(HBPO, inputs, budgets=[0.25, 0.5])
    np.testing.assert_allclose((inputs.rewards + out.reward).numpy(), [3.695518, 0.0, 3.514026, 2.828427], atol=1e-6)


def test_hbpo_budget_settings_are_fractions():
    with pytest.raises(ConfigError, match="budgets"):
        load_config(None, ["algo.reward_shapers=[{name: hbpo_budget, budgets: [512]}]"])


# ------------------------------------------------------------------------------------- shared edges


@pytest.mark.parametrize("name", [CONCISER, HBPO, KIMI])
def test_empty_batch_and_correct_from_rewards(name):
    assert _shape(name, _inputs([], [], [])).reward.numel() == 0
    given = _shape(name, _inputs([10, 30], [True, True], [0, 0])).reward
    inferred = _shape(name, _inputs([10, 30], [True, True], [0, 0], with_correct=False)).reward
    torch.testing.assert_close(given, inferred)  # no correctness given: rewards > 0


@pytest.mark.parametrize("name", [CONCISER, KIMI])
def test_no_correct_answer_gets_no_bonus(name):
    out = _shape(name, _inputs([5, 10, 20], [False] * 3, [0] * 3)).reward
    assert torch.all(out <= 0)


def _traj(group: int, n_tokens: int, reward: float, correct: bool | None) -> Trajectory:
    meta = {} if correct is None else {"correct": correct}
    return Trajectory(token_ids=[1] * (2 + n_tokens), loss_mask=[0, 0] + [1] * n_tokens, logprobs=[0.0] * (2 + n_tokens),
                      version=0, group_id=group, task_id="t", reward=reward, metadata=meta)


def test_shape_rewards_reads_each_trajectorys_correctness():
    """A reward of 1 marked wrong by the verifier (e.g. a format bonus) is wrong for the shaper; without a verdict
    the reward decides. Kimi, lengths 2/6: lambda 0.5, -0.5; row 0 is wrong -> min(0, 0.5) = 0."""
    trajs = [_traj(0, 2, 1.0, False), _traj(0, 6, 1.0, True), _traj(1, 2, 1.0, None), _traj(1, 6, 0.0, None)]
    shape_rewards(trajs, load_config(None, ["algo.reward_shapers=[{name: kimi_length}]"]).algo.reward_shapers, 8)
    assert [t.reward for t in trajs] == [1.0, 0.5, 1.5, -0.5]
    assert [t.metadata[KIMI] for t in trajs] == [0.0, -0.5, 0.5, -0.5]


# ------------------------------------------------------------------------------------ budget sampler


class _Engine:
    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, []

    def generate(self, requests, params):
        self.calls.append(([list(r.prompt_ids) for r in requests], params.n))
        return [Generation(r.request_id, list(r.prompt_ids), [4], [0.0], "stop", 0, sample_index=i)
                for r in requests for i in range(params.n)]


def test_hbpo_budgets_sampler_asks_each_subgroup_for_its_budget():
    """G = 4, budgets 0.25 / 0.5 of 40 tokens -> rows 0-1 are asked for 10, rows 2-3 for 20 (the template's
    digits encoded by the shipped tokenizer: '1' '0' -> ids 5 4), in request order."""
    from reinforge.models.loading import load_tokenizer

    engine = _Engine(load_tokenizer("tiny-base"))
    sampler = build_group_sampler("hbpo_budgets", load_config(None, [
        "rollout.group_sampler={name: hbpo_budgets, budgets: [0.25, 0.5], template: '={budget}'}"]).rollout.group_sampler.settings())
    requests = [GenerationRequest([6, 14, 7], "a"), GenerationRequest([8], "b")]
    out = sampler.sample(engine, requests, SamplingParams(max_new_tokens=40, n=4))
    assert [n for _, n in engine.calls] == [2, 2]
    assert [g.request_id for g in out] == ["a"] * 4 + ["b"] * 4
    assert [g.sample_index for g in out] == [0, 1, 2, 3] * 2
    assert [g.extra["budget"] for g in out] == [10, 10, 20, 20] * 2
    assert out[0].prompt_ids == [6, 14, 7, 16, 5, 4] and out[6].prompt_ids == [8, 16, 6, 4]
    assert sampler.counters()["tokens_generated"] == 8.0


# --------------------------------------------------------------------------- the arithmetic trade-off


def test_arithmetic_with_working_is_a_length_trade_off():
    """With ``numeric_match`` the arithmetic task accepts working before the answer (its last number), so a
    padded answer is as correct as a bare one and only a length shaper tells them apart."""
    task = Task("t", [{"role": "user", "content": "23+45="}], "68")
    assert numeric_match(task, "68").correct and numeric_match(task, "20+40=60 3+5=8 60+8=68").correct
    lengths, correct = [1, 9], [True, True]  # tokens of the bare and the padded answer
    for name in (CONCISER, KIMI, HBPO):
        out = _shape(name, _inputs(lengths, correct, [0, 0], max_new_tokens=16))
        assert out.reward[0] > out.reward[1], name


# ---------------------------------------------------------------------------- recipes and a short run


def test_a_recipe_names_every_length_shaper():
    cfg = load_config(None, ["algo.reward_shapers=[{name: conciser_length, alpha: 0.5}, {name: hbpo_budget, "
                             "budgets: [0.25, 0.75]}, {name: kimi_length, weight: 0.1}]"])
    shapers = cfg.algo.reward_shapers
    assert [s.name for s in shapers] == [CONCISER, HBPO, KIMI]
    assert shapers[0].settings().alpha == 0.5 and shapers[1].settings().budgets == [0.25, 0.75]
    assert shapers[2].settings().weight == 0.1


@pytest.mark.slow
def test_one_short_run_trains_through_the_length_shapers(tmp_path):
    """Two GRPO steps on arithmetic with working allowed, HBPO's budget subgroups and every length shaper."""
    from reinforge.orchestrate.run import train

    cfg = load_config(None, [
        f"output_dir={tmp_path}", "name=len", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "task.heldout_size=20", "task.verifier=numeric_match", "train.steps=2",
        "train.time_limit_s=0", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.report=false",
        "rollout.group_sampler={name: hbpo_budgets, budgets: [0.5, 1.0], template: '='}",
        "algo.reward_shapers=[{name: hbpo_budget, budgets: [0.5, 1.0]}, {name: conciser_length}, {name: kimi_length}]",
    ])
    result = train(cfg)
    metrics = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(metrics) == 2 and all(math.isfinite(m["reward/mean"]) for m in metrics)
    assert all(math.isfinite(m["train/loss"]) for m in metrics if "train/loss" in m)
