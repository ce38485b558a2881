"""PPO clip loss, loss aggregation and entropy against hand-computed values."""

import math
from types import SimpleNamespace

import pytest
import torch
from part_calls import policy_loss
from torch.testing import assert_close

from reinforge.algo import LOSS_AGG, POLICY_LOSSES
from reinforge.algo.aggregation import (
    AggNorm,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from reinforge.algo.entropy import entropy_from_logits
from reinforge.algo.policy_losses import ppo_clip_loss

CFG = SimpleNamespace(clip_low=0.2, clip_high=0.28)  # clip range [0.8, 1.28]


def _ppo(ratios, advs, cfg=CFG, requires_grad=False):
    logp = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=requires_grad)
    old = torch.zeros_like(logp)
    adv = torch.tensor(advs, dtype=torch.float64)
    loss, metrics = policy_loss(ppo_clip_loss, logp, old, adv, torch.ones_like(adv), cfg)
    return logp, loss, metrics


# (ratio, advantage, expected per-token loss, expected clip_frac)
PPO_CASES = [
    (1.1, 1.0, -1.1, 0.0),  # A>0, inside
    (1.5, 1.0, -1.28, 1.0),  # A>0, above 1+clip_high -> clipped at 1.28
    (0.5, 1.0, -0.5, 0.0),  # A>0, below 1-clip_low -> unclipped (pessimistic) term
    (1.25, 2.0, -2.5, 0.0),  # A>0, inside only because clip_high=0.28 > 0.25 (clip-higher)
    (0.5, -1.0, 0.8, 1.0),  # A<0, below 1-clip_low -> clipped at 0.8
    (1.5, -1.0, 1.5, 0.0),  # A<0, above 1+clip_high -> unclipped term
    (1.25, -2.0, 2.5, 0.0),  # A<0, inside
    (0.75, -2.0, 1.6, 1.0),  # A<0, 0.75 < 0.8 -> clipped: 2 * 0.8
    (1.0, 0.0, 0.0, 0.0),  # A=0
]


def test_ppo_clip_hand_values_and_clip_frac():
    ratios, advs, losses, fracs = zip(*PPO_CASES, strict=True)
    _, loss, metrics = _ppo(ratios, advs)
    assert_close(loss, torch.tensor(losses, dtype=torch.float64), atol=1e-12, rtol=0)
    assert_close(metrics["clip_frac"], torch.tensor(fracs, dtype=torch.float64))
    assert_close(metrics["ratio"], torch.tensor(ratios, dtype=torch.float64))


def test_ppo_clip_symmetric_vs_asymmetric():
    # ratio 1.25 with A>0: clipped at 1.2 with symmetric eps=0.2, not clipped with clip_high=0.28
    sym = SimpleNamespace(clip_low=0.2, clip_high=0.2)
    _, loss_sym, m_sym = _ppo([1.25], [1.0], cfg=sym)
    _, loss_asym, m_asym = _ppo([1.25], [1.0], cfg=CFG)
    assert_close(loss_sym, torch.tensor([-1.2], dtype=torch.float64))
    assert_close(loss_asym, torch.tensor([-1.25], dtype=torch.float64))
    assert m_sym["clip_frac"].item() == 1.0 and m_asym["clip_frac"].item() == 0.0
    # the lower bound is governed by clip_low only: 0.85 clipped with clip_low=0.1, not with 0.2
    low = SimpleNamespace(clip_low=0.1, clip_high=0.28)
    _, loss_low, _ = _ppo([0.85], [-1.0], cfg=low)
    _, loss_def, _ = _ppo([0.85], [-1.0], cfg=CFG)
    assert_close(loss_low, torch.tensor([0.9], dtype=torch.float64))
    assert_close(loss_def, torch.tensor([0.85], dtype=torch.float64))


def test_ppo_clip_bounds_the_log_ratio_before_exp_as_verl_does():
    """|log rho| = 100 overflows exp in float32 (an infinite loss, the run stopped as diverged); clamped
    to 20, the loss is finite and equals the clipped surrogate at rho = e^20 (A < 0) or 1 + clip_high."""
    logp = torch.tensor([100.0, -100.0, 100.0], requires_grad=True)
    old = torch.zeros(3)
    adv = torch.tensor([-1.0, 1.0, 1.0])
    assert torch.isinf(torch.exp(logp.detach() - old)[0])  # what the bound prevents
    loss, metrics = ppo_clip_loss(logp, old, adv, CFG)
    assert torch.isfinite(loss).all() and torch.isfinite(metrics["approx_kl_old"]).all()
    assert_close(loss, torch.tensor([math.exp(20.0), -math.exp(-20.0), -1.28]), rtol=1e-6, atol=0)
    loss.sum().backward()
    assert torch.equal(logp.grad, torch.zeros(3))  # beyond the bound (and clipped): no gradient


