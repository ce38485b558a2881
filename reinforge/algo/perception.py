"""Perception-aware terms for vision-language policies: PAPO's implicit perception loss and its double
entropy loss (Wang et al. 2025, "Perception-Aware Policy Optimization for Multimodal Reasoning",
arXiv:2507.06448), and the patch masking it shows the policy (pure tensor math).

PAPO adds to GRPO's objective the KL divergence between the policy that sees the picture and the same
policy shown a masked picture, *maximised*: a policy whose answer does not change when the picture is
masked has not looked. Per generated token t, with r_t = pi(o_t | q, I_mask, o_<t) / pi(o_t | q, I, o_<t),

    KL_prc_t = r_t - log r_t - 1          (the k3 estimator of GRPO's KL penalty, Schulman 2020)

and the loss term (minimised) is

    l_t = - gamma * min(KL_prc_t, cap) + eta * (H_t[pi(. | q, I)] + H_t[pi(. | q, I_mask)])

Maximising KL_prc alone lets the policy "hack" it by making its masked-picture distribution degenerate;
the paper's double entropy loss (eta > 0) keeps both entropies low. Choices: gamma = 0.01 and random
masking of 60 % of the patches (``mask_ratio``), as read from the paper (TRL's PAPO trainer defaults to
0.1 and 0.3), eta = 0.03 for both entropies (the paper's eta_1 = eta_2, TRL's default too), the k3 form of
the KL (as TRL's trainer computes it), patches the vision tower's own size (the paper's 14 x 14 are
Qwen2.5-VL's), a masked patch set to 0 in the processor's normalised pixel values (the image processor's
mean colour), gradients through both forwards. ``cap`` (None: no cap) clips KL_prc from above, as a later
version of TRL's trainer does (at 0.2); off by default.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.objective import LOSS_TERMS
from reinforge.registry import Settings

PAPO_PAPER = ("Wang et al. 2025, Perception-Aware Policy Optimization for Multimodal Reasoning (PAPO, "
              "arXiv:2507.06448)")


class PapoSettings(Settings):
    gamma: float = Field(0.01, ge=0, description="gamma: weight of the implicit perception loss (maximised KL)")
    eta: float = Field(0.03, ge=0, description="eta: weight of the double entropy loss on both forwards; 0 is "
                       "PAPO without it")
    mask_ratio: float = Field(0.6, gt=0, le=1, description="share of the picture's patches masked (1: a blank "
                              "picture)")
    patch: int = Field(0, ge=0, description="side of a masked patch in pixels; 0: the vision tower's patch size")
    cap: float | None = Field(None, gt=0, description="upper clip of KL_prc per token (None: none)")


def perception_kl(logp: Tensor, masked_logp: Tensor) -> Tensor:
    """KL_prc_t = r - log r - 1, log r = masked_logp - logp (k3: >= 0, 0 where the two agree)."""
    log_r = masked_logp - logp
    return torch.exp(log_r) - log_r - 1


@LOSS_TERMS.register(
    "papo",
    formula="- gamma * min(KL_prc_t, cap) + eta * (H_t + H_t^mask), KL_prc_t = r_t - log r_t - 1, "
            "r_t = pi(o_t | q, I_mask, o_<t) / pi(o_t | q, I, o_<t)",
    paper=PAPO_PAPER,
    needs=("masked_pictures",),
    settings=PapoSettings,
)
def papo_term(logp: Tensor, masked_logp: Tensor, entropy: Tensor, masked_entropy: Tensor, cfg: Any
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """PAPO's implicit perception loss and double entropy loss per token (module docstring)."""
    kl = perception_kl(logp, masked_logp)
    kept = kl.clamp(max=cfg.cap) if cfg.cap is not None else kl
    values = -cfg.gamma * kept + cfg.eta * (entropy + masked_entropy)
    return values, {"papo/kl_prc": kl.detach(), "papo/masked_entropy": masked_entropy.detach()}


def mask_patches(pixel_values: Tensor, ratio: float, patch: int, generator: torch.Generator | None = None) -> Tensor:
    """``pixel_values`` [..., C, H, W] with round(ratio * P) of each picture's P patches (``patch`` x ``patch``
    pixels, a ragged last row and column counted as patches) set to 0, chosen uniformly without replacement
    for every picture; 0 is the image processor's mean colour in its normalised values."""
    *lead, c, h, w = pixel_values.shape
    rows, cols = math.ceil(h / patch), math.ceil(w / patch)
    n_patches, pictures = rows * cols, math.prod(lead)
    k = round(ratio * n_patches)
    order = torch.rand(pictures, n_patches, generator=generator).argsort(dim=1)
    masked = torch.zeros(pictures, n_patches, dtype=torch.bool)
    masked.scatter_(1, order[:, :k], True)
    grid = masked.view(pictures, rows, cols).repeat_interleave(patch, 1).repeat_interleave(patch, 2)[:, :h, :w]
    keep = (~grid).to(pixel_values.device, pixel_values.dtype).view(*lead, 1, h, w)
    return pixel_values * keep
