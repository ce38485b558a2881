"""Per-token log-probabilities and entropies of sequences under a model."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reinforge.algo.entropy import entropy_from_logits
from reinforge.errors import ConfigError
from reinforge.learn.lm_head import chunked_token_logprobs, final_hidden
from reinforge.models.precision import at_least_float32
from reinforge.models.vlm_inputs import forward_inputs


def token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int = 0,
    model_inputs: dict[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log p(x_t | x_<t) under softmax(z / T) for t >= 1, aligned with ``input_ids`` (column 0 is 0).

    Returns (logp [N, L], entropy [N, L] or None); the entropy carries a gradient only with
    ``entropy_grad`` (an entropy bonus), otherwise it is a detached statistic. ``chunk_tokens`` > 0:
    the LM head runs over that many positions at a time (learn/lm_head.py; the same values, without
    the [N, L, V] logits); 0: the model's own forward. ``model_inputs``: the rows' other inputs of the
    forward (a vision-language model's ``pixel_values``, ``Batch.model_inputs``; models/vlm_inputs.py turns the
    record's rows into the forward's arguments, and a Qwen-VL model computes its M-RoPE positions from them).
    """
    if chunk_tokens > 0 and model_inputs:
        raise ConfigError("train.logprob_chunk_tokens > 0 runs the language model's layers alone and cannot pass "
                          "pictures (model inputs " + ", ".join(sorted(model_inputs)) + "); set it to 0 for "
                          "vision-language runs")
    if chunk_tokens > 0:
        hidden = final_hidden(model, input_ids, attention_mask)[:, :-1]
        logp, ent = chunked_token_logprobs(hidden, model.get_output_embeddings(), input_ids[:, 1:], temperature,
                                           chunk_tokens, entropy, entropy_grad)
        zero = logp.new_zeros(logp.shape[0], 1)
        return torch.cat([zero, logp], dim=1), (torch.cat([zero, ent], dim=1) if ent is not None else None)
    logits = _next_token_logits(model, input_ids, attention_mask, temperature, model_inputs)
    return _taken(logits, input_ids, entropy, entropy_grad)


def vocab_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    model_inputs: dict[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """``token_logprobs`` of the same forward plus the full rows log softmax(z / T) [N, L, V] (row t:
    the distribution of token t given x_<t, aligned like the log-probs), kept on the positions where
    ``loss_mask`` is set, zeros elsewhere; one log-softmax serves the rows and the taken tokens' log-probs.
    Memory: the rows are N x L x V floats, as the forward's own logits (full rows by definition: never
    chunked, whatever ``train.logprob_chunk_tokens``)."""
    logits = _next_token_logits(model, input_ids, attention_mask, temperature, model_inputs)
    log_sm = torch.log_softmax(logits, dim=-1)
    logp, ent = _taken(logits, input_ids, entropy, entropy_grad, log_sm)
    keep = (loss_mask[:, 1:] > 0)[..., None]
    rows = torch.cat([log_sm.new_zeros(log_sm.shape[0], 1, log_sm.shape[2]),
                      torch.where(keep, log_sm, torch.zeros((), dtype=log_sm.dtype))], dim=1)
    return logp, ent, rows


def _next_token_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float,
                       model_inputs: dict[str, Tensor] | None = None) -> Tensor:
    """z_t / T for predicting token t + 1 (the last position's logits dropped), at least float32."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                   **forward_inputs(model, input_ids, model_inputs)).logits[:, :-1]
    logits = at_least_float32(logits)
    return logits / temperature if temperature != 1.0 else logits


def _taken(logits: Tensor, input_ids: Tensor, entropy: bool, entropy_grad: bool, log_sm: Tensor | None = None
           ) -> tuple[Tensor, Tensor | None]:
    """The taken tokens' log-probs (from ``log_sm``, the log-softmax of ``logits``, when the caller has it)
    and the entropies, each with a leading zero column (position 0 has no prediction)."""
    log_sm = torch.log_softmax(logits, dim=-1) if log_sm is None else log_sm
    logp = log_sm.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    zero = logp.new_zeros(logp.shape[0], 1)
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = torch.cat([zero, entropy_from_logits(logits)], dim=1)
    return torch.cat([zero, logp], dim=1), ent
