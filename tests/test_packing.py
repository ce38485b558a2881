"""Sequence packing: packed and unpacked forwards give the same log-probs, entropies, gradients and loss."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_all_exact, assert_exact, float64_model

from reinforge.learn.logprobs import token_logprobs
from reinforge.learn.packing import packed_token_logprobs, plan_packing
from reinforge.models.loading import load_model


def test_plan_is_first_fit_decreasing_within_budget():
    lengths = [5, 9, 3, 7, 2, 12]
    rows = plan_packing(lengths, 12)
    assert sorted(i for row in rows for i in row) == list(range(6))
    assert all(sum(lengths[i] for i in row) <= 12 for row in rows)
    assert rows == [[5], [1, 2], [3, 0], [4]]  # 12 | 9+3 | 7+5 | 2
    assert plan_packing([20, 1], 8) == [[0], [1]]  # longer than the budget: alone


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 12, 3, 9, 12, 5]
    ids = torch.zeros(len(lengths), 12, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, k in enumerate(lengths):
        ids[i, 0] = 1  # <bos>
        ids[i, 1:k] = torch.randint(4, 18, (k - 1,), generator=g)
        attn[i, :k] = 1
    return ids, attn


@pytest.mark.numerics
def test_packed_equals_unpacked_logprobs_entropy_and_gradients():
    """Mathematically equal paths: compared in float64 (tests/numerics.py)."""
    model = float64_model(load_model("tiny-base"))
    ids, attn = _batch()
    mask = attn.clone().double()
    mask[:, 0] = 0
    ref_lp, ref_ent = token_logprobs(model, ids, attn, temperature=0.7, entropy=True, entropy_grad=True)
    (ref_lp * mask).sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    lp, ent = packed_token_logprobs(model, ids, attn, budget_tokens=24, temperature=0.7, entropy=True,
                                    entropy_grad=True)
    (lp * mask).sum().backward()
    assert_exact(lp * attn, ref_lp * attn)
    assert_exact(ent * attn, ref_ent * attn)
    assert_all_exact([p.grad for p in model.parameters()], ref_grads)


def test_packing_saves_padded_tokens():
    ids, attn = _batch()  # 48 real tokens in 6 x 12 = 72 padded
    rows = plan_packing(attn.sum(-1).tolist(), 24)
    assert rows == [[1, 4], [3, 0, 5, 2]]  # 12+12 | 9+7+5+3: 2 x 24 = 48 tokens computed, no padding
