"""Training forward for Llama-family models that computes each group's shared prompt once.

The G samples of one prompt share it token for token, so the prompt's hidden states, keys and
values are identical across the group. This forward runs the prompt once per group and lets
every completion attend to its group's prompt keys/values (gathered by index, so gradients from
all G completions accumulate into the one prompt pass). The result — log-probs, entropies and
their gradients — equals the ordinary forward over the G full sequences (tested against HF to
1e-5), at the cost of (prompt + G x completion) instead of G x (prompt + completion) tokens.
The prompts' positions and the completions' real tokens go through each norm, projection and MLP
as one set of rows (one call each, half the small operators of running them apart); only
attention treats them apart.

Reads the HF module's parameters directly (plain torch ops, autograd works); architectures other
than those ``LeanLlama`` supports use the HF forward instead. With ``checkpoint_layers`` each
layer runs under ``torch.utils.checkpoint`` (non-reentrant) when gradients are on: its activations
are recomputed in the backward instead of kept (``train.gradient_checkpointing``). With
``chunk_tokens`` > 0 the LM head runs over that many positions at a time (learn/lm_head.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from reinforge.algo.entropy import entropy_from_logits
from reinforge.learn.lm_head import chunked_token_logprobs
from reinforge.models.lean_llama import apply_rotary, rotary_cos_sin, supports
from reinforge.models.precision import at_least_float32

# On the CPU in bf16, torch's flash-attention kernel's backward is up to 5x slower than the math kernel's for
# short queries (14.1 ms against 2.7 ms at 96 rows x 4 heads x 6 queries x 13 keys), about even at 128 queries
# and ahead from 192 (benchmarks/bench_short_completions.py; benchmarks/BENCHMARKS.md, "Short completions").
MATH_ATTENTION_MAX_QUERIES = 128


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, gqa: bool) -> Tensor:
    """``softmax(q k^T / sqrt(d) + mask) v`` (``F.scaled_dot_product_attention``), through the math kernel
    on the CPU in bf16 (dtype or autocast) with at most ``MATH_ATTENTION_MAX_QUERIES`` queries; the same
    attention either way (the math kernel computes bf16 inputs in float32)."""
    bf16 = q.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                         and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    if q.device.type == "cpu" and bf16 and q.shape[-2] <= MATH_ATTENTION_MAX_QUERIES:
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class SharedPrefixForward:
    """Differentiable forward over (unique prompts, completions) for an HF Llama/Qwen2 model."""

    def __init__(self, model: nn.Module, checkpoint_layers: bool = False, chunk_tokens: int = 0) -> None:
        if not supports(model):
            raise ValueError(f"shared-prefix training does not support model_type {model.config.model_type!r}")
        cfg = model.config
        self.model = model
        self.checkpoint_layers = checkpoint_layers
        self.chunk_tokens = chunk_tokens
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        rotary = self.model.model.rotary_emb
        return rotary_cos_sin(rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)), positions, dtype)

    def _layer(self, layer: nn.Module, x: Tensor, rotary: tuple[Tensor, Tensor], mask_p: Tensor, mask_c: Tensor,
               group: Tensor, real: Tensor, shapes: tuple[int, int, int, int]) -> Tensor:
        """One decoder layer over ``x`` [U * P + T, D]: the U prompts' P positions, then the completions' T real
        tokens (at flat positions ``real`` of the padded [N, C] layout, where their attention runs). The norms,
        projections and MLP take all these rows in one call each; only attention splits them."""
        u, p, n, c = shapes
        up, d, gqa = u * p, self.head_dim, self.n_heads != self.n_kv
        cos, sin = rotary
        at = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rotary(at.q_proj(h).view(-1, self.n_heads, d), cos, sin)
        k = apply_rotary(at.k_proj(h).view(-1, self.n_kv, d), cos, sin)
        v = at.v_proj(h).view(-1, self.n_kv, d)

        def prompts(y: Tensor) -> Tensor:  # [U, heads, P, d]
            return y[:up].view(u, p, y.shape[1], d).transpose(1, 2)

        def placed(y: Tensor) -> Tensor:  # [N, heads, C, d], zeros at the padding (no real token attends to it)
            heads = y.shape[1]
            return y.new_zeros(n * c, heads, d).index_copy(0, real, y[up:]).view(n, c, heads, d).transpose(1, 2)

        kp, vp = prompts(k), prompts(v)
        att_p = attend(prompts(q), kp, vp, mask_p, gqa)
        # index_select, not kp[group], here and below: its backward is an index_add, the advanced index's a
        # slower index_put
        keys = torch.cat([kp.index_select(0, group), placed(k)], dim=2)
        values = torch.cat([vp.index_select(0, group), placed(v)], dim=2)
        att_c = attend(placed(q), keys, values, mask_c, gqa)
        att = torch.cat([att_p.transpose(1, 2).reshape(up, -1),
                         att_c.transpose(1, 2).reshape(n * c, -1).index_select(0, real)])
        x = x + at.o_proj(att)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def __call__(
        self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor,
        group: Tensor, temperature: float = 1.0, entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and entropies) of every completion token.

        ``prompt_ids`` [U, P] left-padded unique prompts (``prompt_mask`` 1 on real tokens);
        ``completion_ids`` [N, C] right-padded (``completion_mask`` 1 on each row's first tokens);
        ``group`` [N] the prompt row of each completion. Returns ([N, C], [N, C] or None): position j
        scores completion token j (zeros at the padding). Everything but attention runs on the T real
        completion tokens only, not on the N x C padded positions.
        """
        m = self.model.model
        n, c = completion_ids.shape
        dev = group.device
        pmask = prompt_mask.bool()
        real = completion_mask.flatten().nonzero().squeeze(1)
        p_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        c_pos = (prompt_mask.sum(-1)[group][:, None] + torch.arange(c, device=dev)).flatten()[real]
        targets = completion_ids.flatten()[real]
        u, p = prompt_ids.shape
        up = u * p  # x's first rows: the prompts' positions; then the completions' real tokens
        x = m.embed_tokens(torch.cat([prompt_ids.flatten(), targets]))
        cos, sin = (y.reshape(-1, 1, self.head_dim)
                    for y in self._cos_sin(torch.cat([p_pos.flatten(), c_pos])[None], x.dtype))
        mask_p, mask_c = self._masks(pmask, group, c)
        args = ((cos, sin), mask_p, mask_c, group, real, (u, p, n, c))
        recompute = self.checkpoint_layers and torch.is_grad_enabled()
        for layer in m.layers:
            if recompute:
                x = checkpoint(self._layer, layer, x, *args, use_reentrant=False)
            else:
                x = self._layer(layer, x, *args)
        # token j of a completion is predicted from the position before it: the prompt's last for j = 0, else
        # the real token just before it in the flat order (rows are right-padded, so it is real too)
        row, t = real // c, torch.arange(len(real), device=dev)
        before = torch.where(real % c == 0, row, n + t - 1)
        last = x[:up].view(u, p, -1)[:, -1]
        hidden = m.norm(torch.cat([last.index_select(0, group), x[up:]]).index_select(0, before))
        logp, ent = self._head(hidden, targets, temperature, entropy)

        def padded(x: Tensor) -> Tensor:
            return x.new_zeros(n * c).index_copy(0, real, x).view(n, c)

        return padded(logp), (padded(ent) if ent is not None else None)

    def _masks(self, pmask: Tensor, group: Tensor, c: int) -> tuple[Tensor, Tensor]:
        """The prompts' causal masks over their real tokens [U, 1, P, P] (a padding query sees itself, so no row
        is empty) and the completions' [N, 1, C, P + C]: their prompt's real tokens, then causal."""
        dev, (n, p) = group.device, (len(group), pmask.shape[1])
        own = torch.eye(p, dtype=torch.bool, device=dev)
        mask_p = (pmask[:, None, None, :] & torch.ones(p, p, dtype=torch.bool, device=dev).tril()) | own
        causal_c = torch.ones(c, c, dtype=torch.bool, device=dev).tril()
        mask_c = torch.cat([pmask[group][:, None, None, :].expand(n, 1, c, p), causal_c.expand(n, 1, c, c)], dim=-1)
        return mask_p, mask_c

    def _head(self, hidden: Tensor, targets: Tensor, temperature: float, entropy: bool) -> tuple[Tensor, Tensor | None]:
        """log pi(target) and the entropy at each of the T positions of ``hidden`` [T, D]."""
        if self.chunk_tokens > 0:
            logp, ent = chunked_token_logprobs(hidden[None], self.model.get_output_embeddings(), targets[None],
                                               temperature, self.chunk_tokens, entropy, entropy_grad=True)
            return logp[0], (ent[0] if ent is not None else None)
        logits = at_least_float32(self.model.lm_head(hidden))
        if temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
        return logp, (entropy_from_logits(logits) if entropy else None)


