"""The Tinker API's built-in losses, each one of reinforge's registered parts, summed over tokens.

Tinker's losses act per token and are summed over every token of every datum (no mean), with
``logp`` the trained policy's log-probability of ``target_tokens`` and ``q`` the sampler's
(``loss_fn_inputs.logprobs``), ``rho = exp(logp - q)``, ``A`` the advantages:

    name                 L (summed over tokens)                            reinforge part
    cross_entropy        -w * logp (w: loss_fn_inputs.weights)               loss term ``nll`` times w
    importance_sampling  -rho * A                                            ``ppo_clip``, clip range [0, inf)
    ppo                  -min(rho A, clip(rho, lo, hi) A), lo/hi 0.8/1.2     ``ppo_clip``, clip_low = 1 - lo,
                         (loss_fn_config clip_low/high_threshold)            clip_high = hi - 1
    cispo                -sg(clip(rho, lo, hi)) * A * logp                    ``cispo``, the same mapping

``ppo_clip`` bounds ``log rho`` to [-20, 20] before exp (verl's bound); Tinker's formula does not: the
two differ only past a ratio of e^20.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from reinforge.service.schema import FieldError


@dataclass(frozen=True)
class TinkerLoss:
    """One Tinker loss: the ``loss_fn_inputs`` it needs (besides ``target_tokens``), its config keys with
    defaults, and ``per_token(logp, inputs, config) -> [N, T]`` (zero where nothing is trained)."""

    inputs: tuple[str, ...]
    config: dict[str, float]
    per_token: Callable[[Tensor, dict[str, Tensor], dict[str, float]], Tensor]


def _policy_loss(name: str, settings: dict[str, float], logp: Tensor, inputs: dict[str, Tensor]) -> Tensor:
    from reinforge.algo.policy_losses import POLICY_LOSSES

    entry = POLICY_LOSSES.entry(name)
    cfg = entry.settings(**settings) if entry.settings is not None else None
    loss, _ = POLICY_LOSSES.call(name, None, cfg, logp=logp, old_logp=inputs["logprobs"],
                                 advantages=inputs["advantages"], mask=inputs["mask"])
    return loss * inputs["mask"]


def _cross_entropy(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    from reinforge.algo.objective import LOSS_TERMS

    nll, _ = LOSS_TERMS.call("nll", None, None, logp=logp)
    return nll * inputs["weights"]


def _clip_range(config: dict[str, float]) -> dict[str, float]:
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    if not 0.0 <= low <= 1.0:
        raise FieldError("forward_backward_input.loss_fn_config.clip_low_threshold", f"{low}: must be in [0, 1]")
    if high < 1.0:
        raise FieldError("forward_backward_input.loss_fn_config.clip_high_threshold", f"{high}: must be >= 1")
    return {"clip_low": 1.0 - low, "clip_high": high - 1.0}


def _importance_sampling(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    return _policy_loss("ppo_clip", {"clip_low": 1.0, "clip_high": math.inf}, logp, inputs)


def _ppo(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    return _policy_loss("ppo_clip", _clip_range(config), logp, inputs)


def _cispo(logp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    return _policy_loss("cispo", _clip_range(config), logp, inputs)


_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
TINKER_LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(("weights",), {}, _cross_entropy),
    "importance_sampling": TinkerLoss(("logprobs", "advantages"), {}, _importance_sampling),
    "ppo": TinkerLoss(("logprobs", "advantages"), dict(_CLIP), _ppo),
    "cispo": TinkerLoss(("logprobs", "advantages"), dict(_CLIP), _cispo),
}


def resolve_loss(name: str, config: dict[str, Any] | None) -> tuple[TinkerLoss, dict[str, float]]:
    """The loss ``name`` and its config (defaults filled in); ``FieldError`` for an unknown loss or key."""
    loss = TINKER_LOSSES.get(name)
    if loss is None:
        raise FieldError("forward_backward_input.loss_fn",
                         f"unknown loss {name!r}; this service runs: {', '.join(TINKER_LOSSES)}")
    merged = dict(loss.config)
    for key, value in (config or {}).items():
        if key not in loss.config:
            allowed = ", ".join(loss.config) or "none"
            raise FieldError(f"forward_backward_input.loss_fn_config.{key}", f"not a setting of {name} (allowed: {allowed})")
        if not isinstance(value, int | float):
            raise FieldError(f"forward_backward_input.loss_fn_config.{key}", f"{value!r}: must be a number")
        merged[key] = float(value)
    return loss, merged


def loss_inputs(loss: TinkerLoss, name: str, raw: list[dict[str, Any]], shape: tuple[int, int],
                device: torch.device) -> dict[str, Tensor]:
    """The [N, T] tensors ``loss`` reads (right-padded with zeros; ``mask``: 1 on each datum's tokens),
    from each datum's ``loss_fn_inputs`` (``raw``); ``FieldError`` naming a missing input."""
    n, t = shape
    out = {"mask": torch.zeros(n, t, device=device)}
    for key in loss.inputs:
        out[key] = torch.zeros(n, t, device=device)
    for i, inputs in enumerate(raw):
        for key in loss.inputs:
            if key not in inputs and key != "weights":
                raise FieldError(f"forward_backward_input.data.{i}.loss_fn_inputs.{key}", f"required by {name}")
            values = inputs[key] if key in inputs else [1.0] * len(inputs["target_tokens"])
            out[key][i, :len(values)] = torch.tensor(values, dtype=torch.float32, device=device)
        out["mask"][i, :len(inputs["target_tokens"])] = 1.0
    return out
