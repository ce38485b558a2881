"""DCPO's Smooth Advantage Standardization (algo/sas.py): hand-computed values over three visits of a
prompt, prompts tracked apart, the state's round trip, and a run that resumes its history exactly."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.sas import RewardHistory, SASSettings, dcpo_sas_advantage
from reinforge.config import load_config
from reinforge.track.jsonl import read_jsonl


def _adv(history, rewards, keys, groups=None):
    r = torch.tensor(rewards, dtype=torch.float64)
    groups = torch.zeros(len(r), dtype=torch.long) if groups is None else torch.tensor(groups)
    mask = torch.ones(len(r), 2)
    out = dcpo_sas_advantage(r, groups, mask, torch.tensor(keys), history)
    assert torch.equal(out[:, 0], out[:, 1])  # every token of a sequence gets its advantage
    return out[:, 0].tolist()


def test_three_visits_of_one_prompt_by_hand():
    h = RewardHistory(SASSettings())
    # visit 1 (k = 0): rewards 1, 0, 0, 0: mu 0.25, unbiased sigma sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5: GRPO's
    assert _adv(h, [1, 0, 0, 0], [7] * 4) == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # visit 2 (k = 1): all 1: z_n = 0; mu_c = (0.25 + 1) / 2 = 0.625,
    # sigma_c^2 = (0.25 + 0 + 1/2 * 0.75^2) / 2 = 0.265625; z_c = 0.375 / 0.515388 = 0.727607;
    # SAS_a = SAS_b = 0.727607 / 2 = 0.363803: the equal-reward group still trains
    assert _adv(h, [1, 1, 1, 1], [7] * 4) == pytest.approx([0.363803] * 4, abs=1e-6)
    # visit 3 (k = 2): rewards 1, 0, 1, 0: mu_n 0.5, sigma_n sqrt(1/3) = 0.577350;
    # mu_c = (2 * 0.625 + 0.5) / 3 = 0.583333, sigma_c^2 = (2 * 0.265625 + 1/3 + 2/3 * 0.125^2) / 3 = 0.291667;
    # r = 1: z_n = 0.866025, z_c = 0.416667 / 0.540062 = 0.771517; SAS_a = z_c/3 + 2 z_n/3 = 0.834522,
    #        SAS_b = z_n/3 + 2 z_c/3 = 0.803020 -> the smaller: 0.803020
    # r = 0: z_n = -0.866025, z_c = -1.080123; SAS_a = -0.937391, SAS_b = -1.008757 -> -0.937391
    assert _adv(h, [1, 0, 1, 0], [7] * 4) == pytest.approx([0.803020, -0.937391] * 2, abs=1e-6)
    assert h.times == {7: 3} and h.mean[7] == pytest.approx(0.583333, abs=1e-6)
    assert h.std[7] == pytest.approx(math.sqrt(0.875 / 3))
    assert h.update({}) == {"sas/revisited_frac": 1.0, "sas/prompts_tracked": 1.0}


def test_prompts_are_tracked_apart_and_an_unseen_prompt_is_grpo():
    h = RewardHistory(SASSettings())
    _adv(h, [1, 0], [3, 3])
    # prompt 3 again (all 0) and prompt 5 new (1, 0) in one batch, groups 0 and 1
    out = _adv(h, [0, 0, 1, 0], [3, 3, 5, 5], groups=[0, 0, 1, 1])
    # prompt 3: mu_c = 0.25, sigma_c^2 = (0.5 + 0 + 0.5 * 0.25) / 2 = 0.3125; z_c = -0.25 / 0.559017 = -0.447214; / 2
    assert out[:2] == pytest.approx([-0.223607] * 2, abs=1e-6)
    assert out[2:] == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)])  # (1 - 0.5) / 0.707107, as GRPO
    assert h.times == {3: 2, 5: 1} and h.update({})["sas/revisited_frac"] == 0.5


def test_history_scale_shrinks_the_past_and_equal_rewards_with_no_spread_give_zero():
    h = RewardHistory(SASSettings(history_scale=0.5))
    _adv(h, [1, 1], [1, 1])  # sigma 0 everywhere: advantage 0
    assert h.mean[1] == 1.0 and h.std[1] == 0.0
    # k = 1, mu_o -> 0.5 (scaled), sigma_o -> 0: mu_c = 0.75, sigma_c^2 = (0 + 0 + 0.5 * 0.25) / 2 = 0.0625
    # all rewards 1: z_c = 0.25 / 0.25 = 1, z_n = 0: A = 1 / 2
    assert _adv(h, [1, 1], [1, 1]) == pytest.approx([0.5, 0.5])


def test_state_round_trip_and_refusals():
    h = RewardHistory(SASSettings())
    _adv(h, [1, 0, 0], [9, 9, 9])
    g = RewardHistory(SASSettings())
    g.load_state_dict(h.state_dict())
    assert (g.mean, g.std, g.times) == (h.mean, h.std, h.times)
    with pytest.raises(ValueError, match="RewardHistory"):
        dcpo_sas_advantage(torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 1), None, h)
    assert set(ADVANTAGES.needs("dcpo_sas")) == {"prompt_key", "ungrouped"}
    with pytest.raises(Exception, match="skip_equal_reward_groups"):
        load_config(None, ["algo.advantage=dcpo_sas", "algo.skip_equal_reward_groups=true"])


@pytest.mark.slow
def test_the_dcpo_preset_resumes_its_reward_history_exactly(tmp_path, monkeypatch):
    """digits 1: 10 training problems, 4 a step, so prompts come back within the 3 steps. The run is killed
    after its step-2 checkpoint and resumed, with the same ``train.steps`` (a run planned for 2 steps has
    another learning-rate schedule, so its step-2 weights are not the 3-step run's)."""
    from resume_fixtures import straight_and_resumed

    def cfg(name):
        return load_config(None, [
            f"output_dir={tmp_path}", f"name={name}", "train.steps=3", "checkpoint.every=1", "preset=dcpo",
            "task.digits=1", "task.heldout_size=90", "rollout.prompts_per_step=4", "rollout.group_size=4",
            "eval.every=0", "eval.final_samples=0", "log.report=false", "train.time_limit_s=0"])

    def rows(result):
        return [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]

    straight, resumed = (rows(r) for r in straight_and_resumed(monkeypatch, cfg, kill_at=2))
    assert straight[0]["train/sas/revisited_frac"] == 0.0 and straight[2]["train/sas/revisited_frac"] > 0
    for key in ("train/sas/prompts_tracked", "train/sas/revisited_frac", "train/loss", "adv/mean", "reward/mean"):
        assert resumed[2][key] == straight[2][key], key
