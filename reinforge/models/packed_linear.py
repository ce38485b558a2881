"""Linear layers whose weights are reordered once into oneDNN's blocked layout (CPU, fp32).

``F.linear`` on CPU hands the plain [out, in] weight to MKL's sgemm, which repacks it into its
own panels on every call; at decode sizes (a few dozen rows against a weight of megabytes) that
repacking is a large part of the step. oneDNN's matmul reading a weight reordered once ahead of
time does not repack (vLLM's CPU backend does the same with its ``onednn_mm``). The arithmetic is
the same fp32 dot products in another summation order (results agree with ``F.linear`` to fp32
rounding). Where oneDNN does not apply (another device or dtype, e.g. the float64 reference models
of the tests) the weight is used as is with ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

PACK_BATCH_HINT = 64  # rows the reorder is tuned for (any row count works)


def can_pack(weight: Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear:
    """``x @ weight.T + bias`` with ``weight`` [out, in] reordered for oneDNN when possible.

    ``fused(x, other, op)`` applies ``op`` ("add" or "mul") with ``other`` inside the matmul's
    epilogue: ``op(x @ weight.T + bias, other)``, one pass instead of two.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.out_features = weight.shape[0]
        self.bias = bias.detach() if bias is not None else None
        if can_pack(weight):
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
            self.packed = True
        else:
            self.weight, self.packed = weight.detach(), False

    def __call__(self, x: Tensor) -> Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def fused(self, x: Tensor, other: Tensor, op: str) -> Tensor:
        if self.packed and x.dtype == other.dtype and x.shape[:-1] == other.shape[:-1]:
            return torch.ops.mkldnn._linear_pointwise.binary(x, other.contiguous(), self.weight, self.bias, op)
        y = self(x)
        return y + other if op == "add" else y * other


class GatedMLP:
    """The SwiGLU block with its residual: ``x + down(silu(gate(h)) * up(h))``.

    Packed: three oneDNN matmuls with silu, the product and the residual add in their epilogues.
    Otherwise: gate and up fused into one ``F.linear``, then silu, product, down and add.
    """

    def __init__(self, gate: Tensor, up: Tensor, down: Tensor) -> None:
        self.packed = can_pack(gate)
        if self.packed:
            self.gate, self.up, self.down = PackedLinear(gate), PackedLinear(up), PackedLinear(down)
        else:
            self.gate_up, self.w_down = torch.cat([gate, up]).detach(), down.detach()

    def __call__(self, h: Tensor, residual: Tensor) -> Tensor:
        if self.packed:
            gate = torch.ops.mkldnn._linear_pointwise(h, self.gate.weight, None, "swish", [], "")
            return self.down.fused(self.up.fused(h, gate, "mul"), residual, "add")
        gate, up = F.linear(h, self.gate_up).chunk(2, dim=-1)
        return residual + F.linear(F.silu(gate) * up, self.w_down)