def test_ppo_clip_approx_kl_old():
    # log_ratio = log 2 -> k3 = 1/2 - 1 + log 2; log_ratio = 0 -> 0
    _, _, metrics = _ppo([2.0, 1.0], [1.0, 1.0])
    assert_close(metrics["approx_kl_old"], torch.tensor([0.1931471805599453, 0.0], dtype=torch.float64))


def test_ppo_clip_gradients():
    ratios = [1.5, 1.1, 0.9, 0.5, 1.2, 1.5]
    advs = [2.0, 2.0, -3.0, -3.0, -3.0, -1.0]
    logp, loss, _ = _ppo(ratios, advs, requires_grad=True)
    loss.sum().backward()
    expected = torch.tensor(
        [
            0.0,  # A>0, ratio > 1 + clip_high: no gradient
            -2.0 * 1.1,  # inside: d(-A rho)/d logp = -A rho
            3.0 * 0.9,  # inside, A<0
            0.0,  # A<0, ratio < 1 - clip_low: no gradient
            3.0 * 1.2,  # A<0 inside
            1.5,  # A<0, ratio > 1 + clip_high: unclipped term active, gradient -A rho
        ],
        dtype=torch.float64,
    )
    assert_close(logp.grad, expected, atol=1e-12, rtol=0)


def test_ppo_clip_on_policy_gradient_is_minus_advantage():
    # logp == old_logp: ratio 1 everywhere, gradient -A (the REINFORCE gradient)
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[0.5, -1.5, 2.0]])
    loss, metrics = policy_loss(ppo_clip_loss, logp, logp.detach(), adv, torch.ones_like(adv), CFG)
    loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-0.5, 1.5, -2.0]]))
    assert metrics["clip_frac"].sum().item() == 0.0


def test_ppo_clip_is_registered():
    assert POLICY_LOSSES.get("ppo_clip") is ppo_clip_loss


# ------------------------------------------------------------------ aggregation
V = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
# masked sum 1+2+4+5+6 = 18, 5 tokens, 3 sequences (one empty)


def test_aggnorm_of():
    norm = AggNorm.of(M, 4.0)  # M's third row has no loss token: no sequence of the mean
    assert (norm.num_tokens, norm.num_seqs, norm.max_len) == (5.0, 2.0, 4.0)
    assert AggNorm.of(M, rows=torch.tensor([False, True, True])).num_seqs == 1.0
    empty = AggNorm.of(torch.zeros(2, 3))
    assert (empty.num_tokens, empty.num_seqs, empty.max_len) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("name", "fn", "expected"),
    [
        ("token_mean", token_mean, 18.0 / 5.0),
        ("seq_mean_token_sum", seq_mean_token_sum, 18.0 / 2.0),  # the empty third row is not counted
        ("seq_mean_token_mean", seq_mean_token_mean, (1.5 + 5.0) / 2.0),
        ("seq_mean_token_sum_norm", seq_mean_token_sum_norm, 18.0 / (2.0 * 4.0)),
    ],
)
def test_aggregation_hand_values(name, fn, expected):
    assert LOSS_AGG.get(name) is fn
    out = fn(V, M, AggNorm.of(M, 4.0))
    assert out.dim() == 0
    assert_close(out, torch.tensor(expected), atol=1e-6, rtol=0)


def test_sequence_means_leave_out_rows_without_loss_tokens_as_verl_and_openrlhf_do():
    """A batch with an overlong-filtered row (no loss token): the sequence means equal the peers'
    masked means over the rows that have tokens; counting the empty row would scale the loss down."""
    torch.manual_seed(0)
    values = torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    kept = mask.sum(-1) > 0
    per_seq_sum = (values * mask).sum(-1)
    peer_sum = per_seq_sum[kept].mean()  # verl: masked_mean(seq_losses, seq_mask)
    peer_mean = (per_seq_sum / mask.sum(-1).clamp(min=1))[kept].mean()
    norm = AggNorm.of(mask, 5.0)
    assert_close(seq_mean_token_sum(values, mask, norm), peer_sum)
    assert_close(seq_mean_token_mean(values, mask, norm), peer_mean)
    assert_close(seq_mean_token_sum_norm(values, mask, norm), peer_sum / 5.0)
    assert not torch.isclose(peer_sum, per_seq_sum.mean())  # the old denominator (4 rows) differs


