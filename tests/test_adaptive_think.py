"""AutoThink's stage-wise reward shaper and the thinking-mode prompt samplers (AutoThink's ellipsis, TFPI's
ThinkFree with staged lengths), against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.adaptive_think import AutoThinkSettings, think_flags
from reinforge.algo.shaping import REWARD_SHAPERS, ShapeInputs
from reinforge.config import load_config
from reinforge.orchestrate.episodes import shape_rewards
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.types import Trajectory


def _inputs(texts, correct, lengths=None, groups=None, rewards=None) -> ShapeInputs:
    n = len(texts)
    r = torch.tensor(rewards if rewards is not None else [float(c) for c in correct], dtype=torch.float64)
    return ShapeInputs(rewards=r, lengths=torch.tensor(lengths or [1] * n), truncated=torch.zeros(n, dtype=torch.bool),
                       group_index=torch.tensor(groups or [0] * n), max_new_tokens=16,
                       correct=torch.tensor(correct, dtype=torch.bool), texts=tuple(texts))


def _autothink(inputs, **options):
    settings = REWARD_SHAPERS.entry("autothink").make_settings(options, "test")
    return REWARD_SHAPERS.call("autothink", inputs, settings)


def test_think_flags_by_the_no_think_prefix_and_by_a_marker():
    """Default: no-think iff the response starts with '</think>' (leading whitespace ignored); a marker
    replaces that rule: think iff the marker occurs."""
    texts = ["  </think>\n\n5", "<think>x</think>5", "5", "2+3=5 5"]
    assert think_flags(texts, AutoThinkSettings()).tolist() == [False, True, True, True]
    assert think_flags(texts, AutoThinkSettings(think_marker="=")).tolist() == [False, False, False, True]


def test_stage1_naive_reward_and_batch_balance_hand_values():
    """think = [T, F, F, F] (marker '='), correct = [T, T, F, T]: naive R = [1, 2, -1, 2]. No-think fraction
    0.75 > gamma 0.5 -> lambda = (0.75 - 0.5) * 2 = 0.5; no-think rows move halfway to their targets
    (correct 1, wrong -2): 0.5*2 + 0.5*1 = 1.5, 0.5*(-1) + 0.5*(-2) = -1.5. The think fraction 0.25 is under
    gamma: row 0 keeps 1. Verifier rewards [1, 1, 0, 1] -> added terms [0, 0.5, -1.5, 0.5]."""
    out = _autothink(_inputs(["1+2=3 3", "3", "4", "5"], [True, True, False, True]), think_marker="=")
    assert out.reward.tolist() == pytest.approx([0.0, 0.5, -1.5, 0.5])


def test_stage1_balance_saturates_and_penalises_an_all_think_batch():
    """All four think: fraction 1 -> lambda = clip((1 - 0.5) * 2) = 1: correct -> 0, wrong -> -1 (the naive 1 / 0
    replaced by the targets). Verifier rewards [1, 0, 1, 1] -> terms [-1, -1, -1, -1]."""
    out = _autothink(_inputs(["a", "b", "c", "d"], [True, False, True, True]))
    assert out.reward.tolist() == pytest.approx([-1.0, -1.0, -1.0, -1.0])


def test_stage2_is_the_naive_reward():
    """Stage 2: no balance, no length terms: think 1 / 0, no-think 2 / -1."""
    texts = ["</think>5", "</think>6", "x", "y"]
    out = _autothink(_inputs(texts, [True, False, True, False], rewards=[0.0] * 4), stage=2)
    assert out.reward.tolist() == [2.0, -1.0, 1.0, 0.0]


def test_stage3_length_terms_hand_values():
    """One group of no-think rows, correct [T, T, T, F], lengths [2, 4, 6, 9]. Correct lengths: mean 4, unbiased
    std sqrt((4 + 0 + 4) / 2) = 2 -> z = -1, 0, 1; alpha 0.05: exp(0.05) - 1, 0, exp(-0.05) - 1. The single
    wrong row has no z (fewer than two): 0. Naive no-think R = [2, 2, 2, -1]."""
    texts = ["</think>a"] * 4
    out = _autothink(_inputs(texts, [True, True, True, False], lengths=[2, 4, 6, 9], rewards=[0.0] * 4), stage=3)
    want = [2 + math.exp(0.05) - 1, 2.0, 2 + math.exp(-0.05) - 1, -1.0]
    assert out.reward.tolist() == pytest.approx(want, abs=1e-12)


def test_stage3_wrong_answers_are_pushed_longer_per_group():
    """Two groups; group 1's wrong rows, lengths 3 and 5: mean 4, std sqrt(2) -> z = -/+ 0.7071; beta 0.1:
    1 - exp(0.07071) = -0.07327, 1 - exp(-0.07071) = 0.06827 (think rows: naive 0). Group 0's rows are
    one correct and one wrong: no length terms."""
    out = _autothink(_inputs(["a", "b", "c", "d"], [True, False, False, False], lengths=[1, 9, 3, 5],
                             groups=[0, 0, 1, 1], rewards=[0.0] * 4), stage=3, beta=0.1)
    z = 1 / math.sqrt(2)
    assert out.reward.tolist() == pytest.approx([1.0, 0.0, 1 - math.exp(0.1 * z), 1 - math.exp(-0.1 * z)])


def test_autothink_needs_the_texts():
    inputs = ShapeInputs(rewards=torch.zeros(2, dtype=torch.float64), lengths=torch.ones(2), truncated=torch.zeros(2),
                         group_index=torch.zeros(2, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="texts"):
        _autothink(inputs)


def test_shape_rewards_hands_the_completion_texts_to_autothink():
    """Through the loop's shape_rewards: 'x=1' thinks (marker '='), '1' does not; both correct, reward 1.
    Fractions 0.5 / 0.5: no balance. Naive R = 1 (think), 2 (no-think) -> terms 0, 1."""
    trajs = [Trajectory(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0] * 3, version=0, group_id=0,
                        task_id="t", reward=1.0, completion_text=text, metadata={"correct": True})
             for text in ("x=1", "1")]
    cfg = load_config(None, ["algo.reward_shapers=[{name: autothink, think_marker: '='}]"])
    shape_rewards(trajs, cfg.algo.reward_shapers, 8)
    assert [t.reward for t in trajs] == [1.0, 2.0]


# ----------------------------------------------------------------------------- thinking-mode prompts


class _Engine:
    def __init__(self) -> None:
        from reinforge.models.loading import load_tokenizer

        self.tokenizer, self.calls = load_tokenizer("tiny-base"), []

    def generate(self, requests, params):
        self.calls.append(([list(r.prompt_ids) for r in requests], params.n, params.max_new_tokens))
        return [Generation(r.request_id, list(r.prompt_ids), [4], [0.0], "stop", 0, sample_index=i)
                for r in requests for i in range(params.n)]


def _sampler(spec: str):
    return build_group_sampler(spec.split(",")[0].split(":")[1].strip(), load_config(
        None, [f"rollout.group_sampler={spec}"]).rollout.group_sampler.settings())


def test_autothink_ellipsis_appends_its_suffix_to_every_prompt():
    """Suffix '=' (the tiny tokenizer's id 16) after each prompt, one engine call for the whole group."""
    engine = _Engine()
    out = _sampler("{name: autothink_ellipsis, suffix: '='}").sample(
        engine, [GenerationRequest([6, 14], "a"), GenerationRequest([8], "b")], SamplingParams(max_new_tokens=8, n=2))
    assert engine.calls == [([[6, 14, 16], [8, 16]], 2, 8)]
    assert [g.prompt_ids for g in out] == [[6, 14, 16]] * 2 + [[8, 16]] * 2
    assert out[0].extra["prompt_suffix"] == "="


def test_thinkfree_stages_its_rollout_lengths_and_resumes():
    """stage_lengths [0.25, 1.0], stage_steps [2], max_new_tokens 40: calls 0 and 1 sample at most 10 tokens, call 2
    on 40; a sampler restored from the state after two calls goes on at 40. The suffix ' ' is id 17."""
    spec = "{name: thinkfree, suffix: ' ', stage_lengths: [0.25, 1.0], stage_steps: [2]}"
    engine, sampler = _Engine(), _sampler(spec)
    params = SamplingParams(max_new_tokens=40, n=1)
    for _ in range(3):
        out = sampler.sample(engine, [GenerationRequest([6], "a")], params)
    assert [c[2] for c in engine.calls] == [10, 10, 40]
    assert engine.calls[0][0] == [[6, 17]] and out[0].extra["thinkfree_budget"] == 40
    restored = _sampler(spec)
    restored.load_state_dict({"calls": 2})
    restored.sample(engine, [GenerationRequest([6], "a")], params)
    assert engine.calls[-1][2] == 40 and restored.state_dict() == {"calls": 3}


@pytest.mark.parametrize("bad", ["stage_lengths: [0.5, 1.0]", "stage_lengths: [0.5, 1.0], stage_steps: [0]",
                                 "stage_lengths: [1.5]"])
def test_thinkfree_settings_are_checked(bad):
    from reinforge.errors import ConfigError

    with pytest.raises((ConfigError, ValueError)):
        load_config(None, [f"rollout.group_sampler={{name: thinkfree, {bad}}}"]).rollout.group_sampler.settings()


@pytest.mark.slow
def test_two_steps_train_with_autothink_and_thinkfree(tmp_path):
    """Two GRPO steps on arithmetic with working allowed: AutoThink's stage-3 reward (working = thinking) over
    ThinkFree rollouts with two length stages."""
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, [
        f"output_dir={tmp_path}", "name=think", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "task.heldout_size=20", "task.verifier=numeric_match", "train.steps=2",
        "train.time_limit_s=0", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.report=false",
        "rollout.group_sampler={name: thinkfree, suffix: ' ', stage_lengths: [0.5, 1.0], stage_steps: [1]}",
        "algo.reward_shapers=[{name: autothink, stage: 3, think_marker: '='}]",
    ])
    result = train(cfg)
    metrics = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(metrics) == 2 and all(math.isfinite(m["reward/mean"]) for m in metrics)
