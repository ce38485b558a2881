"""The context record handed to every advantage estimator, policy loss and loss term.

A registered part names the fields it reads as its parameters (``Registry.call`` binds them); the
learner fills what the parts of the run declare. Shapes: N sequences, T token positions; [N, T]
tensors are aligned with the batch's ``input_ids`` and zero off the loss mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from torch import Tensor


@dataclass
class Context:
    """Everything a method may need; None where the run does not compute it.

    Rollout data: ``rewards`` [N] (outcome rewards), ``group_index`` [N] (long: the prompt each
    sequence answers), ``mask`` [N, T] (1 on trained tokens), ``lengths`` [N] (trained tokens per
    sequence), ``token_rewards`` [N, T] (per-token rewards, e.g. -beta * KL), ``baseline`` [N] (a
    per-sequence baseline reward, e.g. ReMax's greedy reward), ``turn_returns`` [N, T] (multi-turn:
    the discounted return from each token's turn on), ``turn_states`` [N, T] (long: a hash of the
    environment state each token's turn acted from, GiGPO's anchor states) and ``turn_index`` [N, T]
    (long: the model turn of each token, 0-based, -1 off the model's turns), ``prompt_key`` [N] (long:
    a hash of the task each sequence answers, for parts that keep per-prompt state across steps).
    ``subgroups`` [N, K] (long: the nested groups
    within its group each sequence belongs to, e.g. the subtrees of a tree sampler; -1 padding).
    ``state_values`` [N, T] (the Monte Carlo value of the state y_<t at each position t where one was
    estimated, 0 elsewhere; VinePPO) and ``state_mask`` [N, T] (1 at those positions).

    Log-probabilities [N, T]: ``logp`` (current policy, with gradient), ``old_logp`` (pi_old, the
    proximal policy of the PPO ratio), ``sampling_logp`` (the rollout engine's, the behaviour
    policy), ``ref_logp`` (the frozen reference), ``entropy`` (per-token entropy of the current
    policy; with gradient when a part reads it). ``old_vocab_mean`` [N, T]: pi_old's mean log-probability
    over the vocabulary at each position, (1/V) sum_a log pi_old(a | y_<t), from its no-grad pass (a part
    declares the need ``old_vocab_mean``; ROVER's value of a state under the uniform policy).
    ``old_topk_index`` [N, T, K] (long) and ``old_topk_logp`` [N, T, K]: a sparse support of pi_old at each
    position and its log-probabilities there, from the same pass (the taken token in slot 0, then pi_old's
    most probable others; a part declares the need ``old_topk``; TROLL's trust region).

    Full next-token distributions [N, T, V] (V: the vocabulary), computed only when a part reads
    them, rows of zeros off the loss mask: ``logp_vocab`` (log pi(. | y_<t) of the current policy,
    with gradient; ``logp`` is its entry at the taken token) and ``teacher_logp_vocab`` (a frozen
    teacher's, ``algo.teacher``; a part declares the need ``teacher_logp_vocab``), both at the
    training temperature.

    Masked pictures [N, T] (a part declares the need ``masked_pictures``; PAPO's): ``masked_logp`` and
    ``masked_entropy``, the current policy's log-probs and entropies (with gradient) from one more forward
    of the same rows with patches of each row's picture masked (learn/perception.py).

    Critic and credit [N, T]: ``values`` (V(s_t) at rollout time), ``returns`` (value targets),
    ``advantages``. ``demo`` [N] (bool): demonstration rows (given answers, not sampled; None when
    the batch has none); the policy loss and the other terms are aggregated over the other rows,
    the terms that need ``demonstrations`` over these. ``continues`` [N] (bool): rows whose generation
    goes on in a later step (T-PPO's truncated rollouts; None when none does): no outcome reward yet, the
    last token not terminal. ``metadata``: per-batch extras a plug-in may pass along.

    ``extra``: the fields registered from outside this record (``register_field``; a plug-in's batch
    field producer, ``orchestrate/batch_fields.py``), read like the others: ``ctx.name``, or a part's
    parameter ``name``; None when the run did not produce it.
    """

    mask: Tensor
    rewards: Tensor | None = None
    group_index: Tensor | None = None
    lengths: Tensor | None = None
    token_rewards: Tensor | None = None
    baseline: Tensor | None = None
    turn_returns: Tensor | None = None
    turn_states: Tensor | None = None
    turn_index: Tensor | None = None
    prompt_key: Tensor | None = None
    subgroups: Tensor | None = None
    state_values: Tensor | None = None
    state_mask: Tensor | None = None
    logp: Tensor | None = None
    old_logp: Tensor | None = None
    sampling_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    entropy: Tensor | None = None
    old_vocab_mean: Tensor | None = None
    old_topk_index: Tensor | None = None
    old_topk_logp: Tensor | None = None
    logp_vocab: Tensor | None = None
    teacher_logp_vocab: Tensor | None = None
    masked_logp: Tensor | None = None
    masked_entropy: Tensor | None = None
    values: Tensor | None = None
    returns: Tensor | None = None
    advantages: Tensor | None = None
    demo: Tensor | None = None
    continues: Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Tensor | None] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:  # only reached for a name that is no declared field
        if name in EXTRA_FIELDS:
            return self.__dict__.get("extra", {}).get(name)
        raise AttributeError(f"the context record has no field {name!r}")

    @classmethod
    def of(cls, values: dict[str, Tensor | None]) -> Context:
        """The record of ``values`` (field name -> tensor), registered fields going to ``extra``."""
        return cls(**{k: v for k, v in values.items() if k in CONTEXT_FIELDS},
                   extra={k: v for k, v in values.items() if k in EXTRA_FIELDS})

    def tensors(self) -> dict[str, Tensor | None]:
        """The tensor fields by name (for gathering them over ranks), registered ones included."""
        declared = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("metadata", "extra")}
        return {**declared, **self.extra}


CONTEXT_FIELDS = frozenset(f.name for f in fields(Context)) - {"extra"}
EXTRA_FIELDS: set[str] = set()
PART_INPUTS: set[str] = set(CONTEXT_FIELDS | {"cfg"})
"""What an estimator's, policy loss's or loss term's parameters may name: a context field (declared above
or registered), or ``cfg`` (its settings); their registries refuse any other name when a part registers."""


def register_field(name: str) -> None:
    """Open the record to a new field ``name`` (a producer from outside the package writes it)."""
    if name in CONTEXT_FIELDS or name == "cfg" or not name.isidentifier():
        raise ValueError(f"context field {name!r}: the name is taken or not an identifier")
    EXTRA_FIELDS.add(name)
    PART_INPUTS.add(name)
