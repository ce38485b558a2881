"""pass@k, token sampling (temperature, top-k, top-p, greedy) and micro-batching."""

import math

import pytest
import torch
from torch.testing import assert_close

from reinforge.eval.passk import mean_pass_at_k, pass_at_k
from reinforge.learn.learner import micro_batches
from reinforge.rollout.sampling import restrict_logits, sample_tokens


# ------------------------------------------------------------------ pass@k
def _closed_form(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [
        (10, 3, 1),
        (10, 3, 2),
        (10, 3, 5),
        (10, 3, 7),
        (20, 7, 4),
        (5, 2, 3),
        (100, 1, 10),
        (64, 5, 16),
        (16, 15, 1),
    ],
)
def test_pass_at_k_matches_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_closed_form(n, c, k), abs=1e-12)


def test_pass_at_k_hand_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6


def test_pass_at_k_edges():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 10, 10) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3
    assert pass_at_k(8, 1, 8) == 1.0  # k = n with one correct
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 1, 0), (4, 5, 2), (4, -1, 2)])
def test_pass_at_k_errors(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    # pass@2 with n=4: c=0 -> 0, c=1 -> 1/2, c=2 -> 1 - 1/6 = 5/6
    assert mean_pass_at_k([0, 1, 2], 4, 2) == pytest.approx((0.0 + 0.5 + 5.0 / 6.0) / 3.0)
    assert mean_pass_at_k([4, 4], 4, 1) == pytest.approx(1.0)
    assert mean_pass_at_k([1, 3], 4, 1) == pytest.approx(0.5)


# ------------------------------------------------------------------ restrict_logits
def _kept(logits: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(torch.isfinite(row)).flatten().tolist() for row in logits]


# probabilities 0.15, 0.5, 0.05, 0.3 (sorted: 0.5 @1, 0.3 @3, 0.15 @0, 0.05 @2)
P = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
LOGITS = P.log()


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0], [0.0, 5.0, 4.0, -2.0, 1.0]])
    out = restrict_logits(logits, top_k=2, top_p=1.0)
    assert _kept(out) == [[0, 4], [1, 2]]
    assert_close(out[0, [0, 4]], torch.tensor([2.0, 3.0]))  # survivors are unchanged
    assert _kept(restrict_logits(logits, top_k=1, top_p=1.0)) == [[4], [1]]


def test_top_k_disabled():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    assert torch.equal(restrict_logits(logits, top_k=0, top_p=1.0), logits)
    assert torch.equal(restrict_logits(logits, top_k=3, top_p=1.0), logits)
    assert torch.equal(restrict_logits(logits, top_k=10, top_p=1.0), logits)


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.4, [1]),  # mass before the 2nd token is 0.5 >= 0.4
        (0.7, [1, 3]),  # mass before: 0, 0.5, 0.8, 0.95
        (0.85, [0, 1, 3]),
        (0.99, [0, 1, 2, 3]),
        (1e-6, [1]),  # the top token always survives
    ],
)
def test_top_p_nucleus(top_p, kept):
    assert _kept(restrict_logits(LOGITS, top_k=0, top_p=top_p)) == [kept]


def test_top_p_per_row():
    logits = torch.cat([LOGITS, P.flip(-1).log()])  # second row: 0.3, 0.05, 0.5, 0.15
    assert _kept(restrict_logits(logits, top_k=0, top_p=0.7)) == [[1, 3], [0, 2]]


def test_top_k_then_top_p_on_renormalised_mass():
    # top_p alone at 0.82 keeps three tokens (mass before the 3rd is 0.8); after top_k=3 the
    # renormalised masses are 0.526, 0.316, 0.158 and the mass before the 3rd is 0.842 >= 0.82
    assert _kept(restrict_logits(LOGITS, top_k=0, top_p=0.82)) == [[0, 1, 3]]
    assert _kept(restrict_logits(LOGITS, top_k=3, top_p=0.82)) == [[1, 3]]


