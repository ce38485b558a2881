"""A lean inference forward for Llama-family HF models (Llama, Qwen2), reading the HF weights directly.

Like nanoGPT's model.py: the whole transformer on one screen, plain torch, no module hooks.
Q/K/V and gate/up projections are fused into one matmul each, the KV cache is preallocated
once per batch, and rotary tables come from the HF model's own ``rotary_emb`` (so static rope
scalings match). Used by the rollout engine for supported architectures (everything else falls
back to the HF forward); training's shared-prefix forward uses its rotary helpers and ``supports``.
A parity test checks its logits against HF. Unmerged LoRA adapters (``self.adapters``, several at once,
chosen per row by the ``adapters`` argument of each forward) add their terms to the projections
(models/lean_lora.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reinforge.models.lean_lora import LeanAdapters
from reinforge.models.packed_linear import GatedMLP, PackedLinear
from reinforge.models.precision import at_least_float32

SUPPORTED_MODEL_TYPES = {"llama", "qwen2"}


def supports(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") in {"dynamic", "longrope"}:
        return False
    if getattr(cfg, "mlp_bias", False) or getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    return getattr(cfg, "sliding_window", None) is None or not getattr(cfg, "use_sliding_window", False)


def rotary_cos_sin(inv_freq: Tensor, scale: float, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """HF-convention rotary tables for ``positions`` [B, T]: cos, sin of shape [B, 1, T, head_dim]."""
    freqs = positions[..., None].float() * inv_freq.float()
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1] (HF Llama convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class KVCache:
    """Preallocated keys and values: [layers, batch, kv_heads, max_len, head_dim] each."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, like: Tensor) -> None:
        shape = (layers, batch, kv_heads, max_len, head_dim)
        self.k = like.new_zeros(shape)
        self.v = like.new_zeros(shape)
        self.length = 0

    def repeat_interleave(self, repeats: int) -> None:
        """Give every sequence ``repeats`` copies of its cache (shared-prefix group sampling)."""
        self.k = self.k.repeat_interleave(repeats, dim=1)
        self.v = self.v.repeat_interleave(repeats, dim=1)


class SlotCache:
    """Keys and values of a fixed number of slots: [layers, slots, kv_heads, max_len, head_dim] each.

    Each slot holds one sequence from cache index 0, so a token's cache index is its position.
    """

    def __init__(self, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int, like: Tensor) -> None:
        shape = (layers, slots, kv_heads, max_len, head_dim)
        self.k = like.new_zeros(shape)
        self.v = like.new_zeros(shape)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    def keep(self, slots: Tensor) -> None:
        """Keep only ``slots`` (in that order): one copy that shrinks every later decode step."""
        self.k = self.k.index_select(1, slots)
        self.v = self.v.index_select(1, slots)


