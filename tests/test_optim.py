"""The policy's AdamW and its learning-rate schedule (learn/optim.py), against hand-computed values."""

import math

import pytest
import torch

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.learn.optim import build_optimizer, lr_factor


def _train(*overrides: str):
    return load_config(None, list(overrides)).train


def test_cosine_after_warm_up_by_hand():
    t = _train("train.steps=10", "train.warmup_steps=2", "train.lr_schedule=cosine")
    assert [lr_factor(s, t) for s in (0, 1)] == [0.5, 1.0]
    assert lr_factor(2, t) == pytest.approx(1.0)
    assert lr_factor(6, t) == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 8)))  # = 0.5
    assert lr_factor(10, t) == pytest.approx(0.0)
    assert lr_factor(12, t) == pytest.approx(0.0)  # past the last step: stays at 0


def test_the_train_sections_adam_settings_reach_the_optimizer():
    t = _train("train.lr=3e-4", "train.betas=[0.8,0.95]", "train.eps=1e-6", "train.weight_decay=0.1")
    w = torch.nn.Parameter(torch.ones(3))
    opt, _ = build_optimizer([w], t)
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (3e-4, (0.8, 0.95), 1e-6, 0.1)


@pytest.mark.parametrize("eps", [1e-8, 1e-3])
def test_one_adamw_step_by_hand(eps):
    """First step of AdamW: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected to g and g^2, so the update is
    -lr g / (|g| + eps) after the decoupled decay w <- w (1 - lr wd)."""
    t = _train("train.lr=0.1", f"train.eps={eps}", "train.weight_decay=0.5", "train.lr_schedule=constant")
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt, _ = build_optimizer([w], t)
    g = torch.tensor([0.002, -0.004], dtype=torch.float64)
    w.grad = g.clone()
    opt.step()
    expected = torch.tensor([1.0, -2.0], dtype=torch.float64) * (1 - 0.1 * 0.5) - 0.1 * g / (g.abs() + eps)
    assert torch.allclose(w.detach(), expected, rtol=1e-12, atol=1e-12)


def test_the_fused_kernel_follows_the_per_tensor_adamw():
    """``train.fused_optimizer``: torch's fused AdamW and the per-tensor one agree to float32 rounding over five
    steps on the same gradients."""
    a, b = (torch.nn.Parameter(torch.linspace(-1, 1, 64)) for _ in range(2))
    fused, _ = build_optimizer([a], _train("train.fused_optimizer=true"))
    plain, _ = build_optimizer([b], _train("train.fused_optimizer=false"))
    for step in range(5):
        grad = torch.sin(torch.arange(64.0) * (step + 1))
        a.grad, b.grad = grad.clone(), grad.clone()
        fused.step()
        plain.step()
    assert not torch.equal(a, torch.linspace(-1, 1, 64))
    assert torch.allclose(a, b, atol=1e-6)


def test_a_non_positive_eps_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="train.eps"):
        _train("train.eps=0")
