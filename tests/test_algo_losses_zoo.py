"""GSPO, CISPO and REINFORCE policy losses: hand-computed values and the gradients that define them."""

import math
from types import SimpleNamespace

import torch
from part_calls import policy_loss

from reinforge.algo.aggregation import LOSS_AGG, AggNorm
from reinforge.algo.policy_losses import POLICY_LOSSES

LOG = math.log


def _cfg(**kw):
    return SimpleNamespace(**{"clip_low": 0.2, "clip_high": 0.2, "tis_cap": 0.0, **kw})


def test_gspo_sequence_ratio_value_and_clip():
    # seq 0: token log-ratios log(1.1), log(1.0) -> mean -> s = sqrt(1.1) = 1.0488 (inside 0.8..1.2)
    # seq 1: token log-ratios log(2.0), log(2.0), third token masked -> s = 2.0 (clipped at 1.2 for A > 0)
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LOG(1.1), 0.0, 0.0], [LOG(2.0), LOG(2.0), 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    loss, m = policy_loss("gspo", logp, old, adv, mask, _cfg())
    s0 = math.sqrt(1.1)
    torch.testing.assert_close(loss[0, :2], torch.tensor([-s0, -s0]))
    torch.testing.assert_close(loss[1, :2], torch.tensor([-1.2, -1.2]))
    assert m["clip_frac"][1, :2].tolist() == [1.0, 1.0] and m["clip_frac"][0, :2].tolist() == [0.0, 0.0]
    torch.testing.assert_close(m["ratio"][1, 0], torch.tensor(2.0))


def test_gspo_token_form_gradient_equals_sequence_objective():
    """With seq_mean_token_mean, grad of GSPO-token == grad of -(1/G) sum_i s_i A_i (unclipped regime)."""
    torch.manual_seed(0)
    old = torch.randn(3, 4) * 0.01
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    a = torch.tensor([0.5, -1.0, 2.0])
    logp = (old + torch.randn(3, 4) * 0.01).requires_grad_(True)
    loss, _ = policy_loss("gspo", logp, old, a[:, None] * mask, mask, _cfg(clip_low=0.5, clip_high=0.5))
    LOSS_AGG.get("seq_mean_token_mean")(loss, mask, AggNorm.of(mask)).backward()
    g_token = logp.grad.clone()
    logp.grad = None
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    (-(s * a).mean()).backward()
    torch.testing.assert_close(g_token * mask, logp.grad * mask)


def test_cispo_values_and_gradient_reaches_clipped_tokens():
    # ratios 1.0, 1.5 (clipped to 1.2), 0.5 (clipped to 0.8); A = 2, -1, 1
    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.0, LOG(1.5), LOG(0.5)]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, m = policy_loss("cispo", logp, old, adv, mask, _cfg())
    expected = torch.tensor([[-1.0 * 2.0 * 0.0, 1.2 * LOG(1.5), -0.8 * 1.0 * LOG(0.5)]])
    torch.testing.assert_close(loss.detach(), expected)
    assert m["clip_frac"].tolist() == [[0.0, 1.0, 1.0]]
    loss.sum().backward()
    # d/dlogp = -w * A for every token, clipped or not
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, 1.2, -0.8]]))


def test_ppo_clip_drops_gradient_where_cispo_keeps_it():
    old = torch.zeros(1, 1)
    adv = torch.ones(1, 1)
    mask = torch.ones(1, 1)
    grads = {}
    for name in ("ppo_clip", "cispo"):
        logp = torch.full((1, 1), LOG(1.5), requires_grad=True)  # ratio 1.5 > 1 + 0.2 with A > 0
        policy_loss(name, logp, old, adv, mask, _cfg())[0].sum().backward()
        grads[name] = logp.grad.item()
    assert grads["ppo_clip"] == 0.0
    assert abs(grads["cispo"] - (-1.2)) < 1e-6


def test_reinforce_plain_and_truncated_is():
    old = torch.tensor([[0.0, 0.0]])
    logp = torch.tensor([[LOG(3.0), LOG(0.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    loss, m = policy_loss("reinforce", logp, old, adv, mask, _cfg())
    torch.testing.assert_close(loss.detach(), torch.tensor([[-LOG(3.0), 2.0 * LOG(0.5)]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 2.0]]))
    assert m["clip_frac"].sum() == 0
    logp.grad = None
    loss, m = policy_loss("reinforce", logp, old, adv, mask, _cfg(tis_cap=2.0))
    loss.sum().backward()
    # weights min(3, 2) = 2 and min(0.5, 2) = 0.5
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, 1.0]]))
    assert m["clip_frac"].tolist() == [[1.0, 0.0]]


def test_new_losses_are_registered_with_formula_and_paper():
    for name in ("gspo", "cispo", "reinforce"):
        entry = next(e for e in POLICY_LOSSES.entries() if e.name == name)
        assert entry.formula and entry.paper and entry.fn.__doc__