class LeanLlama:
    """Inference-only forward over an HF Llama/Qwen2 model's weights (fused copies refreshed by ``sync``)."""

    def __init__(self, hf_model: nn.Module) -> None:
        if not supports(hf_model):
            raise ValueError(f"LeanLlama does not support model_type {hf_model.config.model_type!r}")
        self.hf = hf_model
        cfg = hf_model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        self.n_layers = cfg.num_hidden_layers
        rotary = hf_model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.float()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.adapters = LeanAdapters(self.n_layers)
        self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        """Rebuild the fused (and, on CPU in fp32, oneDNN-packed) weights from the HF parameters
        (after they were updated in place)."""
        q_rows = self.n_heads * self.head_dim
        self.layers = []
        for layer in self.hf.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            qkv_bias = None
            if at.q_proj.bias is not None:
                qkv_bias = torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
            wqkv = torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])
            # the attention scale d^-1/2 folded into the query rows (rotary is linear): attention runs with scale 1
            scale = torch.ones(wqkv.shape[0], 1, dtype=wqkv.dtype, device=wqkv.device)
            scale[:q_rows] = self.head_dim ** -0.5
            self.layers.append({
                "ln1": layer.input_layernorm.weight,
                "qkv": PackedLinear(wqkv * scale, qkv_bias * scale[:, 0] if qkv_bias is not None else None),
                "o": PackedLinear(at.o_proj.weight, at.o_proj.bias),
                "ln2": layer.post_attention_layernorm.weight,
                "mlp": GatedMLP(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight),
            })
        self.embed = self.hf.model.embed_tokens.weight
        self.norm = self.hf.model.norm.weight
        self.head = PackedLinear(self.hf.lm_head.weight)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(self.n_layers, batch, self.n_kv, max_len, self.head_dim, self.embed)

    def new_slot_cache(self, slots: int, max_len: int) -> SlotCache:
        return SlotCache(self.n_layers, slots, self.n_kv, max_len, self.head_dim, self.embed)

    def _rms(self, x: Tensor, w: Tensor) -> Tensor:
        if x.dtype == torch.float32:  # one fused op (the same arithmetic as below)
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        xf = at_least_float32(x)
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


    def _rows(self, adapters: Tensor | None) -> Tensor | None:
        return adapters if adapters is not None and len(self.adapters) else None

    def _qkv(self, i: int, w: dict, h: Tensor, rows: Tensor | None) -> Tensor:
        """The fused q, k, v projection, queries pre-scaled by d^-1/2, adapters added."""
        out = w["qkv"](h)
        if rows is None:
            return out
        q_rows, kv_rows = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        delta = self.adapters.qkv_delta(i, h, rows, (q_rows, kv_rows, kv_rows), self.head_dim ** -0.5)
        return out if delta is None else out + delta

    def _attn_out(self, i: int, w: dict, att: Tensor, x: Tensor, rows: Tensor | None) -> Tensor:
        out = w["o"].fused(att, x, "add")
        delta = self.adapters.delta(i, "o_proj", att, rows) if rows is not None else None
        return out if delta is None else out + delta

    def _mlp(self, i: int, w: dict, x: Tensor, rows: Tensor | None) -> Tensor:
        h = self._rms(x, w["ln2"])
        if rows is None or not self.adapters.adapts_mlp(i):
            return w["mlp"](h, x)
        return self.adapters.mlp(i, w["mlp"], h, x, rows)

    @torch.no_grad()
    def forward(self, ids: Tensor, positions: Tensor, key_mask: Tensor, cache: KVCache,
                adapters: Tensor | None = None) -> Tensor:
        """Logits of the last position for ``ids`` [B, T] appended to ``cache``.

        ``positions`` [B, T] are rotary positions; ``key_mask`` [B, cache.length + T] is True for
        keys that may be attended to (False for padding); causality inside the new block is added here.
        ``adapters`` [B]: each row's adapter index in ``self.adapters`` (-1 or None: the base).
        """
        rows = self._rows(adapters)
        b, t = ids.shape
        start, end = cache.length, cache.length + t
        x = F.embedding(ids, self.embed)
        cos, sin = rotary_cos_sin(self.inv_freq, self.rope_scale, positions, x.dtype)
        causal = torch.ones(t, end, dtype=torch.bool, device=ids.device).tril(start)
        # every query may see its own key, so padded queries never have an all-masked row (NaN in SDPA)
        own_key = torch.arange(end, device=ids.device) == torch.arange(start, end, device=ids.device)[:, None]
        mask = (key_mask[:, None, None, :end] & causal) | own_key
        hq, hk, d = self.n_heads, self.n_kv, self.head_dim
        for i, w in enumerate(self.layers):
            h = self._rms(x, w["ln1"])
            q, k, v = self._qkv(i, w, h, rows).split([hq * d, hk * d, hk * d], dim=-1)
            q = apply_rotary(q.view(b, t, hq, d).transpose(1, 2), cos, sin)
            k = apply_rotary(k.view(b, t, hk, d).transpose(1, 2), cos, sin)
            cache.k[i, :, :, start:end] = k
            cache.v[i, :, :, start:end] = v.view(b, t, hk, d).transpose(1, 2)
            att = F.scaled_dot_product_attention(
                q, cache.k[i, :, :, :end], cache.v[i, :, :, :end], attn_mask=mask, enable_gqa=hq != hk, scale=1.0
            )  # queries pre-scaled
            x = self._attn_out(i, w, att.transpose(1, 2).reshape(b, t, hq * d), x, rows)
            x = self._mlp(i, w, x, rows)
        cache.length = end
        return self.head(self._rms(x[:, -1], self.norm))

    @torch.no_grad()
    def prefill_slots(self, ids: Tensor, lengths: Tensor, cache: SlotCache, slots: Tensor, source: Tensor,
                      adapters: Tensor | None = None) -> Tensor:
        """Run right-padded prompts ``ids`` [U, P] (``lengths`` [U]) and copy prompt ``source[j]``'s keys
        and values into slot ``slots[j]`` (one prompt may fill several slots: shared-prefix sampling).
        ``adapters`` [U]: each prompt's adapter index (-1 or None: the base).

        Returns the logits after each prompt's last token, [U, vocab].
        """
        rows = self._rows(adapters)
        u, t = ids.shape
        x = F.embedding(ids, self.embed)
        positions = torch.arange(t, device=ids.device).expand(u, t)
        cos, sin = rotary_cos_sin(self.inv_freq, self.rope_scale, positions, x.dtype)
        key_ok = positions < lengths[:, None]
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        mask = (key_ok[:, None, None, :] & causal) | torch.eye(t, dtype=torch.bool, device=ids.device)
        hq, hk, d = self.n_heads, self.n_kv, self.head_dim
        for i, w in enumerate(self.layers):
            h = self._rms(x, w["ln1"])
            q, k, v = self._qkv(i, w, h, rows).split([hq * d, hk * d, hk * d], dim=-1)
            q = apply_rotary(q.view(u, t, hq, d).transpose(1, 2), cos, sin)
            k = apply_rotary(k.view(u, t, hk, d).transpose(1, 2), cos, sin)
            v = v.view(u, t, hk, d).transpose(1, 2)
            cache.k[i, slots, :, :t] = k[source]
            cache.v[i, slots, :, :t] = v[source]
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hq != hk, scale=1.0)
            x = self._attn_out(i, w, att.transpose(1, 2).reshape(u, t, hq * d), x, rows)
            x = self._mlp(i, w, x, rows)
        last = x[torch.arange(u, device=ids.device), lengths - 1]
        return self.head(self._rms(last, self.norm))

    def rotary_table(self, max_len: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin [max_len, head_dim] for positions 0..max_len-1 (computed once, grown on demand)."""
        table = getattr(self, "_rotary_table", None)
        if table is None or table[0].shape[0] < max_len or table[0].device != device:
            positions = torch.arange(max_len, device=device)[None]
            cos, sin = rotary_cos_sin(self.inv_freq.to(device), self.rope_scale, positions, self.embed.dtype)
            self._rotary_table = table = (cos[0, 0], sin[0, 0])
        return table

    @torch.no_grad()
    def decode_slots(self, ids: Tensor, positions: Tensor, cache: SlotCache, width: int | None = None,
                     adapters: Tensor | None = None) -> Tensor:
        """One token per slot: ``ids`` [S] at ``positions`` [S] (= the slot's current length); writes its
        keys/values at that position and attends to positions <= it. Returns logits [S, vocab].
        ``width``: an upper bound of ``positions.max() + 1`` the caller knows (the attention window; none:
        read from ``positions``, a host synchronisation on a GPU). ``adapters`` [S]: each slot's adapter index.

        Decode-specific shortcuts: rotary from a precomputed table, one additive mask for all
        layers, the cache written with a single ``index_copy_`` per tensor, attention as two
        batched matmuls (one query per row, so no flash tiling is needed).
        """
        n, rows = ids.shape[0], self._rows(adapters)
        width = min(width, cache.k.shape[3]) if width is not None else int(positions.max()) + 1
        x = F.embedding(ids, self.embed)  # [S, hidden]
        cos_t, sin_t = self.rotary_table(cache.k.shape[3], ids.device)
        cos, sin = cos_t[positions][:, None, :], sin_t[positions][:, None, :]  # [S, 1, d]
        bias = torch.zeros(n, 1, width, dtype=x.dtype, device=ids.device)
        bias.masked_fill_(torch.arange(width, device=ids.device) > positions[:, None, None], float("-inf"))
        hq, hk, d = self.n_heads, self.n_kv, self.head_dim
        group = hq // hk
        max_len = cache.k.shape[3]
        # flat row of (slot, kv head, position) in a [S * kv * max_len, d] view of one layer's cache
        flat = ((torch.arange(n, device=ids.device)[:, None] * hk + torch.arange(hk, device=ids.device)) * max_len
                + positions[:, None]).reshape(-1)
        for i, w in enumerate(self.layers):
            h = self._rms(x, w["ln1"])
            qkv = self._qkv(i, w, h, rows).view(n, hq + 2 * hk, d)
            qk = apply_rotary(qkv[:, : hq + hk], cos, sin)  # queries and keys in one pass
            q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hk :]
            kc, vc = cache.k[i], cache.v[i]
            kc.view(-1, d).index_copy_(0, flat, k.reshape(-1, d))
            vc.view(-1, d).index_copy_(0, flat, v.reshape(-1, d))
            keys, values = kc[:, :, :width], vc[:, :, :width]  # [S, kv, W, d]
            qg = q.view(n, hk, group, d)
            scores = torch.matmul(qg, keys.transpose(-1, -2)) + bias[:, None]  # [S, kv, group, W], q pre-scaled
            att = torch.matmul(torch.softmax(at_least_float32(scores), dim=-1).to(values.dtype), values)  # [S, kv, group, d]
            x = self._attn_out(i, w, att.reshape(n, hq * d), x, rows)
            x = self._mlp(i, w, x, rows)
        return self.head(self._rms(x, self.norm))