# ------------------------------------------------------------------ sample_tokens
def test_greedy_returns_argmax_with_t1_logprob():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, -1.0, 0.5]])
    tokens, logp = sample_tokens(logits, temperature=0.5, top_k=0, top_p=1.0, greedy=True, generator=None)
    assert tokens.tolist() == [2, 0]
    assert tokens.dtype == torch.long
    # log_softmax([0, 1, 2])[2] = 2 - log(1 + e + e^2)
    assert_close(logp[0], torch.tensor(2.0 - math.log(1 + math.e + math.e**2)))
    assert_close(logp, torch.log_softmax(logits, -1)[[0, 1], [2, 0]])


def test_temperature_logprob_is_log_softmax_of_scaled_logits():
    # T = 2: log_softmax([0, 0.5, 1]) = [-1.68027, -1.18027, -0.68027]
    table = torch.tensor([-1.6802696706417346, -1.1802696706417346, -0.6802696706417346])
    logits = torch.tensor([[0.0, 1.0, 2.0]]).repeat(64, 1)
    g = torch.Generator().manual_seed(0)
    tokens, logp = sample_tokens(logits, temperature=2.0, top_k=0, top_p=1.0, greedy=False, generator=g)
    assert set(tokens.tolist()) == {0, 1, 2}  # 64 draws hit every token (P(miss) ~ 1e-7)
    assert_close(logp, table[tokens])


def test_empirical_frequencies_follow_tempered_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0]]).repeat(4000, 1)
    g = torch.Generator().manual_seed(1)
    tokens, _ = sample_tokens(logits, temperature=2.0, top_k=0, top_p=1.0, greedy=False, generator=g)
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    expected = torch.tensor([-1.6802696706417346, -1.1802696706417346, -0.6802696706417346]).exp()
    assert_close(freq, expected, atol=0.03, rtol=0)


def test_top_k_one_always_returns_argmax():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(32, 7, generator=g)
    tokens, logp = sample_tokens(logits, temperature=1.5, top_k=1, top_p=1.0, greedy=False, generator=g)
    assert torch.equal(tokens, logits.argmax(-1))
    # the reported log-prob is under softmax(logits / T), not the restricted distribution
    assert_close(logp, torch.log_softmax(logits / 1.5, -1).gather(-1, tokens[:, None]).squeeze(-1))
    assert (logp < 0).all()


def test_top_k_and_top_p_restrict_samples():
    logits = LOGITS.repeat(500, 1)
    g = torch.Generator().manual_seed(3)
    tokens, _ = sample_tokens(logits, temperature=1.0, top_k=2, top_p=1.0, greedy=False, generator=g)
    assert set(tokens.tolist()) == {1, 3}
    tokens, _ = sample_tokens(logits, temperature=1.0, top_k=0, top_p=0.4, greedy=False, generator=g)
    assert set(tokens.tolist()) == {1}


def test_seeded_generator_reproducible():
    logits = torch.randn(50, 11, generator=torch.Generator().manual_seed(4))
    a, la = sample_tokens(logits, 1.0, 0, 0.95, False, torch.Generator().manual_seed(7))
    b, lb = sample_tokens(logits, 1.0, 0, 0.95, False, torch.Generator().manual_seed(7))
    c, _ = sample_tokens(logits, 1.0, 0, 0.95, False, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, c)


# ------------------------------------------------------------------ micro_batches
def test_micro_batches_hand_example():
    lengths = torch.tensor([3, 5, 2, 8, 1, 1, 20, 4])
    assert list(micro_batches(lengths, 10)) == [[0, 1], [2], [3], [4, 5], [6], [7]]


def test_micro_batches_budget_exactly_met():
    assert list(micro_batches(torch.tensor([5, 5, 5, 5]), 10)) == [[0, 1], [2, 3]]
    assert list(micro_batches(torch.tensor([2, 2, 2, 2, 2]), 10)) == [[0, 1, 2, 3, 4]]
    assert list(micro_batches(torch.tensor([2, 2, 2, 2, 2, 2]), 10)) == [[0, 1, 2, 3, 4], [5]]


def test_micro_batches_edge_cases():
    assert list(micro_batches(torch.tensor([], dtype=torch.long), 10)) == []
    assert list(micro_batches(torch.tensor([50]), 10)) == [[0]]
    assert list(micro_batches(torch.tensor([3, 50, 50, 3]), 10)) == [[0], [1], [2], [3]]
    assert list(micro_batches(torch.tensor([3, 1, 4]), 10_000)) == [[0, 1, 2]]


