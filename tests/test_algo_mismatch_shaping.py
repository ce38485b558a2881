"""Rollout/training mismatch correction and DAPO soft overlong punishment against hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo import MISMATCH_MODES, mismatch_correction, soft_overlong_penalty

L = math.log
# d = learner_logp - sampling_logp (sampling_logp = 0 below), so the token ratio is exp(d). cap C = 2.
# row 0: ratios 3, 0.5, 1 (+ a padding position with a huge d that must be ignored)
# row 1: ratios 0.25, 0.5
# row 2: zero-length
# row 3: one token with ratio exactly C = 2 (boundary)
# row 4: ratios 2, 2, 0.5, 3
# row 5: ratios 4, 4
D = torch.tensor(
    [
        [L(3.0), L(0.5), 0.0, 50.0],
        [L(0.25), L(0.5), 0.0, 0.0],
        [1.0, -1.0, 2.0, 3.0],
        [L(2.0), 0.0, 0.0, 0.0],
        [L(2.0), L(2.0), L(0.5), L(3.0)],
        [L(4.0), L(4.0), 0.0, 0.0],
    ],
    dtype=torch.float64,
)
MASK = torch.tensor(
    [
        [1.0, 1.0, 1.0, 0.0],
        [1.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 1.0],
        [1.0, 1.0, 0.0, 0.0],
    ],
    dtype=torch.float64,
)


def _run(mode: str, cap: float = 2.0):
    return mismatch_correction(D, torch.zeros_like(D), MASK, mode, cap)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_none_mode_weights_one_on_masked_tokens():
    w, m = _run("none")
    assert_close(w, MASK)
    assert m["is_corrected"].sum().item() == 0.0
    assert_close(m["is_weight"], w)


def test_token_tis_hand_values():
    # w = min(ratio, 2); corrected where ratio > 2 (ratio exactly 2 is not truncated)
    w, m = _run("token_tis")
    assert_close(w, _t([[2, 0.5, 1, 0], [0.25, 0.5, 0, 0], [0, 0, 0, 0], [2, 0, 0, 0], [2, 2, 0.5, 2], [2, 2, 0, 0]]))
    assert_close(
        m["is_corrected"],
        _t([[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [1, 1, 0, 0]]),
    )


def test_seq_tis_hand_values():
    # sequence ratio = product of token ratios: row 0: 3 * 0.5 * 1 = 1.5; row 1: 0.125; row 3: 2;
    # row 4: 2 * 2 * 0.5 * 3 = 6 -> 2 (corrected); row 5: 16 -> 2 (corrected)
    w, m = _run("seq_tis")
    assert_close(
        w, _t([[1.5, 1.5, 1.5, 0], [0.125, 0.125, 0, 0], [0, 0, 0, 0], [2, 0, 0, 0], [2, 2, 2, 2], [2, 2, 0, 0]])
    )
    assert_close(
        m["is_corrected"],
        _t([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]),
    )


def test_token_mask_hand_values_inclusive_bounds():
    # keep iff 0.5 <= ratio <= 2 (both bounds inclusive)
    w, m = _run("token_mask")
    keep = _t([[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    assert_close(w, keep)
    assert_close(m["is_corrected"], (1 - keep) * MASK)


def test_seq_mask_hand_values_geometric_mean():
    # geometric-mean ratio: row 0: 1.5^(1/3) = 1.145 keep; row 1: 0.125^(1/2) = 0.354 < 0.5 reject;
    # row 3: 2 (boundary) keep; row 4: 6^(1/4) = 1.565 keep; row 5: 16^(1/2) = 4 > 2 reject
    w, m = _run("seq_mask")
    keep_rows = _t([1, 0, 0, 1, 1, 0])[:, None]
    assert_close(w, keep_rows * MASK)
    reject = _t([0, 1, 0, 0, 0, 1])[:, None] * MASK
    assert_close(m["is_corrected"], reject)


@pytest.mark.parametrize("mode", MISMATCH_MODES)
def test_mismatch_k3_hand_values_same_in_every_mode(mode):
    # k3 = r - 1 - log r per masked token (r = exp(d)); e.g. r = 3: 2 - log 3; r = 0.5: log 2 - 0.5
    _, m = _run(mode)
    r = torch.exp(D)
    expected = (r - 1 - D) * MASK
    expected[0, 3] = 0.0  # masked out (avoid inf - inf arithmetic in the expectation)
    assert_close(m["mismatch_k3"], expected, atol=1e-12, rtol=0)
    assert_close(m["mismatch_k3"][0, :2], _t([2.0 - L(3.0), L(2.0) - 0.5]))
    assert (m["mismatch_k3"] >= 0).all()


@pytest.mark.parametrize("mode", MISMATCH_MODES)
def test_masked_positions_and_zero_length_rows_are_zero(mode):
    w, m = _run(mode)
    for t in (w, *m.values()):
        assert t.shape == MASK.shape and torch.isfinite(t).all()
        assert (t[MASK == 0] == 0).all()
        assert (t[2] == 0).all()
    assert set(m) == {"is_weight", "is_corrected", "mismatch_k3"}


def test_mismatch_k3_estimates_kl_sampler_to_learner():
    # tokens drawn from the sampler q; learner p. KL(q || p) = sum q log(q / p)
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact = float((q * (q / p).log()).sum())  # 0.3 log 2.5 = 0.27488...
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(q, 20000, replacement=True, generator=g)[None, :]
    _, m = mismatch_correction(p.log()[x], q.log()[x], torch.ones_like(x, dtype=torch.float64), "none", 2.0)
    assert abs(m["mismatch_k3"].mean().item() - exact) < 0.02


def test_weights_detached_dtype_and_extreme_values_finite():
    learner = torch.tensor([[100.0, -100.0, 0.0]], requires_grad=True)
    sampler = torch.zeros(1, 3)
    for mode in MISMATCH_MODES:
        w, m = mismatch_correction(learner, sampler, torch.ones(1, 3), mode, 3.0)
        assert not w.requires_grad and w.dtype == torch.float32
        assert all(torch.isfinite(t).all() for t in (w, *m.values()))
    w, _ = mismatch_correction(learner, sampler, torch.ones(1, 3), "token_tis", 3.0)
    # d clamped to [-20, 20]: min(e^20, 3) = 3, e^-20, 1
    assert_close(w, torch.tensor([[3.0, math.exp(-20.0), 1.0]]))


def test_unknown_mode_and_bad_cap():
    with pytest.raises(ValueError) as info:
        _run("bogus")
    for name in MISMATCH_MODES:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="cap"):
        _run("token_tis", 1.0)
    w, _ = _run("none", 0.5)  # the cap is unused without correction
    assert_close(w, MASK)


# ----------------------------------------------------------------------------- soft overlong punishment


def test_soft_overlong_penalty_boundaries():
    # max_len 10, buffer 4: free up to 6, then (6 - L) / 4, -1 beyond 10
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10, 11, 50])
    out = soft_overlong_penalty(lengths, 10, 4)
    assert_close(out, torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]))
    assert out.dtype == torch.get_default_dtype()


def test_soft_overlong_penalty_factor_and_float_lengths():
    out = soft_overlong_penalty(torch.tensor([6.0, 8.0, 10.0, 12.0], dtype=torch.float64), 10, 4, factor=0.5)
    assert_close(out, torch.tensor([0.0, -0.25, -0.5, -0.5], dtype=torch.float64))


def test_soft_overlong_penalty_buffer_zero_and_full_buffer():
    assert torch.count_nonzero(soft_overlong_penalty(torch.tensor([1, 10, 11]), 10, 0)).item() == 0
    # buffer = max_len: the ramp starts at 0: L = 5 of 10 -> -0.5
    assert_close(soft_overlong_penalty(torch.tensor([0, 5, 10]), 10, 10), torch.tensor([0.0, -0.5, -1.0]))
    with pytest.raises(ValueError):
        soft_overlong_penalty(torch.tensor([1]), 10, -1)
