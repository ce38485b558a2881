"""Clipped value loss, explained variance and the adaptive KL controller against hand-computed values."""

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo import KLController, clipped_value_loss, explained_variance

# (V, V_old, R, expected loss with clip 0.2, value_clip_frac, d loss / dV)
VALUE_CASES = [
    # moved towards R past the clip: V_clip = 0.7, 0.5 * max(0, 0.09) = 0.045, clipped term active, no gradient
    (1.0, 0.5, 1.0, 0.045, 1.0, 0.0),
    # inside the clip range: both terms 0.16 -> 0.08, gradient V - R = -0.4
    (0.6, 0.5, 1.0, 0.08, 0.0, -0.4),
    # moved away from R: unclipped 1.0 > clipped (0.3 - 1)^2 = 0.49 -> 0.5, gradient -1
    (0.0, 0.5, 1.0, 0.5, 0.0, -1.0),
    # overshot R: unclipped 1.0 > clipped (0.7 - 1)^2 = 0.09 -> 0.5, gradient +1
    (2.0, 0.5, 1.0, 0.5, 0.0, 1.0),
    # moved down towards R = 0 past the clip: unclipped 0.04 < clipped 0.3^2 = 0.09 -> 0.045
    (0.2, 0.5, 0.0, 0.045, 1.0, 0.0),
]


def _value_tensors(requires_grad: bool = False):
    v, old, ret, *_ = zip(*VALUE_CASES, strict=True)
    f64 = torch.float64
    return (torch.tensor(v, dtype=f64, requires_grad=requires_grad), torch.tensor(old, dtype=f64),
            torch.tensor(ret, dtype=f64))


def test_clipped_value_loss_hand_values_and_gradient():
    values, old, ret = _value_tensors(requires_grad=True)
    loss, metrics = clipped_value_loss(values, old, ret, 0.2)
    _, _, _, exp_loss, exp_frac, exp_grad = zip(*VALUE_CASES, strict=True)
    assert_close(loss.detach(), torch.tensor(exp_loss, dtype=torch.float64), atol=1e-12, rtol=0)
    assert_close(metrics["value_clip_frac"], torch.tensor(exp_frac, dtype=torch.float64))
    assert not metrics["value_clip_frac"].requires_grad
    loss.sum().backward()
    assert_close(values.grad, torch.tensor(exp_grad, dtype=torch.float64), atol=1e-12, rtol=0)


def test_clipped_value_loss_clip_zero_is_plain_squared_error():
    values, old, ret = _value_tensors()
    loss, metrics = clipped_value_loss(values, old, ret, 0.0)
    # 0.5 (V - R)^2 = 0, 0.08, 0.5, 0.5, 0.02
    assert_close(loss, torch.tensor([0.0, 0.08, 0.5, 0.5, 0.02], dtype=torch.float64), atol=1e-12, rtol=0)
    assert metrics["value_clip_frac"].sum().item() == 0.0


def test_clipped_value_loss_2d_and_negative_clip():
    values = torch.tensor([[1.0, 0.6], [0.0, 2.0]])
    loss, metrics = clipped_value_loss(values, torch.full((2, 2), 0.5), torch.ones(2, 2), 0.2)
    assert loss.shape == (2, 2) and metrics["value_clip_frac"].shape == (2, 2)
    assert_close(loss, torch.tensor([[0.045, 0.08], [0.5, 0.5]]))
    with pytest.raises(ValueError):
        clipped_value_loss(values, values, values, -0.1)


