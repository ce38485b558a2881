"""Regression-style objectives: A*-PO and PACS against hand-computed values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.aggregation import LOSS_AGG, AggNorm
from reinforge.algo.regression import (
    AStarPOSettings,
    PACSSettings,
    astar_po_loss,
    balanced_weights,
    leave_one_out,
    pacs_loss,
    soft_optimal_value,
)
from reinforge.config import load_config
from reinforge.errors import ConfigError

SEQ_MEAN = LOSS_AGG.get("seq_mean_token_mean")


def test_soft_optimal_value_by_hand():
    # beta 0.5: 0.5 log((e^2 + 3) / 4) = 0.5 log(2.597264) = 0.477229 (one of four samples right);
    # 0.5 log((e^2 + 1) / 2) = 0.716890; all right -> 1, all wrong -> 0
    v = soft_optimal_value(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [1.0] * 4, [0.0] * 4]), 0.5)
    assert_close(v, torch.tensor([0.4772293, 0.7168904, 1.0, 0.0], dtype=torch.float64))
    # it lies between the mean (beta -> inf) and the max (beta -> 0)
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert 0.25 < soft_optimal_value(r, 100.0).item() < 0.26 and soft_optimal_value(r, 0.01).item() > 0.98


def _astar_inputs():
    # log pi - log pi_ref: row 0 [0.5, 0.5, (masked 9)] -> h0 = 1; row 1 [1, -2, 3] -> h1 = 2
    ref = torch.zeros(2, 3)
    logp = torch.tensor([[0.5, 0.5, 9.0], [1.0, -2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, ref, mask, torch.tensor([1.0, 0.0]), torch.tensor([0.6, 0.3])


def test_astar_po_values_by_hand():
    # beta2 0.1: implicit [0.1, 0.2]; targets r - V* = [0.4, -0.3]; residuals [-0.3, 0.5] -> L = [0.09, 0.25]
    logp, ref, mask, rewards, vstar = _astar_inputs()
    loss, metrics = astar_po_loss(logp, ref, mask, rewards, vstar, AStarPOSettings(beta2=0.1))
    assert_close(loss, torch.tensor([[0.09, 0.09, 0.0], [0.25, 0.25, 0.25]]))
    assert_close(metrics["regression/implicit_reward"], torch.tensor([[0.1, 0.1, 0.0], [0.2, 0.2, 0.2]]))
    assert_close(metrics["regression/target"], torch.tensor([[0.4, 0.4, 0.0], [-0.3, -0.3, -0.3]]))
    assert_close(SEQ_MEAN(loss, mask, AggNorm.of(mask)), torch.tensor(0.17))  # mean over sequences


def test_astar_po_gradient_pushes_towards_the_optimal_advantage():
    # d/dlogp_it of (1/2) sum_i L_i = (1/2) 2 beta2 residual_i: row 0: 0.1 * -0.3 = -0.03 (raised: it beat V*),
    # row 1: 0.1 * 0.5 = +0.05 (lowered), the masked token none
    logp, ref, mask, rewards, vstar = _astar_inputs()
    loss, _ = astar_po_loss(logp, ref, mask, rewards, vstar, AStarPOSettings(beta2=0.1))
    SEQ_MEAN(loss, mask, AggNorm.of(mask)).backward()
    assert_close(logp.grad, torch.tensor([[-0.03, -0.03, 0.0], [0.05, 0.05, 0.05]]))


def test_astar_po_at_its_target_has_no_gradient_and_needs_v_star():
    logp, ref, mask, rewards, _ = _astar_inputs()
    at_target = torch.tensor([1.0 - 0.1 * 1.0, 0.0 - 0.1 * 2.0])  # r - V* = beta2 h exactly
    loss, _ = astar_po_loss(logp, ref, mask, rewards, at_target, AStarPOSettings(beta2=0.1))
    loss.sum().backward()
    assert_close(logp.grad, torch.zeros(2, 3))
    with pytest.raises(ConfigError, match="optimal_value"):
        astar_po_loss(logp, ref, mask, rewards, None, AStarPOSettings())


def _pacs_inputs():
    # one group of 3, the second token masked: rhat = [1, 0, -1] (beta 1);
    # psi = rhat_i - mean of the others' = [1 - (-1/2), 0 - 0, -1 - 1/2] = [1.5, 0, -1.5]
    logp = torch.tensor([[1.0, 5.0], [0.0, 5.0], [-1.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]] * 3)
    return logp, torch.zeros(3, 2), mask, torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long)


def test_pacs_values_by_hand():
    # BCE: softplus(-1.5) = 0.2014133 (right and confident), softplus(0) = log 2, softplus(-1.5) again;
    # balanced weights (1 positive, 2 negatives of 3): 3/2 and 3/4, 3/4
    logp, ref, mask, rewards, groups = _pacs_inputs()
    plain, metrics = pacs_loss(logp, ref, ref, mask, rewards, groups, PACSSettings(balance=False))
    assert_close(plain[:, 0], torch.tensor([0.2014133, 0.6931472, 0.2014133]))
    assert_close(plain[:, 1], torch.zeros(3))
    assert_close(metrics["pacs/psi"][:, 0], torch.tensor([1.5, 0.0, -1.5]))
    assert metrics["pacs/accuracy"][:, 0].tolist() == [1.0, 1.0, 1.0]  # psi = 0 with label 0 counts as right
    weighted, _ = pacs_loss(logp, ref, ref, mask, rewards, groups, PACSSettings())
    assert_close(weighted[:, 0], torch.tensor([1.5 * 0.2014133, 0.75 * 0.6931472, 0.75 * 0.2014133]))


def test_pacs_gradient_by_hand():
    # dL/dpsi_i = w_i (sigmoid(psi_i) - y_i) = [1.5 (0.8175745 - 1), 0.75 (0.5), 0.75 (0.1824255)]
    #           = [-0.2736383, 0.375, 0.1368191];
    # dL/drhat_k = g_k - (1/2) sum_{i != k} g_i = [-0.5295479, 0.4434096, 0.0861383] (sums to 0),
    # on the trained token only: the right sample is raised, the two wrong ones lowered
    logp, ref, mask, rewards, groups = _pacs_inputs()
    loss, _ = pacs_loss(logp, ref, ref, mask, rewards, groups, PACSSettings())
    loss.sum().backward()
    assert_close(logp.grad[:, 0], torch.tensor([-0.5295479, 0.4434096, 0.0861383]))
    assert_close(logp.grad[:, 1], torch.zeros(3))


def test_pacs_anchor_old_reads_old_logp_and_beta_scales_psi():
    logp, ref, mask, rewards, groups = _pacs_inputs()
    old = logp.detach().clone()  # pi_old = pi: rhat = 0, psi = 0, every loss log 2 (unweighted)
    loss, _ = pacs_loss(logp, ref, old, mask, rewards, groups, PACSSettings(anchor="old", balance=False))
    assert_close(loss[:, 0], torch.full((3,), 0.6931472))
    _, metrics = pacs_loss(logp, ref, ref, mask, rewards, groups, PACSSettings(beta=2.0))
    assert_close(metrics["pacs/psi"][:, 0], torch.tensor([3.0, 0.0, -3.0]))


def test_leave_one_out_and_balanced_weights_per_group():
    groups = torch.tensor([0, 0, 1, 1, 1])
    # group 0: [2, 4] -> [2 - 4, 4 - 2]; group 1: [3, 0, 0] -> [3 - 0, 0 - 1.5, 0 - 1.5]
    assert_close(leave_one_out(torch.tensor([2.0, 4.0, 3.0, 0.0, 0.0]), groups),
                 torch.tensor([-2.0, 2.0, 3.0, -1.5, -1.5]))
    # group 0 all right: weight 1; group 1: one right of 3 -> 3/2, the wrong ones 3/4
    assert_close(balanced_weights(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]), groups),
                 torch.tensor([1.0, 1.0, 1.5, 0.75, 0.75], dtype=torch.float64))
    with pytest.raises(ValueError, match="group_size >= 2"):
        leave_one_out(torch.tensor([1.0, 2.0]), torch.tensor([0, 1]))


def test_pacs_refuses_rewards_outside_zero_one():
    logp, ref, mask, _, groups = _pacs_inputs()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pacs_loss(logp, ref, ref, mask, torch.tensor([1.5, 0.0, 0.0]), groups, PACSSettings())


@pytest.mark.parametrize(("override", "field"), [
    ("{name: astar_po, beta2: 0}", "beta2"),
    ("{name: astar_po, beta1: -1}", "beta1"),
    ("{name: astar_po, value_samples: 0}", "value_samples"),
    ("{name: pacs, beta: 0}", "beta"),
    ("{name: pacs, anchor: pi}", "anchor"),
])
def test_settings_are_validated(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [f"algo.policy_loss={override}"])


def test_presets_name_the_papers_settings():
    a = load_config(None, ["preset=astar_po"])
    s = a.algo.policy_loss.settings
    assert (s.beta1, s.beta2, s.value_samples, s.skip_unsolved) == (0.5, 1e-3, 8, True)
    assert (a.rollout.group_size, a.algo.skip_equal_reward_groups) == (1, False)
    p = load_config(None, ["preset=pacs"]).algo.policy_loss.settings
    assert (p.beta, p.anchor, p.balance) == (1.0, "ref", True)
