"""Tolerances that follow from the arithmetic, for tests that compare two computations.

Two kinds of claim, two kinds of check:

* **Mathematical equality of two computation paths** (packed vs padded rows, the shared-prefix vs
  the plain forward, 2 ranks vs 1 process, several micro-batches vs one, ...). In float32 the two
  paths sum in different orders, and which order depends on the CPU's kernel set (AVX-512, AVX2,
  the scalar default) and on the number of threads: through a transformer's backward and an Adam
  step such differences reach 1e-5, so a float32 tolerance is either loose enough to hide a real
  bug or tight enough to fail on another machine. These tests therefore run both paths in
  **float64** (``model.dtype=float64``, ``model.double()``), where a reduction of n terms of
  magnitude s reorders to within about n * eps64 * s (Higham, "Accuracy and Stability of Numerical
  Algorithms", section 4.2), and compare to ``EXACT_RTOL`` relative to the values' scale.
  ``EXACT_RTOL`` = 1e6 * eps64 ~ 2.2e-10 leaves a factor of 1e6 for the reduction lengths and the
  condition of these tiny models (their reductions are shorter than 1e4 terms), and stays four
  orders of magnitude below float32's eps, so any difference between the paths that a real bug
  makes (a wrong mask, a dropped token, a mis-scaled denominator: 1e-3 and more) still fails.

* **A float32 value against a closed form**: ``fp32_sum_atol(scale, n)`` is the worst-case bound
  n * eps32 * scale of a sum of n float32 terms of magnitude at most ``scale``.
"""

from __future__ import annotations

import types

import torch
from torch import nn

EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps
EXACT_RTOL = 1e6 * EPS64


def float64_model(model: nn.Module) -> nn.Module:
    """``model`` in float64 throughout, in place. ``model.double()`` alone is not enough for an HF
    Llama/Qwen2: its RMSNorm computes in float32 whatever the weights' dtype
    (``hidden_states.to(torch.float32)``), which puts float32 rounding back into the comparison
    wherever the two paths' inputs differ in their last float64 bits; here it keeps float64."""
    model.double()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_rms_norm_in_input_dtype, module)
    return model


def _rms_norm_in_input_dtype(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """w * x / sqrt(mean(x^2) + eps), in x's dtype (HF's formula without the float32 cast)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def scale_of(*tensors: torch.Tensor) -> float:
    """The magnitude the rounding errors are relative to: the largest |value| (at least 1e-30)."""
    return max([float(t.detach().abs().max()) for t in tensors if t.numel()] + [1e-30])


def assert_exact(actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    """``actual`` equals ``expected`` up to float64 reordering (see the module docstring); both float64."""
    assert actual.dtype == expected.dtype == torch.float64, (actual.dtype, expected.dtype)
    atol = EXACT_RTOL * scale_of(expected)
    torch.testing.assert_close(actual, expected, rtol=0, atol=atol, msg=lambda m: f"{msg} {m}".strip())


def assert_all_exact(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """Lists of tensors (gradients, parameters), each compared relative to the largest of them all."""
    assert len(actual) == len(expected) > 0
    atol = EXACT_RTOL * scale_of(*expected)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.dtype == e.dtype == torch.float64, (i, a.dtype, e.dtype)
        torch.testing.assert_close(a, e, rtol=0, atol=atol, msg=lambda m, i=i: f"tensor {i}: {m}")


def exact_approx(expected: float):  # noqa: ANN201 (a pytest.approx)
    """pytest.approx for a float64 scalar computed along another path."""
    import pytest

    return pytest.approx(expected, abs=EXACT_RTOL * max(abs(expected), 1.0))


def fp32_sum_atol(scale: float, n: int) -> float:
    """Worst-case error of a float32 sum of ``n`` terms of magnitude <= ``scale``: n * eps32 * scale."""
    return n * EPS32 * scale
