"""NoisyRollout (Liu et al. 2025, "NoisyRollout: Reinforcing Visual Reasoning with Data Augmentation",
arXiv:2504.13055): part of each prompt's group is sampled from a noised copy of its picture, and the
whole group is trained on the clean picture.

For a group of n = n1 + n2: n1 completions from the clean picture I, n2 from I~ = q(I, alpha_t), the
forward diffusion process at noise step alpha_t on the picture's [0, 1] pixels
(``diffusion_noise``); the group's advantages are computed over all n rewards, and every
completion's log-probs in the update condition on the clean picture (each trajectory keeps its prompt's
clean ``model_inputs``: the learner's pi_theta and pi_old never see the noise, as the paper's update).
alpha_t anneals: alpha_t = alpha_0 * (1 - sigmoid(c * (t / T - m))) (``sigmoid_anneal``).

Choices, from the paper and its released scripts: n2 = n1 (``noisy_share`` 0.5), alpha_0 = 500 of 1000
diffusion steps, the sigmoid annealing with c = 30; the midpoint ``decay_mid`` is a share of ``total_steps``
(the scripts put it at step 40 of their run; here half the run by default, and ``total_steps`` should be
the run's ``train.steps``). The noise is applied to the processor's output: its pixel values are
un-normalised with the image processor's mean and std, noised and clamped in [0, 1], normalised again
(the paper noises the picture before its processor; for a processor that only rescales and normalises,
as LLaVA's, the two agree). t counts this sampler's calls (one per training step in the loop; kept in
``state_dict`` so a resumed run goes on with the schedule). The engine's sampling log-probs of the noisy
completions are those under the noisy picture; leave ``algo.mismatch`` at ``none``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from reinforge.errors import ConfigError
from reinforge.registry import Settings
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams


class NoisyRolloutSettings(Settings):
    noisy_share: float = Field(0.5, gt=0, lt=1, description="n2 / n: the share of each group sampled from the "
                               "noised picture (rounded, at least 1 and at most n - 1)")
    noise_step: int = Field(500, ge=0, le=999, description="alpha_0: the initial noise step (of 1000)")
    anneal: bool = Field(True, description="the paper's sigmoid annealing of the noise step; false: alpha_0 "
                         "throughout")
    decay_coef: float = Field(30.0, gt=0, description="c: the sigmoid's steepness")
    decay_mid: float = Field(0.5, ge=0, le=1, description="m: the sigmoid's midpoint, a share of total_steps")
    total_steps: int = Field(60, ge=1, description="T: the run's training steps (train.steps)")
    seed: int = Field(0, description="seed of the noise (with the call count)")


@GROUP_SAMPLERS.register(
    "noisy_rollout",
    formula="group = n1 samples from pi(. | q, I) + n2 from pi(. | q, I~), I~ = sqrt(abar_a) I + sqrt(1 - abar_a) eps, "
            "a = alpha_0 (1 - sigmoid(c (t/T - m))); the update conditions every sample on the clean I",
    paper="Liu et al. 2025, NoisyRollout: Reinforcing Visual Reasoning with Data Augmentation (arXiv:2504.13055)",
    needs=("other_context",),
    settings=NoisyRolloutSettings,
)
class NoisyRollout:
    """NoisyRollout's mixed clean / noisy groups with noise annealing (module docstring)."""

    def __init__(self, cfg: NoisyRolloutSettings | None = None) -> None:
        self.cfg = cfg or NoisyRolloutSettings()
        self.calls = 0
        self._counters: dict[str, float] = {}

    def noise_step(self) -> int:
        """alpha_t at this call's step t."""
        c = self.cfg
        if not c.anneal:
            return c.noise_step
        return sigmoid_anneal(c.noise_step, self.calls, c.total_steps, c.decay_coef, c.decay_mid)

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        n = params.n
        if not getattr(engine, "reads_model_inputs", True):
            raise ConfigError("rollout.group_sampler=noisy_rollout noises the processor's pixel values "
                              "(model_inputs), which this engine does not sample from (rollout.engine=vllm and "
                              "rollout.engine=openai are sent the pictures themselves): use rollout.engine=torch")
        if n < 2:
            raise ConfigError("rollout.group_sampler=noisy_rollout needs rollout.group_size >= 2 (clean and noisy "
                              "samples in each group)")
        n2 = min(max(round(self.cfg.noisy_share * n), 1), n - 1)
        step = self.noise_step()
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.calls)
        noisy = [dataclasses.replace(r, model_inputs=noised_inputs(engine, r, step, generator)) for r in requests]
        clean_out = engine.generate(list(requests), dataclasses.replace(params, n=n - n2))
        noisy_out = engine.generate(noisy, dataclasses.replace(params, n=n2))
        out = []
        for i, request in enumerate(requests):
            group = clean_out[i * (n - n2):(i + 1) * (n - n2)] + noisy_out[i * n2:(i + 1) * n2]
            for j, g in enumerate(group):
                g.sample_index, g.model_inputs = j, request.model_inputs  # the update sees the clean picture
                g.extra["noisy_rollout/noisy"] = float(j >= n - n2)
            out.extend(group)
        self.calls += 1
        self._counters = {"tokens_generated": float(sum(len(g.token_ids) for g in out)),
                          "noisy_rollout/noise_step": float(step)}
        return out

    def counters(self) -> dict[str, float]:
        return dict(self._counters)

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = int(state.get("calls", 0))


