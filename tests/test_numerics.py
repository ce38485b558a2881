"""The float64 comparison of tests/numerics.py: it sees float32 rounding, and `make test` really runs the
numerics tests under the kernel set and thread count it asks for."""

from __future__ import annotations

import os
import platform

import pytest
import torch
from numerics import EXACT_RTOL, assert_exact, float64_model
from transformers import LlamaConfig, LlamaForCausalLM


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=30, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2))


def test_float64_model_computes_its_norms_in_float64():
    ids = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(1))
    plain = _llama().double()  # HF's RMSNorm still casts to float32 inside
    exact = float64_model(_llama())
    with torch.no_grad():
        x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        norm = exact.model.norm
        expected = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        assert_exact(norm(x), expected)
        with pytest.raises(AssertionError):  # the float32 cast is a difference the comparison sees
            assert_exact(plain.model.norm(x), expected)
        assert exact(ids).logits.dtype == torch.float64


def test_the_exact_tolerance_sees_a_float32_rounding():
    x = torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert_exact(x + x * 1e-13, x)
    with pytest.raises(AssertionError):
        assert_exact(x.float().double(), x)  # float32 rounding: 6e-8 relative, far above EXACT_RTOL
    assert EXACT_RTOL < 1e-9


@pytest.mark.numerics
def test_runs_under_the_kernel_set_and_thread_count_asked_for():
    from conftest import TEST_THREADS

    assert torch.get_num_threads() == TEST_THREADS
    wanted = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if wanted in ("avx2", "default") and platform.machine().lower() in ("x86_64", "amd64"):
        assert torch.backends.cpu.get_cpu_capability().lower() == wanted
