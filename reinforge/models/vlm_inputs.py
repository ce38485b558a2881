"""A vision-language model's inputs as rows of the batch record, and back into its forward's arguments.

The batch record (``Trajectory.model_inputs``, ``Batch.model_inputs``) holds every input with the row as its
first dimension, so ``Batch.select`` (micro-batches, mini-batches, ranks' shares) keeps each row's pictures;
rows of different sizes are zero-padded (``stack_rows``). Per family (docs/vision.md):

- LLaVA: ``pixel_values`` [1, 3, H, W], as the processor gives it (one picture per prompt: ``to_rows``).
- Idefics3 / SmolVLM: ``pixel_values`` [1, n, 3, H, W] and ``pixel_attention_mask`` [1, n, H, W]; a row with
  fewer (sub-)pictures is padded with all-zero ones, which the model's forward drops.
- Qwen2-VL / Qwen2.5-VL: the processor flattens the patches of all pictures into ``pixel_values`` [P, D] with
  ``image_grid_thw`` [n, 3] (P = sum of t * h * w). ``to_rows`` makes them [1, P, D] and [1, n, 3] (padding:
  zero patches and zero grid rows); ``forward_inputs`` concatenates the rows' real patches and grids back.
  ``mm_token_type_ids`` (1 on image tokens), which the model needs for its 3-D rotary positions (M-RoPE), covers
  the prompt only: it is not stored, ``forward_inputs`` derives it from the whole sequence's token ids.
  ``mrope_positions`` gives the positions and offsets the torch engine's prefill and decode steps pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from reinforge.errors import ConfigError

TOKEN_KEYS = ("input_ids", "attention_mask")  # the processor's outputs that are the tokens, not model inputs
GRID = "image_grid_thw"  # its presence marks the flattened-patches layout (Qwen-VL)
DERIVED = ("mm_token_type_ids",)  # per-token inputs recomputed from the token ids at each forward


def to_rows(outputs: dict[str, Any], where: str = "task") -> dict[str, Tensor]:
    """One prompt's processor outputs (tokens excluded) as its row of the batch record (leading dimension 1).
    A family with one ``pixel_values`` row per picture (LLaVA's [n, 3, H, W]) takes one picture per prompt: n
    rows would be n rows of the record, so more is refused (``where`` names the task)."""
    inputs = {k: v for k, v in outputs.items() if k not in TOKEN_KEYS and k not in DERIVED}
    if GRID in inputs:  # flattened patches [P, D] and grids [n, 3]: one row each
        return {k: v[None] for k, v in inputs.items()}
    wide = next((k for k, v in inputs.items() if getattr(v, "shape", (1,))[0] != 1), None)
    if wide is not None:
        raise ConfigError(f"{where}: the model's processor gives {wide} of {inputs[wide].shape[0]} rows (one per "
                          "picture); this family takes one picture per prompt here (docs/vision.md)")
    return inputs


def stack_rows(tensors: list[Tensor]) -> Tensor:
    """``tensors`` concatenated along the row dimension, each zero-padded to the largest size in every other
    dimension (rows with fewer patches or pictures: the module docstring says what each family's padding means)."""
    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    if all(list(t.shape[1:]) == shape for t in tensors):
        return torch.cat(tensors)
    out = tensors[0].new_zeros((sum(t.shape[0] for t in tensors), *shape))
    start = 0
    for t in tensors:
        out[(slice(start, start + t.shape[0]), *(slice(0, n) for n in t.shape[1:]))] = t
        start += t.shape[0]
    return out


def forward_inputs(model: nn.Module, input_ids: Tensor, inputs: dict[str, Tensor] | None) -> dict[str, Tensor]:
    """The keyword arguments of the model's forward for rows ``input_ids`` [N, L] with record rows ``inputs``."""
    if not inputs or GRID not in inputs:
        return dict(inputs or {})
    grid = inputs[GRID]  # [N, n, 3], zero rows after each row's pictures
    patches = grid.prod(-1).sum(-1).tolist()
    pixels = torch.cat([inputs["pixel_values"][i, :p] for i, p in enumerate(patches)])
    out = {k: v for k, v in inputs.items() if k not in ("pixel_values", GRID)}
    token = image_token_id(model)
    return {**out, "pixel_values": pixels, GRID: grid[grid.prod(-1) > 0],
            "mm_token_type_ids": (input_ids == token).long()}


def mrope_positions(model: nn.Module, input_ids: Tensor, attention: Tensor, kwargs: dict[str, Tensor]
                    ) -> tuple[Tensor, Tensor] | None:
    """The 3-D rotary positions [3, N, L] of left-padded prompts and each row's offset [N, 1] (the next token's
    positions are its 1-D position plus the offset), from the model's ``get_rope_index``; None for a model
    without M-RoPE."""
    owner = next((m for m in (model, getattr(model, "model", None)) if hasattr(m, "get_rope_index")), None)
    if owner is None or GRID not in kwargs:
        return None
    return owner.get_rope_index(input_ids, mm_token_type_ids=kwargs["mm_token_type_ids"], image_grid_thw=kwargs[GRID],
                                attention_mask=attention)


def image_token_id(model: nn.Module) -> int | None:
    """The vision-language model's image placeholder token (``image_token_id``, ``image_token_index``)."""
    cfg = model.config
    token = getattr(cfg, "image_token_id", None)
    return int(token) if token is not None else getattr(cfg, "image_token_index", None)
