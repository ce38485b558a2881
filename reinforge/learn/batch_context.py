"""The one place a batch becomes the context record (``algo/context.py``) that advantage estimators,
policy losses and loss terms read: every field the batch holds, by the same name for every part, so
a part gets each field it names as a parameter whether it is an estimator or a loss.

The batch names some fields after what they are on the rollout side (``loss_mask``, ``*_logprobs``);
``BATCH_FIELDS`` maps the context's names to them. ``lengths`` is derived (trained tokens per row).
A field registered from outside (``algo.context.register_field``) lives in ``batch.extra`` by its name.
What the learner computes itself (the current policy's ``logp``, ``entropy``, ``logp_vocab``; an
``old_logp`` taken from the same forward) is passed in and overrides the batch.
"""

from __future__ import annotations

from torch import Tensor

from reinforge.algo.context import CONTEXT_FIELDS, EXTRA_FIELDS, Context
from reinforge.types import Batch

BATCH_FIELDS: dict[str, str] = {  # context field -> Batch attribute
    "mask": "loss_mask", "rewards": "rewards", "group_index": "group_index", "token_rewards": "token_rewards",
    "baseline": "baseline", "turn_returns": "turn_returns", "turn_states": "turn_states", "turn_index": "turn_index",
    "prompt_key": "prompt_key", "subgroups": "subgroups", "state_values": "state_values", "state_mask": "state_mask",
    "old_logp": "old_logprobs", "sampling_logp": "sampling_logprobs", "ref_logp": "ref_logprobs", "values": "values",
    "returns": "returns", "advantages": "advantages", "demo": "demo", "continues": "continues",
    "teacher_logp_vocab": "teacher_logprobs", "old_vocab_mean": "old_vocab_mean",
    "old_topk_index": "old_topk_index", "old_topk_logp": "old_topk_logp",
}
COMPUTED_FIELDS = CONTEXT_FIELDS - set(BATCH_FIELDS) - {"metadata"}
"""Not held by a batch: ``lengths`` (derived here) and what the learner's forward gives (the current
policy's log-probs, entropies and full rows)."""


def context_tensors(batch: Batch, names: frozenset[str] | set[str] | None = None, **computed: Tensor | None
                    ) -> dict[str, Tensor | None]:
    """The context's tensor fields of ``batch`` (only ``names`` when given), with ``computed`` ones."""
    wanted = (CONTEXT_FIELDS | EXTRA_FIELDS) - {"metadata"} if names is None else names
    out = {f: getattr(batch, attr) for f, attr in BATCH_FIELDS.items() if f in wanted}
    if "lengths" in wanted:
        out["lengths"] = batch.loss_mask.sum(-1)
    out.update({f: batch.extra.get(f) for f in EXTRA_FIELDS if f in wanted})  # registered fields
    out.update({k: v for k, v in computed.items() if k in wanted})
    return out


def batch_context(batch: Batch, **computed: Tensor | None) -> Context:
    """The whole context record of ``batch`` (``computed`` fields override the batch's)."""
    return Context.of(context_tensors(batch, None, **computed))
