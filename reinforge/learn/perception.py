"""The masked-picture forward a loss term asks for (the need ``masked_pictures``, registry.NEEDS; PAPO's,
algo/perception.py): the same micro-batch with patches of each row's picture masked
(``algo.perception.mask_patches``), through the learner's training forward with gradient, giving the
context fields ``masked_logp`` and ``masked_entropy``. The term's settings name the masking
(``mask_ratio``, ``patch``: 0 is the model's ``vision_config.patch_size``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor, nn

from reinforge.algo.objective import LOSS_TERMS, Term
from reinforge.algo.perception import mask_patches
from reinforge.errors import ConfigError
from reinforge.types import Batch

NEED = "masked_pictures"
DEFAULT_PATCH = 14  # the paper's (Qwen2.5-VL's patch), for a model whose config names none


def vision_patch(model: nn.Module) -> int:
    """The vision tower's patch size from the model's config (``vision_config.patch_size``), else 14."""
    vision = getattr(getattr(model, "config", None), "vision_config", None)
    return int(getattr(vision, "patch_size", None) or DEFAULT_PATCH)


def masked_fields(terms: Iterable[Term], mb: Batch, model: nn.Module,
                  logprobs: Callable[[Batch], tuple[Tensor, Tensor | None]]) -> dict[str, Tensor]:
    """``masked_logp`` and ``masked_entropy`` of ``mb`` when a term needs them ({} otherwise); ``logprobs``
    is the learner's training forward (with entropies). The first such term's settings mask the pictures."""
    term = next((t for t in terms if NEED in LOSS_TERMS.needs(t.name)), None)
    if term is None:
        return {}
    pixels = (mb.model_inputs or {}).get("pixel_values")
    if pixels is None:
        raise ConfigError(f"algo.loss_terms: {term.name} masks the rows' pictures, but this batch has none "
                          "(pixel_values): use it with an image task and a vision-language model (docs/vision.md)")
    cfg: Any = term.cfg
    patch = cfg.patch or vision_patch(model)
    inputs = {**mb.model_inputs, "pixel_values": mask_patches(pixels, cfg.mask_ratio, patch)}
    logp, entropy = logprobs(dataclasses.replace(mb, model_inputs=inputs))
    assert entropy is not None
    return {"masked_logp": logp, "masked_entropy": entropy}
