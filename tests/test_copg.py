"""CoPG's contrastive sequence loss over the pairs of each group, against hand-computed values."""

import pytest
import torch
from part_calls import call
from torch.testing import assert_close

from reinforge.algo import POLICY_LOSSES
from reinforge.algo.copg import copg_loss

# g0 = rows 0-2 (rewards 1, 0, 0), g1 = row 3 alone. Sequence log-ratios S = sum_t (log pi - log pi_ref):
# row 0: 0.2 + 0.3 = 0.5 | row 1: -1.0 (its second token unmasked) | row 2: 0 | row 3: 0.4
REF = torch.full((4, 2), -2.0)
DELTA = torch.tensor([[0.2, 0.3], [-1.0, 7.0], [0.0, 0.0], [0.4, 0.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 1])


def _copg(cfg: dict, delta: torch.Tensor = DELTA, mask: torch.Tensor = MASK, rewards=REWARDS, groups=GROUPS):
    logp = (REF[: len(delta)] + delta).requires_grad_(True)
    loss, metrics = call(POLICY_LOSSES, copg_loss, cfg, logp=logp, ref_logp=REF[: len(delta)], mask=mask,
                         rewards=rewards, group_index=groups)
    loss.sum().backward()
    return loss, metrics, logp.grad


def test_copg_registered():
    entry = POLICY_LOSSES.entry("copg")
    assert "2406.19185" in entry.paper and {"ref_logp", "whole_groups"} <= set(entry.needs)


def test_copg_values_and_gradients():
    # beta 0.1: R_beta = r - 0.1 S = [0.95, 0.1, 0.0, 0.96]
    # g0 gaps: (0,1) 0.85, (0,2) 0.95, (1,2) 0.1; l_g0 = (0.7225 + 0.9025 + 0.01) / 2 = 0.8175
    # rows carry k/(2(k-1)) = 3/4 of their pairs' squares: v0 = 0.75 * 1.625 = 1.21875,
    # v1 = 0.75 * 0.7325 = 0.549375, v2 = 0.75 * 0.9125 = 0.684375 (sum 2.4525 = 3 l_g0); row 3 alone: 0
    loss, metrics, grad = _copg({"beta": 0.1})
    per_row = loss.sum(-1)
    assert_close(per_row, torch.tensor([1.21875, 0.549375, 0.684375, 0.0]), atol=1e-6, rtol=0)
    assert loss[0, 0].item() == pytest.approx(1.21875 / 2, abs=1e-6)  # spread over the row's 2 tokens
    assert loss[1, 1].item() == 0.0
    # d(3 l_g0)/dS_0 = 3 * (1/2) * (2 * 0.85 + 2 * 0.95) * (-0.1) = -0.54, on each of row 0's tokens
    # d/dS_1 = 1.5 * (2 * (-0.85) + 2 * 0.1) * (-0.1) = 0.225; d/dS_2 = 1.5 * (2 * (-0.95) + 2 * (-0.1)) * (-0.1) = 0.315
    assert_close(grad, torch.tensor([[-0.54, -0.54], [0.225, 0.0], [0.315, 0.315], [0.0, 0.0]]),
                 atol=1e-6, rtol=0)
    gap, rows = metrics["copg/gap"]
    assert gap[0, 0].item() == pytest.approx(0.9, abs=1e-6) and rows[3, 0].item() == 0.0


def test_copg_normalised_is_leave_one_out():
    # / (2 beta): row 0's gradient = -k (R_beta(0) - mean(R_beta(1), R_beta(2))) = -3 * (0.95 - 0.05) = -2.7
    _, _, grad = _copg({"beta": 0.1, "normalise": True})
    assert grad[0, 0].item() == pytest.approx(-2.7, abs=1e-5)
    assert grad[1, 0].item() == pytest.approx(0.225 / 0.2, abs=1e-5)


def test_copg_mean_over_groups_with_seq_mean_token_sum():
    # two groups of 2, no policy change (S = 0): l_g = gap^2: g0 (1 - 0)^2 = 1, g1 (0.5 - 0.5)^2 = 0
    # rows carry 2/2 * gap^2: [1, 1, 0, 0]; sum over tokens, mean over 4 rows = 0.5 = mean_g l_g
    mask = torch.ones(4, 2)
    loss, _, _ = _copg({"beta": 0.1}, delta=torch.zeros(4, 2), mask=mask,
                       rewards=torch.tensor([1.0, 0.0, 0.5, 0.5]), groups=torch.tensor([0, 0, 1, 1]))
    assert loss.sum(-1).mean().item() == pytest.approx(0.5)
