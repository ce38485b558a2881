"""Reward-model score transforms (algo/reward_transforms.py) against hand-computed values, and the scorer
that feeds them: running statistics of the raw scores, and reference rewards scored once per task."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_reward_model import COMPLETIONS, build, tasks

from reinforge.algo.reward_transforms import ClipSettings, PARSettings, clip_transform, par_transform
from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.rewards.reward_model import RewardModelScorer, reference_responses
from reinforge.types import Task


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_clip_holds_scores_within_c_standard_deviations_of_the_mean() -> None:
    scores = torch.tensor([-3.0, 0.5, 1.0, 4.0], dtype=torch.float64)
    out = clip_transform(scores, mean=1.0, std=2.0, cfg=ClipSettings(width=0.5))  # range [0, 2]
    assert out.tolist() == [0.0, 0.5, 1.0, 2.0]


def test_par_is_the_mean_sigmoid_win_over_each_reference_and_skips_missing_ones() -> None:
    scores = torch.tensor([2.0, 0.0], dtype=torch.float64)
    reference = torch.tensor([[1.0, 3.0], [0.5, float("nan")]], dtype=torch.float64)
    out = par_transform(scores, reference, PARSettings(k=2.0))
    assert out.tolist() == pytest.approx([(sig(2.0) + sig(-2.0)) / 2, sig(-1.0)], abs=1e-12)
    at_reference = par_transform(torch.tensor([5.0], dtype=torch.float64), torch.tensor([[5.0]], dtype=torch.float64),
                                 PARSettings())
    assert at_reference.item() == 0.5  # 1/2 at the reference; bounded in (0, 1) away from it
    far = par_transform(torch.tensor([40.0, -40.0], dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64),
                        PARSettings())
    assert 0.0 <= far[1].item() < 1e-15 and 1.0 - 1e-15 < far[0].item() <= 1.0


def test_the_scorer_clips_with_the_running_statistics_of_raw_scores(tiny_tokenizer) -> None:
    model = build("llama", tiny_tokenizer)
    raw = RewardModelScorer(model, tiny_tokenizer).score(tasks(), COMPLETIONS)
    scorer = RewardModelScorer(model, tiny_tokenizer, transform="clip", transform_cfg=ClipSettings(width=0.5))
    first = scorer.score(tasks()[:3], COMPLETIONS[:3])
    mean, std = np.mean(raw[:3]), np.std(raw[:3])
    assert first == pytest.approx(np.clip(raw[:3], mean - 0.5 * std, mean + 0.5 * std).tolist(), abs=1e-5)
    second = scorer.score(tasks()[3:], COMPLETIONS[3:])
    mean, std = np.mean(raw), np.std(raw)  # every raw score so far
    assert second == pytest.approx(np.clip(raw[3:], mean - 0.5 * std, mean + 0.5 * std).tolist(), abs=1e-5)
    assert np.abs(np.subtract(first + second, raw)).max() > 0.5  # some were clipped
    resumed = RewardModelScorer(model, tiny_tokenizer, transform="clip")
    resumed.load_state_dict(scorer.state_dict())
    assert resumed.raw_stats.count == 6 and resumed.raw_stats.mean == pytest.approx(np.mean(raw))


def test_par_centres_on_the_reference_answer_or_the_given_reference_responses(tiny_tokenizer) -> None:
    model = build("llama", tiny_tokenizer)
    plain = RewardModelScorer(model, tiny_tokenizer)
    with_refs = Task("r", "12+34=", "46", {"reference_responses": ["46", "45"]})
    answer_only = Task("a", "5+5=", "10")
    r_refs = plain.score([with_refs, with_refs], ["46", "45"])
    r_answer = plain.score([answer_only], ["10"])[0]
    completions = ["47", "10", "3"]
    raw = plain.score([with_refs, answer_only, answer_only], completions)
    scorer = RewardModelScorer(model, tiny_tokenizer, transform="par")
    out = scorer.score([with_refs, answer_only, answer_only], completions)
    expected = [(sig(raw[0] - r_refs[0]) + sig(raw[0] - r_refs[1])) / 2, 0.5, sig(raw[2] - r_answer)]
    assert out == pytest.approx(expected, abs=1e-5)
    assert scorer.reference_scores.keys() == {"r", "a"}  # scored once per task id, then kept
    scorer.reference_scores["a"] = [r_answer + 1.0]
    assert scorer.score([answer_only], ["10"]) == pytest.approx([sig(-1.0)], abs=1e-5)


def test_reference_responses_are_checked() -> None:
    assert reference_responses(Task("t", "p", "7")) == ["7"]
    with pytest.raises(ConfigError, match="task t: metadata.reference_responses must be a list"):
        reference_responses(Task("t", "p", "7", {"reference_responses": "7"}))
    with pytest.raises(ConfigError, match="task t: a reward centred on reference responses needs"):
        reference_responses(Task("t", "p", ""))


def test_a_recipe_names_the_transform_with_its_settings() -> None:
    cfg = load_config("rlhf_arithmetic", ["reward.terms.0.reward_model.transform={name: par, k: 2.0}"])
    transform = cfg.reward.terms[0].reward_model.transform
    assert transform == "par" and transform.settings.k == 2.0
    with pytest.raises(ConfigError, match="transform: unknown reward-model score transform .squash.; allowed: clip, none, par"):
        load_config("rlhf_arithmetic", ["reward.terms.0.reward_model.transform=squash"])