def noised_inputs(engine: Any, request: GenerationRequest, step: int, generator: torch.Generator) -> dict[str, Any]:
    """``request.model_inputs`` with its ``pixel_values`` noised at ``step`` in [0, 1] pixel space (through
    the engine's image processor's ``image_mean`` / ``image_std``)."""
    pixels = request.model_inputs.get("pixel_values")
    if pixels is None:
        raise ConfigError(f"rollout.group_sampler=noisy_rollout: request {request.request_id!r} has no picture "
                          "(pixel_values): use it with an image task and a vision-language model")
    image_processor = getattr(getattr(engine, "processor", None), "image_processor", None)
    if image_processor is None:
        raise ConfigError("rollout.group_sampler=noisy_rollout: the engine has no image processor to un-normalise "
                          "the pictures with")
    shape = (-1, 1, 1)
    mean = torch.tensor(image_processor.image_mean, dtype=pixels.dtype).view(shape).to(pixels.device)
    std = torch.tensor(image_processor.image_std, dtype=pixels.dtype).view(shape).to(pixels.device)
    noisy = diffusion_noise(pixels * std + mean, step, generator)
    return {**request.model_inputs, "pixel_values": (noisy - mean) / std}


def diffusion_noise(pixels: Tensor, step: int, generator: torch.Generator | None = None,
                    num_steps: int = 1000) -> Tensor:
    """The forward diffusion process at ``step`` on pictures in [0, 1], clamped to [0, 1]:
    x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps, eps ~ N(0, I), abar_t = prod_{s<=t} (1 - beta_s),
    beta = sigmoid(linspace(-6, 6, num_steps)) * (5e-3 - 1e-5) + 1e-5 (NoisyRollout's Gaussian noise, the
    schedule of visual contrastive decoding); ``step`` 0 still adds the first step's noise, as there."""
    betas = torch.sigmoid(torch.linspace(-6, 6, num_steps, dtype=torch.float64)) * (0.5e-2 - 1e-5) + 1e-5
    abar = torch.cumprod(1 - betas, dim=0)[min(max(step, 0), num_steps - 1)]
    eps = torch.randn(pixels.shape, generator=generator, dtype=pixels.dtype).to(pixels.device)
    return (float(abar.sqrt()) * pixels + float((1 - abar).sqrt()) * eps).clamp(0.0, 1.0)


def sigmoid_anneal(alpha0: float, t: int, total: int, coef: float, mid: float) -> int:
    """NoisyRollout's noise annealing: alpha_t = int(alpha0 * (1 - sigmoid(coef * (t / total - mid)))), the
    noise step at training step t of ``total``; ``mid`` is the midpoint as a share of the run."""
    x = coef * (t / total - mid)
    return int(alpha0 * (1.0 - 1.0 / (1.0 + math.exp(-x))))
