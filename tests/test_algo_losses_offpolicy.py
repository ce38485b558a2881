"""Off-policy losses with a batch statistic (BAPO's adaptive clip bounds, M2PO's second-moment mask)
against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.policy_losses import (
    BAPOSettings,
    M2POSettings,
    bapo_bounds,
    bapo_candidates,
    bapo_loss,
    m2po_loss,
    m2po_mask,
)
from reinforge.config import load_config
from reinforge.errors import ConfigError

# BAPO with short ranges: c_high 1.2 -> 1.4 by 0.1 (c_low 0.6), then c_low 0.6 -> 0.8 by 0.1 (c_high 1.4):
# candidates (0.6, 1.2), (0.6, 1.3), (0.6, 1.4), (0.7, 1.4), (0.8, 1.4).
SHORT = {"clip_low_start": 0.6, "clip_low_max": 0.8, "clip_low_step": 0.1,
         "clip_high_start": 1.2, "clip_high_max": 1.4, "clip_high_step": 0.1}
# tokens: P1 rho 1.5 A +1 q 1; P2 rho 1.35 A +1 q 1; N1 rho 0.5 A -1 q 1; N2 rho 1 A -4 q 0.5; X masked out, A +10.
RATIO = torch.tensor([[1.5, 1.35, 0.5, 1.0, 1.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -4.0, 10.0]])
OLD = torch.log(torch.tensor([[1.0, 1.0, 1.0, 0.5, 1.0]]))
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
# Each token counts q |A| x (A > 0: min(rho, c_high); A < 0: max(rho, c_low)):
# positive P = min(1.5, c_high) + min(1.35, c_high): 2.4, 2.6, 2.75, 2.75, 2.75
# negative N = max(0.5, c_low) + 0.5 * 4 * max(1, c_low): 2.6, 2.6, 2.6, 2.7, 2.8
# share P / (P + N): 0.48, 0.5, 0.514, 0.5046, 0.4955


def test_bapo_candidates_raise_the_upper_bound_first():
    lows, highs = bapo_candidates(BAPOSettings(**SHORT))
    assert_close(lows, torch.tensor([0.6, 0.6, 0.6, 0.7, 0.8], dtype=torch.float64))
    assert_close(highs, torch.tensor([1.2, 1.3, 1.4, 1.4, 1.4], dtype=torch.float64))
    lows, highs = bapo_candidates(BAPOSettings())  # the paper's: 36 steps of c_high, then 15 of c_low
    assert len(lows) == 37 + 15 and float(highs[36]) == 3.0 and float(lows[-1]) == 0.9


@pytest.mark.parametrize(("target", "bounds", "share"), [
    (0.40, (0.6, 1.2), 2.4 / 5.0),    # the start already reaches it
    (0.49, (0.6, 1.3), 2.6 / 5.2),    # one step of c_high
    (0.51, (0.6, 1.4), 2.75 / 5.35),  # c_high at its maximum lets P2 (rho 1.35) in
    (0.60, (0.8, 1.4), 2.75 / 5.55),  # never reached: both bounds at their maxima
])
def test_bapo_bounds_are_the_first_pair_reaching_the_target(target, bounds, share):
    c_low, c_high, got = bapo_bounds(RATIO, OLD, ADV, MASK, BAPOSettings(pos_share=target, **SHORT))
    assert (round(c_low, 6), round(c_high, 6)) == bounds
    assert math.isclose(got, share, rel_tol=1e-6)  # rho in float32


def test_bapo_statistic_is_over_the_masked_tokens_only():
    # counting X (A = +10, off the mask) would make the share 12.4 / 15 at the start: no step needed
    c_low, c_high, _ = bapo_bounds(RATIO, OLD, ADV, torch.ones_like(MASK), BAPOSettings(pos_share=0.6, **SHORT))
    assert (round(c_low, 6), round(c_high, 6)) == (0.6, 1.2)


def test_bapo_values_and_gradients_follow_the_chosen_bounds():
    # target 0.49 -> [0.6, 1.3]: P1, P2 above 1.3: -1.3 each, no gradient; N1 below 0.6: 0.6, none;
    # N2 rho 1: -rho A = 4, gradient 4 (X: rho 1, A 10: -10, gradient -10, aggregated away by the mask).
    # target 0.51 -> [0.6, 1.4]: P2 inside: -1.35, gradient -1.35.
    logp = (OLD + torch.log(RATIO)).requires_grad_(True)
    loss, metrics = bapo_loss(logp, OLD, ADV, MASK, BAPOSettings(pos_share=0.49, **SHORT))
    assert_close(loss, torch.tensor([[-1.3, -1.3, 0.6, 4.0, -10.0]]))
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert_close(grad, torch.tensor([[0.0, 0.0, 0.0, 4.0, -10.0]]))
    assert metrics["clip_frac"].tolist() == [[1.0, 1.0, 1.0, 0.0, 0.0]]
    assert_close(metrics["bapo_clip_high"], torch.full((1, 5), 1.3))
    loss, _ = bapo_loss(logp, OLD, ADV, MASK, BAPOSettings(pos_share=0.51, **SHORT))
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert_close(loss[0, 1], torch.tensor(-1.35))
    assert_close(grad[0, 1], torch.tensor(-1.35))


def test_bapo_on_policy_batch_is_ppo():
    """rho = 1 everywhere (the first mini-batch): whatever bounds are chosen, the loss is -A."""
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, _ = bapo_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), BAPOSettings())
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert_close(loss, -adv)
    assert_close(grad, -adv)


@pytest.mark.parametrize(("override", "field"), [
    ("{name: bapo, clip_high_max: 1.1}", "clip_high_max"),
    ("{name: bapo, clip_low_start: 0.95}", "clip_low_max"),
    ("{name: bapo, pos_share: 1.5}", "pos_share"),
    ("{name: bapo, clip_high_step: 0}", "clip_high_step"),
    ("{name: m2po, m2_threshold: 0}", "m2_threshold"),
])
def test_settings_are_validated(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [f"algo.policy_loss={override}"])


def test_settings_load():
    cfg = load_config(None, ["algo.policy_loss={name: bapo, pos_share: 0.5}"]).algo.policy_loss.settings
    assert (cfg.pos_share, cfg.clip_high_max, cfg.clip_low_step) == (0.5, 3.0, 0.02)
    assert load_config(None, ["algo.policy_loss=m2po"]).algo.policy_loss.settings.m2_threshold == 0.04


# M2PO tokens (log rho, A): T1 (0.5, +1), T2 (-0.3, -1), T3 (0.1, +1) are in the trust region (A > 0 and
# rho > 1, or A < 0 and rho < 1); T4 (0.6, -1), T5 (-0.2, +1), T6 (0, +1) are not; T7 (1.0, +1) is off the mask.
# Trust (log rho)^2: 0.25, 0.09, 0.01, mean 0.1167 > 0.04: drop T1 -> mean(0.09, 0.01) = 0.05 > 0.04:
# drop T2 -> 0.01 <= 0.04: stop. With tau 0.051 only T1 is dropped; with tau 0.2 none.
LOG_RATIO = torch.tensor([[0.5, -0.3, 0.1, 0.6, -0.2, 0.0, 1.0]])
M2_ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, 1.0, 1.0]])
M2_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])


@pytest.mark.parametrize(("tau", "dropped"), [(0.04, [0, 1]), (0.051, [0]), (0.2, []), (0.005, [0, 1, 2])])
def test_m2po_mask_drops_the_largest_second_moments(tau, dropped):
    keep = m2po_mask(LOG_RATIO, M2_ADV, M2_MASK, tau)
    assert torch.nonzero(~keep[0]).flatten().tolist() == dropped


def test_m2po_values_and_gradients():
    # kept tokens: the unclipped surrogate -rho A, gradient -rho A (no epsilon clip: T4 with rho e^0.6 keeps it)
    logp = LOG_RATIO.clone().requires_grad_(True)
    loss, metrics = m2po_loss(logp, torch.zeros(1, 7), M2_ADV, M2_MASK, M2POSettings())
    rho = torch.exp(LOG_RATIO)
    expected = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]]) * -rho * M2_ADV
    assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert_close(grad, expected)
    assert metrics["clip_frac"].tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    assert_close(metrics["m2"], LOG_RATIO ** 2)


def test_m2po_keeps_every_token_on_policy():
    adv = torch.tensor([[1.0, -1.0]])
    keep = m2po_mask(torch.zeros(1, 2), adv, torch.ones(1, 2), 0.04)
    assert keep.all()
