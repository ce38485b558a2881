"""The batch record's optional fields and the producers that write them.

A producer declares the batch fields it writes (``@produces("turn_states", "turn_index")``) and makes
them from the kept trajectories. ``build_batch`` runs every producer one of whose fields the run reads:
a field the run's estimator, policy loss or loss terms name as a parameter, or declare in ``needs``
(``algo/objective.py``: ``read_fields``). No field is computed that nobody reads, and none that a part
names is left None.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from reinforge.algo.context import EXTRA_FIELDS, register_field
from reinforge.algo.objective import read_fields
from reinforge.algo.returns import turn_returns
from reinforge.algo.role_credit import ROLE_RETURNS, ROLES
from reinforge.config import AlgoConfig
from reinforge.errors import ConfigError
from reinforge.orchestrate.roles import role_tensors
from reinforge.types import Batch, Trajectory

Make = Callable[[list[Trajectory], int, AlgoConfig], tuple[Tensor, ...]]


@dataclass(frozen=True)
class FieldProducer:
    """Writes ``writes`` (batch attributes, in order) from the kept trajectories, the batch width and the
    algorithm's settings."""

    writes: tuple[str, ...]
    make: Make


PRODUCERS: list[FieldProducer] = []
BATCH_ATTRIBUTES = frozenset(f.name for f in fields(Batch)) - {"extra"}


def produces(*writes: str) -> Callable[[Make], Make]:
    """Register ``make`` as the producer of the batch fields ``writes``. A name the batch record does not
    have yet becomes a new context field (``register_field``): parts read it by naming it, and it travels
    in ``Batch.extra``. A module imported again (a plug-in) replaces its own producer."""
    def deco(make: Make) -> Make:
        mine = [p for p in PRODUCERS if _where(p.make) == _where(make)]
        taken = {w for p in PRODUCERS if p not in mine for w in p.writes} & set(writes)
        if taken:
            raise ConfigError(f"batch fields {sorted(taken)} already have a producer")
        for name in writes:
            if name not in BATCH_ATTRIBUTES and name not in EXTRA_FIELDS:
                register_field(name)
        PRODUCERS[:] = [p for p in PRODUCERS if p not in mine] + [FieldProducer(tuple(writes), make)]
        return make
    return deco


def produce_fields(batch: Batch, kept: list[Trajectory], algo: AlgoConfig) -> None:
    """Every producer whose fields the run reads writes them into ``batch``."""
    wanted, width = read_fields(algo), batch.input_ids.shape[1]
    for producer in PRODUCERS:
        if wanted & set(producer.writes):
            for name, value in zip(producer.writes, producer.make(kept, width, algo), strict=True):
                if name in BATCH_ATTRIBUTES:
                    setattr(batch, name, value)
                else:
                    batch.extra[name] = value


def _where(fn: Callable) -> tuple:
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)