def test_aggregations_differ_on_unequal_lengths():
    # short sequence with large loss vs long sequence with small loss: token_mean weighs tokens,
    # seq_mean_token_mean weighs sequences
    values = torch.tensor([[10.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    norm = AggNorm.of(mask, 8.0)
    assert_close(token_mean(values, mask, norm), torch.tensor(14.0 / 5.0))
    assert_close(seq_mean_token_mean(values, mask, norm), torch.tensor((10.0 + 1.0) / 2.0))
    assert_close(seq_mean_token_sum(values, mask, norm), torch.tensor(14.0 / 2.0))
    assert_close(seq_mean_token_sum_norm(values, mask, norm), torch.tensor(14.0 / 16.0))


MICRO_SPLIT = [[0], [1, 2], [3, 4, 5], [6, 7]]


@pytest.mark.parametrize("name", LOSS_AGG.names())
def test_aggregation_micro_batch_invariance(name):
    agg = LOSS_AGG.get(name)
    g = torch.Generator().manual_seed(0)
    leaf = torch.randn(8, 6, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 3, 0, 1, 5, 2, 4, 6])  # includes an empty row
    mask = (torch.arange(6)[None, :] < lengths[:, None]).to(torch.float64)
    norm = AggNorm.of(mask, 6.0)

    full = agg(leaf * 1.5 - leaf**2, mask, norm)
    (grad_full,) = torch.autograd.grad(full, leaf)

    total = 0.0
    for rows in MICRO_SPLIT:
        idx = torch.tensor(rows)
        total = total + agg((leaf * 1.5 - leaf**2)[idx], mask[idx], norm)
    (grad_split,) = torch.autograd.grad(total, leaf)

    assert abs(full.detach().item()) > 1e-3  # a non-trivial value
    assert_close(total, full, atol=1e-6, rtol=0)
    assert_close(grad_split, grad_full, atol=1e-6, rtol=0)
    assert grad_full[mask == 0].abs().max().item() == 0.0
    assert grad_full[mask == 1].abs().max().item() > 0.0


@pytest.mark.parametrize("name", LOSS_AGG.names())
def test_aggregation_micro_batch_invariance_through_ppo(name):
    # the learner's path: per-token PPO loss of each micro-batch, aggregated with the mini-batch norm
    agg = LOSS_AGG.get(name)
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(8, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(8, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(8, 1, generator=g, dtype=torch.float64).expand(8, 5)
    mask = (torch.rand(8, 5, generator=g) > 0.3).to(torch.float64)
    mask[2] = 0.0
    norm = AggNorm.of(mask, 5.0)

    full = agg(policy_loss(ppo_clip_loss, logp, old, adv, mask, CFG)[0], mask, norm)
    (grad_full,) = torch.autograd.grad(full, logp)
    total = 0.0
    for rows in MICRO_SPLIT:
        idx = torch.tensor(rows)
        part_loss = policy_loss(ppo_clip_loss, logp[idx], old[idx], adv[idx], mask[idx], CFG)[0]
        total = total + agg(part_loss, mask[idx], norm)
    (grad_split,) = torch.autograd.grad(total, logp)
    assert_close(total, full, atol=1e-6, rtol=0)
    assert_close(grad_split, grad_full, atol=1e-6, rtol=0)


# ------------------------------------------------------------------ entropy
def test_entropy_uniform_is_log_vocab():
    h = entropy_from_logits(torch.zeros(2, 3, 4))
    assert h.shape == (2, 3)
    assert_close(h, torch.full((2, 3), math.log(4.0)))
    # invariant to a constant shift of the logits
    assert_close(entropy_from_logits(torch.full((1, 4), 7.5)), torch.tensor([math.log(4.0)]))


def test_entropy_hand_values():
    logits = torch.tensor(
        [
            [math.log(0.5), math.log(0.25), math.log(0.25)],  # 0.5 log 2 + 2 * 0.25 log 4 = 1.5 log 2
            [100.0, 0.0, 0.0],  # (almost) deterministic
        ]
    )
    h = entropy_from_logits(logits)
    assert_close(h, torch.tensor([1.5 * math.log(2.0), 0.0]), atol=1e-5, rtol=0)
    assert h.dtype == torch.float32
    assert_close(entropy_from_logits(logits.to(torch.bfloat16)).float(), h, atol=2e-2, rtol=0)