def shared_prefix_logprobs(
    fwd: SharedPrefixForward, input_ids: Tensor, attention_mask: Tensor, prefix_len: Tensor, group_index: Tensor,
    temperature: float = 1.0, entropy: bool = False,
) -> tuple[Tensor, Tensor | None] | None:
    """``token_logprobs``-compatible output ([N, L], column t scores token t) via the shared-prefix forward.

    Returns None when rows of one group do not share their prefix token for token (the caller
    then uses the ordinary forward).
    """
    n, width = input_ids.shape
    dev = input_ids.device
    groups, inverse = torch.unique(group_index, return_inverse=True)
    first = torch.full((len(groups),), n, dtype=torch.long, device=dev).scatter_reduce(
        0, inverse, torch.arange(n, device=dev), "amin"
    )
    plen = prefix_len[first]
    if not torch.equal(prefix_len, plen[inverse]) or int(plen.min()) < 1:
        return None
    p = int(plen.max())
    cols = torch.arange(p, device=dev)
    src = (cols - (p - plen)[:, None]).clamp(min=0)
    prompt_ids = input_ids[first].gather(1, src)
    prompt_mask = (cols >= (p - plen)[:, None]).long()
    mine = input_ids.gather(1, (cols - (p - prefix_len)[:, None]).clamp(min=0))
    if not torch.equal(mine * prompt_mask[inverse], prompt_ids[inverse] * prompt_mask[inverse]):
        return None
    lengths = attention_mask.sum(-1)
    c = int((lengths - prefix_len).max())
    if c <= 0:
        zeros = input_ids.new_zeros(input_ids.shape, dtype=torch.float32)
        return zeros, (zeros.clone() if entropy else None)
    j = torch.arange(c, device=dev)
    pos = (prefix_len[:, None] + j).clamp(max=width - 1)
    cmask = (j < (lengths - prefix_len)[:, None]).float()
    completion_ids = input_ids.gather(1, pos) * cmask.long()
    logp_c, ent_c = fwd(prompt_ids, prompt_mask, completion_ids, cmask, inverse, temperature, entropy)
    logp = logp_c.new_zeros(n, width).scatter_add(1, pos, logp_c * cmask)
    ent = logp_c.new_zeros(n, width).scatter_add(1, pos, ent_c * cmask) if ent_c is not None else None
    return logp, ent