@pytest.mark.parametrize("budget", [1, 7, 16, 40])
def test_micro_batches_properties(budget):
    lengths = torch.randint(1, 20, (37,), generator=torch.Generator().manual_seed(budget))
    groups = list(micro_batches(lengths, budget))
    assert [i for grp in groups for i in grp] == list(range(37))  # every row once, in order
    for grp in groups:
        assert grp
        longest = int(lengths[grp].max())
        if len(grp) > 1:
            assert len(grp) * longest <= budget
        if longest > budget:
            assert len(grp) == 1  # an over-long row is alone
    # greedy: adding the next row to a group would break the budget
    for grp, nxt in zip(groups, groups[1:], strict=False):
        assert (len(grp) + 1) * int(lengths[grp + [nxt[0]]].max()) > budget


def test_draw_categorical_never_returns_zero_weight_and_follows_the_weights():
    from reinforge.rollout.sampling import draw_categorical

    g = torch.Generator().manual_seed(4)
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.8, 0.0]]).repeat(5000, 1)
    tokens = draw_categorical(probs, g)
    assert set(tokens.tolist()) == {1, 3}
    assert abs((tokens == 3).float().mean().item() - 0.8) < 0.03
    # u * total at the very top of the range still lands on the last index with weight
    assert draw_categorical(torch.tensor([[0.5, 0.5, 0.0]]), torch.Generator().manual_seed(0)).item() in (0, 1)


@pytest.mark.parametrize("width", [7, 1024, 2500])
def test_draw_categorical_matches_its_distribution(width):
    """Chi-square goodness of fit of 50,000 draws from uneven, unnormalised weights across blocks
    (2500: two blocks of CDF_BLOCK and a shorter tail block; zeros as top-k/top-p leave them)."""
    from reinforge.rollout.sampling import draw_categorical

    g = torch.Generator().manual_seed(width)
    k = min(40, width - 2)
    weights = torch.zeros(width)
    support = torch.randperm(width, generator=g)[:k]  # entries with weight, anywhere in the row
    weights[support] = torch.rand(k, generator=g) ** 3 * 5 + 0.2  # >= ~150 expected draws each
    weights *= 1 + 2 * (torch.arange(width) // 1024)  # blocks of unequal weight: level 1 matters
    rows = weights.expand(10_000, width).contiguous()
    counts = sum(torch.bincount(draw_categorical(rows, g), minlength=width) for _ in range(5)).double()
    assert counts[weights == 0].sum() == 0
    expected = weights[support].double() / weights.sum() * 50_000
    statistic = float(((counts[support] - expected) ** 2 / expected).sum())
    p_value = torch.special.gammaincc(torch.tensor((k - 1) / 2, dtype=torch.float64), torch.tensor(statistic / 2))
    assert p_value.item() > 1e-4, (statistic, p_value)  # chi-square with k - 1 degrees of freedom


def test_draw_categorical_edges_of_the_target_range():
    """u = 0 takes the first entry with weight and u just below 1 the last (a target rounded up to
    the total never lands on trailing zeros), in either level; all weight in the short tail block."""
    from reinforge.rollout.sampling import CDF_BLOCK, _inverse_cdf, draw_categorical

    w = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0, 0.0]], dtype=torch.float64)
    top = torch.tensor([[1 - 2**-53]], dtype=torch.float64)
    assert _inverse_cdf(w, torch.zeros(1, 1, dtype=torch.float64)).item() == 1
    assert _inverse_cdf(w, top).item() == 3
    assert _inverse_cdf(w, torch.tensor([[0.25]], dtype=torch.float64)).item() == 3  # C = 0.25 is not > 0.25
    tail = torch.zeros(1000, CDF_BLOCK + 5)
    tail[:, CDF_BLOCK + 2] = 3.0
    assert set(draw_categorical(tail, torch.Generator().manual_seed(0)).tolist()) == {CDF_BLOCK + 2}
