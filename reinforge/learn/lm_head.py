"""The LM head's per-token log-probs and entropies in chunks of positions (``train.logprob_chunk_tokens``).

The plain path materialises the logits of every position at once: N x T x V floats in float32, 2.4 GB
for 4096 positions of a 151936-token vocabulary, and autograd keeps them (and the log-softmax) for
the backward. Here the final hidden states h [N, T, H] are computed once; the rows of h are cut into
chunks of ``chunk_tokens`` positions, and for each chunk

    z = lm_head(h_chunk) (upcast to float32),  log p = log_softmax(z / T),
    logp_t = log p[y_t],  H_t = -sum_v p_v log p_v,

under ``torch.utils.checkpoint`` (non-reentrant) when gradients are on: the backward recomputes the
chunk's logits (one more lm_head forward per chunk) instead of storing them, so at most one chunk's
chunk_tokens x V floats live at a time, forward or backward. The arithmetic per position is the
plain path's (TRL's and Liger-Kernel's chunked/fused LM-head losses take the same approach; Liger
fuses the head, softmax and gradient into one kernel, this is plain torch). Exact: the same values
and gradients as the plain path (tests/test_chunked_logprobs.py).

The hidden states are those the plain path feeds to ``lm_head``: the decoder's ``last_hidden_state``
(HF Llama/Qwen2 apply the final norm inside the decoder). A model whose causal-LM forward changes the
logits after ``lm_head`` (soft-capping, logit scales) is refused by ``check_plain_head``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from reinforge.errors import ConfigError
from reinforge.models.precision import at_least_float32, compute_dtype

# config fields of HF models whose causal-LM forward transforms the logits after lm_head (Gemma2/3's
# soft-capping, Cohere's logit_scale, Granite's logits_scaling, ...): lm_head(h) alone would differ
POST_HEAD_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")


def check_plain_head(model: nn.Module) -> None:
    """Raise ``ConfigError`` unless the model's logits are ``lm_head(decoder(x).last_hidden_state)``."""
    config = model.config
    for cfg in {id(c): c for c in (config, config.get_text_config())}.values():
        for field in POST_HEAD_FIELDS:
            value = getattr(cfg, field, None)
            if value is not None and not (isinstance(value, (int, float)) and value == 1):
                raise ConfigError(f"train.logprob_chunk_tokens > 0: {type(model).__name__} transforms its logits "
                                  f"after lm_head ({field}={value}); set train.logprob_chunk_tokens=0")


def final_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, **kwargs: Any) -> Tensor:
    """The hidden states the model's lm_head reads, [N, L, H]: its decoder's ``last_hidden_state`` (final
    norm applied). ``model`` may be peft-wrapped (the LoRA layers run, adapters disabled with them)."""
    decoder = model.get_decoder()
    return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).last_hidden_state


def chunked_token_logprobs(
    hidden: Tensor,
    lm_head: nn.Module,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(lm_head(h) / T)[y] and optionally the entropy, per position, ``chunk_tokens`` rows at a time.

    ``hidden`` [..., H] and ``targets`` [...] (the token each position predicts); returns (logp [...],
    entropy [...] or None), float32 (float64 for a float64 head). The entropy carries a gradient only
    with ``entropy_grad``. With gradients on, each chunk runs under a non-reentrant checkpoint.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 (got {chunk_tokens})")
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    y = targets.reshape(-1)
    recompute = torch.is_grad_enabled()
    logps: list[Tensor] = []
    ents: list[Tensor] = []
    for start in range(0, y.shape[0], chunk_tokens):
        args = (lm_head, h[start:start + chunk_tokens], y[start:start + chunk_tokens], temperature, entropy,
                entropy_grad)
        out = checkpoint(_head_chunk, *args, use_reentrant=False) if recompute else _head_chunk(*args)
        logps.append(out[0])
        if entropy:
            ents.append(out[1])
    if not logps:  # no positions at all
        logps = ents = [h.new_zeros(0, dtype=compute_dtype(h.dtype))]
    logp = torch.cat(logps).reshape(shape)
    return logp, (torch.cat(ents).reshape(shape) if entropy else None)


def _head_chunk(lm_head: nn.Module, h: Tensor, y: Tensor, temperature: float, entropy: bool, entropy_grad: bool
                ) -> tuple[Tensor, ...]:
    """One chunk: z = lm_head(h) in at least float32, / T; (log p[y], and -sum p log p with ``entropy``)."""
    logits = at_least_float32(lm_head(h))
    if temperature != 1.0:
        logits = logits / temperature
    log_sm = torch.log_softmax(logits, dim=-1)
    logp = log_sm.gather(-1, y[:, None]).squeeze(-1)
    if not entropy:
        return (logp,)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = -(log_sm.exp() * log_sm).sum(-1)
    return logp, ent