def test_explained_variance_hand_values():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    returns = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    # perfect critic -> 1 (masked-out positions are ignored)
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    # constant critic -> Var[R - c] = Var[R] -> 0
    assert explained_variance(torch.full((2, 3), 2.5), returns, mask) == pytest.approx(0.0, abs=1e-12)
    # V = [1, 2, 3, 5]: R - V = [0, 0, 0, -1], population var = (3 * 0.0625 + 0.5625) / 4 = 0.1875;
    # Var[R] = 1.25 -> 1 - 0.15 = 0.85
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 5.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.85)
    # worse than the mean -> negative: V = [4, 3, 2, 1], R - V = [-3, -1, 1, 3], var 5 -> 1 - 5 / 1.25 = -3
    values = torch.tensor([[4.0, 3.0, 0.0], [2.0, 1.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(-3.0)


def test_explained_variance_degenerate_is_zero():
    returns = torch.tensor([[2.0, 2.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert explained_variance(torch.tensor([[0.0, 1.0, 0.0]]), returns, mask) == 0.0  # Var[R] = 0
    assert explained_variance(returns, returns, torch.zeros(1, 3)) == 0.0  # no masked token
    assert isinstance(explained_variance(returns, returns, mask), float)


# ----------------------------------------------------------------------------- KL controller


def test_kl_controller_fixed_when_target_zero():
    ctl = KLController(0.05, 0.0, 100)
    ctl.update(123.0, 1000)
    assert ctl.value == 0.05 and not ctl.adaptive


def test_kl_controller_adaptive_hand_values():
    ctl = KLController(0.1, 6.0, 10000)
    # KL 9: e = 9 / 6 - 1 = 0.5 -> clipped to 0.2; 0.1 * (1 + 0.2 * 1000 / 10000) = 0.102
    ctl.update(9.0, 1000)
    assert ctl.value == pytest.approx(0.102)
    # KL 6.6: e = 0.1 (not clipped); 0.102 * (1 + 0.1 * 0.1) = 0.10302
    ctl.update(6.6, 1000)
    assert ctl.value == pytest.approx(0.10302)
    # KL 0: e = -1 -> clipped to -0.2; * (1 - 0.2 * 500 / 10000) = * 0.99
    ctl.update(0.0, 500)
    assert ctl.value == pytest.approx(0.10302 * 0.99)
    # KL 5.4: e = -0.1; * (1 - 0.1 * 2000 / 10000) = * 0.98
    ctl.update(5.4, 2000)
    assert ctl.value == pytest.approx(0.10302 * 0.99 * 0.98)
    # KL at target: unchanged
    before = ctl.value
    ctl.update(6.0, 5000)
    assert ctl.value == pytest.approx(before)


def test_kl_controller_state_dict_round_trip():
    ctl = KLController(0.1, 6.0, 10000)
    ctl.update(9.0, 1000)
    other = KLController(0.1, 6.0, 10000)
    other.load_state_dict(ctl.state_dict())
    assert other.value == ctl.value == pytest.approx(0.102)
    other.update(9.0, 1000)
    assert other.value == pytest.approx(0.102 * 1.02)


def test_kl_controller_validation():
    with pytest.raises(ValueError):
        KLController(-0.1, 1.0, 10)
    with pytest.raises(ValueError):
        KLController(0.1, -1.0, 10)
    with pytest.raises(ValueError):
        KLController(0.1, 1.0, 0)


def test_value_clip_frac_ignores_rounding_inside_the_range():
    # float32, every |V - V_old| < clip: V_old + (V - V_old) differs from V in the last bit for some
    # tokens, which made the clipped term "larger" by rounding alone. No token is clipped here.
    gen = torch.Generator().manual_seed(0)
    old = torch.rand(4096, generator=gen) * 0.15
    values = torch.rand(4096, generator=gen) * 0.15  # drawn independently: |V - V_old| < 0.15 < 0.2
    returns = torch.randn(4096, generator=gen)
    v_clipped = old + torch.clamp(values - old, -0.2, 0.2)
    naive = ((v_clipped - returns) ** 2 > (values - returns) ** 2).sum().item()
    assert naive > 0  # the artefact is present in this sample
    _, metrics = clipped_value_loss(values, old, returns, 0.2)
    assert metrics["value_clip_frac"].sum().item() == 0.0
