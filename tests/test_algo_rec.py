"""REC / REP / RED (algo/rec.py): the kept tokens of each clip mode, the weights and regularizers, their
gradients by hand, and that REC-OneSide-IS has PPO-clip's gradient."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.policy_losses import PPOClipSettings, ppo_clip_loss
from reinforge.algo.rec import RECSettings, rec_loss

RATIOS = [1.3, 0.7, 1.1, 0.3]
ADV = torch.tensor([[1.0, -1.0, -1.0, 1.0]])


def _run(**settings):
    logp = torch.full((1, 4), math.log(0.5), requires_grad=True)
    old = logp.detach() - torch.log(torch.tensor([RATIOS]))
    loss, metrics = rec_loss(logp, old, ADV, RECSettings(**settings))
    loss.sum().backward()
    return loss.detach()[0].tolist(), logp.grad[0].tolist(), metrics


@pytest.mark.parametrize("mode,kept", [
    # eps 0.2 / 0.2: A >= 0 keeps rho <= 1.2 (t3), A <= 0 keeps rho >= 0.8 (t2)
    ("one_side", [0.0, 0.0, 1.0, 1.0]),
    ("two_side", [0.0, 0.0, 1.0, 0.0]),  # only 1.1 lies in [0.8, 1.2]
    ("ring", [0.0, 0.0, 1.0, 1.0]),      # t3: A >= 0 and rho 0.3 <= 1 - 0.6
    ("none", [1.0, 1.0, 1.0, 1.0]),
])
def test_clip_modes_keep_by_hand(mode, kept):
    loss, grad, metrics = _run(clip_mode=mode)
    # NoIS: L = -A log pi on kept tokens; dL/dlog pi = -A
    assert grad == pytest.approx([-a * k for a, k in zip(ADV[0].tolist(), kept, strict=True)])
    assert loss == pytest.approx([-a * math.log(0.5) * k for a, k in zip(ADV[0].tolist(), kept, strict=True)])
    assert metrics["clip_frac"][0].tolist() == [1.0 - k for k in kept]


def test_weights_by_hand():
    _, grad, _ = _run(weight="importance_sampling")
    assert grad == pytest.approx([0.0, 0.0, 1.1, -0.3])  # -A rho on the one-side tokens
    _, grad, _ = _run(weight="advantage", temp=1.0)
    assert grad == pytest.approx([0.0, 0.0, math.exp(-1.0), -math.e])  # -A exp(A)


def test_regularizers_by_hand():
    _, grad, _ = _run(clip_mode="none", regularizer="k2", regularizer_coef=0.1)
    # -A + 0.2 log rho
    assert grad == pytest.approx([-1 + 0.2 * math.log(1.3), 1 + 0.2 * math.log(0.7), 1 + 0.2 * math.log(1.1),
                                  -1 + 0.2 * math.log(0.3)])
    _, grad, _ = _run(clip_mode="none", regularizer="forward_kl", regularizer_coef=0.1)
    assert grad == pytest.approx([-1.1, 0.9, 0.9, -1.1])  # -(A + c): AsymRE's lowered baseline


def test_one_side_with_importance_weights_has_ppo_clips_gradient():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 6, generator=g) - 2
    adv = torch.randn(3, 6, generator=g)
    start = old + 0.4 * torch.randn(3, 6, generator=g)
    grads = []
    for fn, cfg in ((rec_loss, RECSettings(weight="importance_sampling")), (ppo_clip_loss, PPOClipSettings())):
        logp = start.clone().requires_grad_(True)
        fn(logp, old, adv, cfg)[0].sum().backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_red_drop_balances_each_group_by_hand():
    from reinforge.algo.rec import REDDropSettings, red_drop_advantage

    # group 0: 1,0,0,0 (mean 0.25: 1 positive, 3 negatives): the first 2 negatives dropped; kept 1, 0: mean 0.5
    # group 1: 1,1,0 (mean 0.667: 2 positives, 1 negative): nothing dropped
    # group 2: one row: A = r
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.7])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2])
    adv = red_drop_advantage(r, groups, torch.ones(8, 1), REDDropSettings())[:, 0]
    assert adv.tolist() == pytest.approx([0.5, 0.0, 0.0, -0.5, 1 / 3, 1 / 3, -2 / 3, 0.7], abs=1e-6)
    # with the kept rows' population std: group 0's 0.5, group 1's sqrt(2/9) = 0.471405, group 2's 1
    adv = red_drop_advantage(r, groups, torch.ones(8, 1), REDDropSettings(scale_by_std=True))[:, 0]
    assert adv.tolist() == pytest.approx([1.0, 0.0, 0.0, -1.0, 0.707107, 0.707107, -1.414214, 0.7], abs=1e-5)
