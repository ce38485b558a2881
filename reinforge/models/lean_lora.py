"""Unmerged LoRA adapters in the lean forward: several adapters on one base, chosen per row (docs/lora.md).

``AdapterWeights`` is what an engine receives instead of merged weights (adapter-only sync): for each
adapted linear layer, under its plain HF module name, A [r, in], B [out, r] and the scale alpha / r.

``LeanAdapters`` holds the adapters an engine serves. For projection p of layer l the A of every
adapter adapting it are stacked into A_cat [sum r, in] and the scaled B side by side into
B_cat [out, sum r]; ``owner`` [sum r] names the adapter of each rank column. A row of adapter j gets

    delta(x) = ((x A_cat^T) * [owner == j]) B_cat^T = scale_j B_j A_j x

(the other adapters' columns masked to zero; index -1: no adapter, the base alone). Two thin matmuls
per adapted projection for the whole batch, whatever its mix of adapters, and no host synchronisation
(the mask is computed on the device), as in S-LoRA's/Punica's batched multi-adapter kernels
(arXiv 2311.03285, 2310.18547), here with dense masked matmuls instead of gathered ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from reinforge.models.packed_linear import GatedMLP

ADAPTABLE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


@dataclass
class AdapterWeights:
    """One LoRA adapter as an engine receives it: ``modules[name] = (A [r, in], B [out, r], scale)``
    for each adapted linear layer (plain HF module name, e.g. ``model.layers.0.self_attn.q_proj``);
    the layer computes ``W x + scale * B (A x)``."""

    modules: dict[str, tuple[Tensor, Tensor, float]]

    def nbytes(self) -> int:
        """Bytes of the tensors (what a sync sends)."""
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b, _ in self.modules.values())

    def to(self, device: torch.device | str, dtype: torch.dtype) -> AdapterWeights:
        """An own copy on ``device`` in ``dtype`` (the sender may keep changing its tensors)."""
        return AdapterWeights({name: (a.detach().to(device, dtype, copy=True), b.detach().to(device, dtype, copy=True),
                                      float(s)) for name, (a, b, s) in self.modules.items()})


def _place(name: str, n_layers: int) -> tuple[int, str]:
    """(layer, projection) of an adapted module's name; a ValueError for anything the lean forward lacks."""
    m = _MODULE.search(name)
    if m is None or m.group(2) not in ADAPTABLE or int(m.group(1)) >= n_layers:
        raise ValueError(f"adapter module {name!r}: the lean forward adapts only {', '.join(ADAPTABLE)} "
                         f"of layers 0..{n_layers - 1}")
    return int(m.group(1)), m.group(2)


class LeanAdapters:
    """The adapters a lean forward serves (by name; their index is their order of arrival)."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.adapters: dict[str, AdapterWeights] = {}
        self._cat: dict[tuple[int, str], tuple[Tensor, Tensor, Tensor]] = {}

    def __len__(self) -> int:
        return len(self.adapters)

    def index(self, name: str) -> int:
        return list(self.adapters).index(name)

    def set(self, name: str, weights: AdapterWeights) -> None:
        """Add adapter ``name`` or replace its tensors (``weights`` already on the forward's device and dtype)."""
        for module in weights.modules:
            _place(module, self.n_layers)
        self.adapters[name] = weights
        self._rebuild()

    def remove(self, name: str) -> None:
        del self.adapters[name]
        self._rebuild()

    def _rebuild(self) -> None:
        parts: dict[tuple[int, str], list[tuple[int, Tensor, Tensor]]] = {}
        for j, weights in enumerate(self.adapters.values()):
            for module, (a, b, scale) in weights.modules.items():
                parts.setdefault(_place(module, self.n_layers), []).append((j, a, b * scale))
        self._cat = {}
        for key, entries in parts.items():
            owner = torch.cat([torch.full((a.shape[0],), j, device=a.device) for j, a, _ in entries])
            self._cat[key] = (torch.cat([a for _, a, _ in entries]), torch.cat([b for _, _, b in entries], dim=1), owner)

    def delta(self, layer: int, proj: str, x: Tensor, rows: Tensor) -> Tensor | None:
        """The adapters' term of projection ``proj`` of ``layer`` for input ``x`` [B, ..., in], row b under
        adapter ``rows[b]`` (-1: none); None when no adapter adapts that projection."""
        entry = self._cat.get((layer, proj))
        if entry is None:
            return None
        a, b, owner = entry
        mask = rows.view(rows.shape + (1,) * (x.dim() - 1)) == owner
        return F.linear(F.linear(x, a) * mask.to(x.dtype), b)

    def qkv_delta(self, layer: int, h: Tensor, rows: Tensor, sizes: tuple[int, int, int], q_scale: float) -> Tensor | None:
        """The adapters' term of the fused q, k, v projection (the query's times ``q_scale``)."""
        parts = [self.delta(layer, p, h, rows) for p in ("q_proj", "k_proj", "v_proj")]
        if all(p is None for p in parts):
            return None
        if parts[0] is not None and q_scale != 1.0:
            parts[0] = parts[0] * q_scale
        return torch.cat([p if p is not None else h.new_zeros(*h.shape[:-1], n) for p, n in zip(parts, sizes,
                                                                                                strict=True)], dim=-1)

    def adapts_mlp(self, layer: int) -> bool:
        return any((layer, p) in self._cat for p in ("gate_proj", "up_proj", "down_proj"))

    def mlp(self, layer: int, mlp: GatedMLP, h: Tensor, residual: Tensor, rows: Tensor) -> Tensor:
        """``residual + down(silu(gate(h)) * up(h))`` with each projection's adapter term added (unfused)."""
        if mlp.packed:
            gate, up = mlp.gate(h), mlp.up(h)
        else:
            gate, up = F.linear(h, mlp.gate_up).chunk(2, dim=-1)
        gate = _plus(gate, self.delta(layer, "gate_proj", h, rows))
        up = _plus(up, self.delta(layer, "up_proj", h, rows))
        inner = F.silu(gate) * up
        down = mlp.down(inner) if mlp.packed else F.linear(inner, mlp.w_down)
        return residual + _plus(down, self.delta(layer, "down_proj", inner, rows))


def _plus(x: Tensor, delta: Tensor | None) -> Tensor:
    return x if delta is None else x + delta
