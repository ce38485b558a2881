"""Per-token log-probabilities and entropies of sequences under a model."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reinforge.algo.losses import entropy_from_logits
from reinforge.models.precision import at_least_float32


def token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log p(x_t | x_<t) under softmax(z / T) for t >= 1, aligned with ``input_ids`` (column 0 is 0).

    Returns (logp [N, L], entropy [N, L] or None); the entropy carries a gradient only with
    ``entropy_grad`` (an entropy bonus), otherwise it is a detached statistic.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    logits = at_least_float32(logits)
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    zero = logp.new_zeros(logp.shape[0], 1)
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = torch.cat([zero, entropy_from_logits(logits)], dim=1)
    return torch.cat([zero, logp], dim=1), ent
