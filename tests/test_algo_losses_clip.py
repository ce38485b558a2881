"""The clipping family beyond PPO's: CE-GPPO, DCPO (and its OTM aggregation), ASPO against hand-computed
values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.policy_losses import CEGPPOSettings, ce_gppo_loss
from reinforge.config import load_config
from reinforge.errors import ConfigError

RATIO = torch.tensor([[1.5, 0.5, 1.0, 1.3, 4.0]])
ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0, -1.0]])


def test_ce_gppo_values_and_the_gradients_it_preserves():
    # above the range with A > 0: value -beta2 (1 + eps) A = -1.2, gradient -1.2 (PPO: 0);
    # below it with A < 0: value -beta1 (1 - eps) A = 0.75 * 0.8 = 0.6, gradient +0.6 (PPO: 0);
    # inside: -rho A; A < 0 above the range: PPO's unclipped -rho A = 1.3; rho = 4 hits the dual clip c = 3
    logp = torch.log(RATIO).requires_grad_(True)
    loss, metrics = ce_gppo_loss(logp, torch.zeros(1, 5), ADV, CEGPPOSettings())
    assert_close(loss, torch.tensor([[-1.2, 0.6, -1.0, 1.3, 3.0]]))
    loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-1.2, 0.6, -1.0, 1.3, 0.0]]))  # d(-rho A)/dlogp = -rho A
    assert metrics["clip_frac"].tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]
    assert metrics["dual_clip_frac"].tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]


def test_ce_gppo_with_unit_betas_has_ppo_values_but_keeps_the_clipped_gradients():
    from reinforge.algo.policy_losses import PPOClipSettings, ppo_clip_loss

    logp = torch.log(RATIO).requires_grad_(True)
    ours, _ = ce_gppo_loss(logp, torch.zeros(1, 5), ADV, CEGPPOSettings(beta1=1.0, beta2=1.0))
    ppo, _ = ppo_clip_loss(logp, torch.zeros(1, 5), ADV, PPOClipSettings(dual_clip=3.0))
    assert_close(ours, ppo)  # beta = 1: the same values as PPO (only the gradients differ)
    (g_ours,) = torch.autograd.grad(ours.sum(), logp, retain_graph=True)
    (g_ppo,) = torch.autograd.grad(ppo.sum(), logp)
    assert g_ppo[0, 0] == 0 and g_ppo[0, 1] == 0 and g_ours[0, 0] != 0 and g_ours[0, 1] != 0


def test_ce_gppo_settings_are_validated():
    assert load_config(None, ["algo.policy_loss={name: ce_gppo, beta1: 0.5}"]).algo.policy_loss.settings.beta1 == 0.5
    with pytest.raises(ConfigError, match="dual_clip"):
        load_config(None, ["algo.policy_loss={name: ce_gppo, dual_clip: 0.5}"])


def test_ce_gppo_trains_through_the_learner_with_several_minibatches(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, [f"output_dir={tmp_path}", "algo.policy_loss=ce_gppo", "train.minibatches=2",
                             "train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4",
                             "algo.skip_equal_reward_groups=false", "task.heldout_size=20", "eval.every=0",
                             "eval.final_samples=0", "log.report=false", "checkpoint.every=0", "train.time_limit_s=0"])
    rows = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2 and all(m["train/updates"] == 2 and "train/clip_frac" in m for m in rows)


# DCPO: old probabilities q chosen so the bounds are round. eps_low 0.16, eps_high 0.2:
# q = 0.1: lo = 0.5 + 0.5 sqrt(max(1 - 6.4, 0)) = 0.5, hi = 0.5 + 0.5 sqrt(1 + 8) = 2.0;
# q = 1: lo = 0.5 + 0.5 sqrt(1 - 0.64) = 0.8, hi = 0.5 + 0.5 sqrt(1.8) = 1.1708;
# q = 0.01: hi = 0.5 + 0.5 sqrt(81) = 5.0; q = 0.0008: hi = 0.5 + 0.5 sqrt(1001) = 16.3 -> capped at r_max 10.
DCPO_Q = torch.tensor([[0.1, 0.1, 1.0, 1.0, 0.0008, 0.0008, 0.01]])
DCPO_RATIO = torch.tensor([[1.8, 2.5, 0.7, 0.9, 12.0, 12.0, 4.0]])
DCPO_ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0, 1.0]])


def test_dcpo_bounds_follow_the_prior_probability():
    from reinforge.algo.policy_losses import DCPOSettings, dcpo_bounds

    low, high = dcpo_bounds(torch.log(DCPO_Q), DCPOSettings())
    assert_close(low[0, [0, 2]], torch.tensor([0.5, 0.8]))
    assert_close(high[0, [0, 2, 4, 6]], torch.tensor([2.0, 0.5 + 0.5 * 1.8 ** 0.5, 10.0, 5.0]))


def test_dcpo_values_and_gradients():
    from reinforge.algo.policy_losses import DCPOSettings, dcpo_loss

    # 1: rho 1.8 inside [0.5, 2] (PPO's 1.2 would clip it): -1.8, gradient -rho A = -1.8
    # 2: rho 2.5 above 2: -2, no gradient; 3: A < 0, rho 0.7 below 0.8: 0.8, no gradient
    # 4: A < 0, rho 0.9 inside: 0.9, gradient 0.9; 5: A < 0, rho 12: unclipped 12, dual clip at r_max: 10, none
    # 6: A > 0, rho 12 above the capped bound 10: -10, none; 7: q 0.01, rho 4 inside [0.5, 5]: -4, gradient -4
    old = torch.log(DCPO_Q)
    logp = (old + torch.log(DCPO_RATIO)).requires_grad_(True)
    loss, metrics = dcpo_loss(logp, old, DCPO_ADV, DCPOSettings())
    assert_close(loss, torch.tensor([[-1.8, -2.0, 0.8, 0.9, 10.0, -10.0, -4.0]]))
    loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-1.8, 0.0, 0.0, 0.9, 0.0, 0.0, -4.0]]))
    assert metrics["clip_frac"].tolist() == [[0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]]
    assert metrics["dual_clip_frac"].tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]]


def test_only_token_mean_sums_each_responses_token_mean():
    from reinforge.algo.aggregation import LOSS_AGG, AggNorm

    otm = LOSS_AGG.get("seq_sum_token_mean")
    values = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [5.0, 7.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    norm = AggNorm.of(mask)
    # token means 2, 4, 6, summed: 12 (seq_mean_token_mean: 12 / 3); any split into micro-batches adds up to it
    assert float(otm(values, mask, norm)) == 12.0
    assert float(otm(values[:1], mask[:1], norm) + otm(values[1:], mask[1:], norm)) == 12.0
    assert float(LOSS_AGG.get("seq_mean_token_mean")(values, mask, norm)) == 4.0


ASPO_RATIO = torch.tensor([[0.5, 1.25, 0.25, 0.9, 0.75, 4.0, 1.1]])
ASPO_ADV = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0]])


def test_aspo_flips_the_weight_of_positive_tokens():
    from reinforge.algo.policy_losses import ASPOSettings, aspo_loss

    # A > 0: weight 1/rho (value -A/rho, gradient -(1/rho) A): rho 0.5 -> -2; rho 1.1 -> -1/1.1 (PPO: -1.1);
    # rho 1.25 > 1.2 is masked (value -1/1.2, no gradient); rho 0.25: weight 4 > c = 3, soft dual clip: -3, gradient -3.
    # A < 0: weight rho: 0.9 -> 0.9; rho 0.75 < 0.8 masked (value 0.8, none); rho 4 > c: soft dual clip 3, gradient 3
    logp = torch.log(ASPO_RATIO).requires_grad_(True)
    loss, metrics = aspo_loss(logp, torch.zeros(1, 7), ASPO_ADV, ASPOSettings())
    assert_close(loss, torch.tensor([[-2.0, -1 / 1.2, -3.0, 0.9, 0.8, 3.0, -1 / 1.1]]))
    loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-2.0, 0.0, -3.0, 0.9, 0.0, 3.0, -1 / 1.1]]))
    assert metrics["clip_frac"].tolist() == [[0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]]
    assert metrics["dual_clip_frac"].tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]]


def test_aspo_gradient_grows_as_a_positive_token_falls_behind():
    """PPO's gradient on a positive token is rho A (largest for the tokens already reinforced);
    ASPO's is A / rho (largest for the ones that fell behind pi_old)."""
    from reinforge.algo.policy_losses import ASPOSettings, PPOClipSettings, aspo_loss, ppo_clip_loss

    ratio = torch.tensor([[0.85, 1.0, 1.15]])
    adv = torch.ones(1, 3)
    logp = torch.log(ratio).requires_grad_(True)
    (g_aspo,) = torch.autograd.grad(aspo_loss(logp, torch.zeros(1, 3), adv, ASPOSettings())[0].sum(), logp)
    (g_ppo,) = torch.autograd.grad(ppo_clip_loss(logp, torch.zeros(1, 3), adv, PPOClipSettings())[0].sum(), logp)
    assert_close(-g_aspo, 1 / ratio)
    assert_close(-g_ppo, ratio)


@pytest.mark.parametrize(("override", "field"), [
    ("{name: dcpo, max_ratio: 1.0}", "max_ratio"),
    ("{name: dcpo, clip_low: -0.1}", "clip_low"),
    ("{name: aspo, dual_clip: 1.0}", "dual_clip"),
    ("{name: aspo, clip_high: -1}", "clip_high"),
])
def test_dcpo_and_aspo_settings_are_validated(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [f"algo.policy_loss={override}"])


def test_dcpo_and_aspo_settings_load():
    assert load_config(None, ["algo.policy_loss={name: dcpo, clip_high: 0.3}"]).algo.policy_loss.settings.clip_high == 0.3
    assert load_config(None, ["algo.policy_loss={name: aspo, dual_clip: 4}"]).algo.policy_loss.settings.dual_clip == 4.0
    assert load_config(None, ["algo.loss_agg=seq_sum_token_mean"]).algo.loss_agg == "seq_sum_token_mean"
