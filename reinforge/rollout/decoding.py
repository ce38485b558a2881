"""The torch engine's decoding state: static-batch decoders (HF forward, lean forward), padding, and
the output and slot tensors of continuous batching (reinforge/rollout/torch_engine.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from reinforge.models.lean_llama import LeanLlama
from reinforge.models.vlm_inputs import forward_inputs, mrope_positions


class HFDecoder:
    """Decode steps through the HF model's own forward and cache (any causal LM)."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.cache = model, None
        self.mrope_offset: Tensor | None = None  # [rows, 1]: M-RoPE's next position minus the 1-D one (Qwen-VL)

    def start(self, ids: Tensor, attention: Tensor, repeat: int, **model_inputs: Tensor) -> Tensor:
        """Prefill each prompt once, then share its cache among its ``repeat`` samples; ``model_inputs``
        (a vision-language model's ``pixel_values``, ...: the batch record's rows, models/vlm_inputs.py) go to
        this forward only. A model with 3-D rotary positions (M-RoPE) gets them from its ``get_rope_index``."""
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        kwargs = forward_inputs(self.model, ids, model_inputs)
        mrope = mrope_positions(self.model, ids, attention, kwargs)
        if mrope is not None:
            positions, self.mrope_offset = mrope[0], mrope[1].repeat_interleave(repeat, dim=0)
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, **kwargs)
        self.cache = out.past_key_values
        if repeat > 1:
            self.cache.batch_repeat_interleave(repeat)
        return out.logits[:, -1].repeat_interleave(repeat, dim=0)

    def step(self, ids: Tensor, attention: Tensor, positions: Tensor) -> Tensor:
        if self.mrope_offset is not None:  # a text token's three M-RoPE positions are equal: 1-D + offset
            positions = (positions + self.mrope_offset)[None].expand(3, -1, -1)
        out = self.model(
            input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=self.cache, use_cache=True
        )
        self.cache = out.past_key_values
        return out.logits[:, -1]


class LeanDecoder:
    """Decode steps through ``LeanLlama`` with a cache preallocated for the whole generation;
    ``adapters`` [prompts]: each prompt's adapter index (None: the base for all)."""

    def __init__(self, lean: LeanLlama, prompts: int, max_len: int, adapters: Tensor | None = None) -> None:
        self.lean, self.cache, self.adapters = lean, lean.new_cache(prompts, max_len), adapters

    def start(self, ids: Tensor, attention: Tensor, repeat: int) -> Tensor:
        """Prefill each prompt once, then share its cache among its ``repeat`` samples."""
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = self.lean.forward(ids, positions, attention.bool(), self.cache, self.adapters)
        if repeat > 1:
            self.cache.repeat_interleave(repeat)
        if self.adapters is not None:
            self.adapters = self.adapters.repeat_interleave(repeat)
        return logits.repeat_interleave(repeat, dim=0)

    def step(self, ids: Tensor, attention: Tensor, positions: Tensor) -> Tensor:
        return self.lean.forward(ids, positions, attention.bool(), self.cache, self.adapters)


def right_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> Tensor:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    return ids.to(device)


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError("empty prompt: a prompt needs at least one token (e.g. BOS)")
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


@dataclass
class SlotOutputs:
    """Per output row (request x sample): tokens, log-probs, policy versions [rows, max_new], length, stopped."""

    tok: Tensor
    lp: Tensor
    ver: Tensor
    len: Tensor
    stop: Tensor

    @classmethod
    def empty(cls, rows: int, max_new: int, pad_id: int, version: int, lp_dtype: torch.dtype,
              dev: torch.device) -> SlotOutputs:
        return cls(
            tok=torch.full((rows, max_new), pad_id, dtype=torch.long, device=dev),
            lp=torch.zeros(rows, max_new, device=dev, dtype=lp_dtype),
            ver=torch.full((rows, max_new), version, dtype=torch.long, device=dev),
            len=torch.full((rows,), max_new, dtype=torch.long, device=dev),
            stop=torch.zeros(rows, dtype=torch.bool, device=dev),
        )


@dataclass
class Slots:
    """Per cache slot: the output row it holds (-1: free), its next position (= cache length), the tokens
    generated so far, the logits of its next token and its LoRA adapter's index (-1: the base)."""

    row: Tensor
    pos: Tensor
    step: Tensor
    logits: Tensor
    adapter: Tensor

    @classmethod
    def empty(cls, n_slots: int, vocab: int, lp_dtype: torch.dtype, dev: torch.device) -> Slots:
        return cls(row=torch.full((n_slots,), -1, dtype=torch.long, device=dev),
                   pos=torch.zeros(n_slots, dtype=torch.long, device=dev),
                   step=torch.zeros(n_slots, dtype=torch.long, device=dev),
                   logits=torch.zeros(n_slots, vocab, device=dev, dtype=lp_dtype),
                   adapter=torch.full((n_slots,), -1, dtype=torch.long, device=dev))

    def keep(self, going: Tensor) -> None:
        """Compact to the slots ``going`` (the cache is compacted alongside)."""
        self.row, self.pos, self.step, self.logits = self.row[going], self.pos[going], self.step[going], self.logits[going]
        self.adapter = self.adapter[going]