@produces("turn_returns")
def _turn_returns(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return (turn_return_tensor(kept, width, algo.discount.gamma),)


@produces("turn_states", "turn_index")
def _turn_states(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return turn_state_tensors(kept, width)


@produces("prompt_key")
def _prompt_key(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return (torch.tensor([stable_hash(t.task_id) for t in kept], dtype=torch.long),)


@produces("subgroups")
def _subgroups(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return (subgroup_tensor(kept),)


@produces("tree_nodes")
def _tree_nodes(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return (tree_node_tensor(kept, width),)


@produces("state_values", "state_mask")
def _state_values(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return state_value_tensors(kept, width)


@produces(ROLES, ROLE_RETURNS)
def _roles(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return role_tensors(kept, width, algo.discount.gamma)  # several roles in one episode: orchestrate/roles.py


def state_value_tensors(trajs: list[Trajectory], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, width] each: the Monte Carlo value of the state before each position listed in
    ``metadata['state_values']`` (``[[position, value], ...]``, orchestrate/state_values.py), 0 elsewhere,
    and 1 at those positions."""
    values, mask = torch.zeros((len(trajs), width)), torch.zeros((len(trajs), width))
    for i, t in enumerate(trajs):
        for pos, v in t.metadata.get("state_values", ()):
            values[i, int(pos)], mask[i, int(pos)] = float(v), 1.0
    return values, mask


def stable_hash(text: str) -> int:
    """A 64-bit signed integer key of ``text``, the same in every process and run (not Python's ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def turn_state_tensors(trajs: list[Trajectory], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, width] long each: at each model token, the hash of the state its turn acted from
    (``turn_states``) and the turn's index (``turn_index``, -1 off the model's turns). A trajectory
    without turns (single-turn) is one turn from the state of its prompt (its task id); a turn
    without a recorded state gets a key of its own (it joins no step group)."""
    states = torch.zeros((len(trajs), width), dtype=torch.long)
    index = torch.full((len(trajs), width), -1, dtype=torch.long)
    for i, t in enumerate(trajs):
        if not t.turn_spans:
            live = torch.tensor(t.loss_mask, dtype=torch.bool)
            index[i, : len(t.loss_mask)][live] = 0
            states[i, : len(t.loss_mask)][live] = stable_hash(f"prompt:{t.task_id}")
            continue
        for k, (start, end) in enumerate(t.turn_spans):
            key = t.turn_states[k] if k < len(t.turn_states) else f"unrecorded:{t.task_id}:{id(t)}:{k}"
            index[i, start:end] = k
            states[i, start:end] = stable_hash(key)
    return states, index


SUBGROUPS_PER_GROUP = 1 << 16  # subgroup id = group id * this + the subgroup's index within its group


def subgroup_tensor(trajs: list[Trajectory]) -> torch.Tensor:
    """[N, K] long: the ids of the subgroups each trajectory lists in ``metadata['subgroups']`` (names
    unique within its group), unique across groups and ranks (derived from the group id); -1 padding."""
    names: dict[int, dict[str, int]] = {}
    width = max((len(t.metadata.get("subgroups", ())) for t in trajs), default=0)
    out = torch.full((len(trajs), width), -1, dtype=torch.long)
    for i, t in enumerate(trajs):
        local = names.setdefault(t.group_id, {})
        for k, name in enumerate(t.metadata.get("subgroups", ())):
            out[i, k] = t.group_id * SUBGROUPS_PER_GROUP + local.setdefault(str(name), len(local))
    return out


def tree_node_tensor(trajs: list[Trajectory], width: int) -> torch.Tensor:
    """[N, width] long: at each generated token, the id (>= 1) of the tree node it belongs to, from
    ``metadata['tree_spans']`` (``[[start, name], ...]``, starts counted in the completion, names unique
    within its group; rollout/eptree.py), unique across groups; 0 where a trajectory lists none."""
    names: dict[int, dict[str, int]] = {}
    out = torch.zeros((len(trajs), width), dtype=torch.long)
    for i, t in enumerate(trajs):
        spans = t.metadata.get("tree_spans")
        if not spans or 1 not in t.loss_mask:
            continue
        first, local = t.loss_mask.index(1), names.setdefault(t.group_id, {})
        ends = [int(s) for s, _ in spans[1:]] + [len(t.token_ids) - first]
        for (start, name), end in zip(spans, ends, strict=True):
            node = t.group_id * SUBGROUPS_PER_GROUP + local.setdefault(str(name), len(local)) + 1
            out[i, first + int(start): first + end] = node
    return out


def turn_return_tensor(trajs: list[Trajectory], width: int, gamma: float) -> torch.Tensor:
    """[N, width]: at each model token, the discounted return from its turn on (``turn_returns``);
    a trajectory without turns (single-turn) has its reward on every token."""
    out = torch.zeros((len(trajs), width))
    for i, t in enumerate(trajs):
        if not t.turn_spans:
            out[i, : len(t.token_ids)] = t.reward
            continue
        for (start, end), g in zip(t.turn_spans, turn_returns(t.turn_rewards, gamma), strict=True):
            out[i, start:end] = g
    return out
