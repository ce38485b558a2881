"""oneDNN-packed linears (reinforge/models/packed_linear.py) compute what F.linear computes, to fp32 rounding;
where packing does not apply (float64) they are F.linear exactly."""

import torch
import torch.nn.functional as F

from reinforge.models.packed_linear import GatedMLP, PackedLinear, can_pack


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_packed_linear_and_its_fused_epilogues_match_f_linear():
    torch.manual_seed(0)
    w, b = torch.randn(48, 32) / 6, torch.randn(48)
    x, other = torch.randn(2, 5, 32), torch.randn(2, 5, 48)
    lin = PackedLinear(w, b)
    assert lin.packed == can_pack(w)
    _close(lin(x), F.linear(x, w, b))
    _close(lin.fused(x, other, "add"), F.linear(x, w, b) + other)
    _close(lin.fused(x, other, "mul"), F.linear(x, w, b) * other)
    _close(lin(x[:, 1:3]), F.linear(x[:, 1:3], w, b))  # any number of rows, strided input


def test_gated_mlp_is_swiglu_with_residual():
    torch.manual_seed(1)
    gate, up, down = torch.randn(24, 16) / 4, torch.randn(24, 16) / 4, torch.randn(16, 24) / 5
    h, res = torch.randn(7, 16), torch.randn(7, 16)
    expected = res + F.linear(F.silu(F.linear(h, gate)) * F.linear(h, up), down)
    _close(GatedMLP(gate, up, down)(h, res), expected)


def test_float64_weights_are_not_packed_and_exact():
    torch.manual_seed(2)
    w, x = torch.randn(8, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    lin = PackedLinear(w)
    assert not lin.packed
    assert torch.equal(lin(x), F.linear(x, w))
    gate, up, down = (torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64),
                      torch.randn(4, 6, dtype=torch.float64))
    g, u = F.linear(x, torch.cat([gate, up])).chunk(2, dim=-1)  # the unpacked path: gate and up in one matmul
    assert torch.equal(GatedMLP(gate, up, down)(x, x), x + F.linear(F.silu(g) * u, down))
