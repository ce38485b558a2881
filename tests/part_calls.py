"""Calling an advantage estimator or a policy loss from a test the way the learner does:
``Registry.call`` binds the part's parameters by name from a ``Context`` record, ``cfg`` is its settings.

``advantage(grpo_advantage, rewards, group_index, mask, values, cfg, token_rewards=...)`` takes the
rollout fields in the order of the estimators' former common signature, so a test passes what it
has and each part reads only what it declares.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.context import Context
from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.registry import Registry


def _name(registry: Registry, part: Any) -> str:
    """A part's registered name, from its name or its function."""
    return part if isinstance(part, str) else next(e.name for e in registry.entries() if e.fn is part)


def call(registry: Registry, part: Any, cfg: Any = None, **fields: Any) -> Any:
    """``part`` (a name or a registered function) called through ``registry.call`` over ``Context(**fields)``;
    ``cfg`` is its settings: a settings object, a mapping of options (validated by the part's settings
    model) or None (the defaults)."""
    name = _name(registry, part)
    if cfg is None or isinstance(cfg, dict):
        cfg = registry.entry(name).make_settings(cfg or {}, name)
    return registry.call(name, Context(**fields), cfg)


def advantage(part: Any, rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None = None,
              cfg: Any = None, **fields: Any) -> Tensor:
    return call(ADVANTAGES, part, cfg, rewards=rewards, group_index=group_index, mask=mask, values=values, **fields)


def policy_loss(part: Any, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: Any = None,
                **fields: Any) -> tuple[Tensor, dict[str, Tensor]]:
    return call(POLICY_LOSSES, part, cfg, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, **fields)
