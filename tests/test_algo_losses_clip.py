"""The clipping family beyond PPO's: CE-GPPO against hand-computed values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.losses_clip import CEGPPOSettings, ce_gppo_loss
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
    from reinforge.algo.losses import PPOClipSettings, ppo_clip_loss

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
