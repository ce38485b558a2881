"""One policy per role: a LoRA adapter per trained role on one frozen base (``env.role_adapters``,
docs/multi_agent.md).

The policy of role rho is pi_rho = base + (alpha / r) B_rho A_rho. Every adapter lives on one peft model
(the base's weights exist once); adapter rho is named ``rho``. Role rho's update is the run's update
(learn/learner.py, the same objective, advantages and schedule) on the batch with each row's loss mask
restricted to rho's turns,

    m^rho_{i,t} = m_{i,t} * [turn_roles_{i,t} = key(rho)]          (``turn_roles``: orchestrate/roles.py)

run with adapter rho active and its own optimizer (AdamW over A_rho, B_rho only), schedule and shuffling
stream: a step trains every adapter on its own role's tokens, as a single-adapter run on those tokens
alone would (tested), and no adapter receives a gradient from another role's tokens (the other adapters
are inactive in its forward). Rows are kept whole (a row without a turn of rho has m^rho = 0 and adds
nothing but its forward); the advantage estimator sees m^rho, which leaves ``at_grpo`` and ``role_ema``
per role unchanged (both compute each role's credit from its own turns). A role without a trained token in
the batch is not updated that step (no optimizer step: AdamW's moments would move its adapter on a zero
gradient; its schedule does not advance).

Rollout: the collector asks the engine for each turn of role rho with adapter rho
(``GenerationRequest.adapter``); a role without an adapter (not listed) is played by the base.
The engine receives every adapter's A and B after each update (adapter-only sync, docs/lora.md).

Checkpoints: ``trainer.pt`` holds every role's learner state (optimizer, schedule, shuffling stream,
controllers) and its adapter's tensors; the checkpoint's adapter files (peft's format, what
``reinforge export`` merges) are the first role's adapter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from reinforge.algo.role_credit import ROLES, role_key
from reinforge.config import AlgoConfig, LoraConfig, RolloutConfig, RunConfig, TrainConfig
from reinforge.errors import ConfigError
from reinforge.learn.learner import Learner
from reinforge.learn.lora import peft_config, restore_adapter, wrap_lora
from reinforge.models.adapters import quiet_peft
from reinforge.types import Batch


def add_role_adapters(model: nn.Module, lora: LoraConfig, roles: Sequence[str], base_path: str | None,
                      seed: int) -> nn.Module:
    """The peft model with one adapter per role (named by the role), adapter k initialised from
    ``seed + k`` alone (A random, B = 0: every role starts as the base)."""
    peft = wrap_lora(model, lora, base_path, seed=seed, adapter_name=roles[0])
    for k, role in enumerate(roles[1:], start=1):
        with torch.random.fork_rng(devices=[]), quiet_peft():
            torch.manual_seed(seed + k)
            peft.add_adapter(role, peft_config(lora))
    return peft


def role_batch(batch: Batch, role: str) -> Batch:
    """``batch`` with each row's loss mask restricted to ``role``'s turns (``turn_roles``); the other
    tensors are shared, the learner's fields (advantages, old log-probs, ...) are the copy's own."""
    keys = batch.extra.get(ROLES)
    if keys is None:
        raise ConfigError("env.role_adapters: the batch has no turn_roles field (the run's advantage must read it: "
                          "algo.advantage=at_grpo or role_ema)")
    mask = batch.loss_mask * (keys == role_key(role)).to(batch.loss_mask.dtype)
    return dataclasses.replace(batch, loss_mask=mask, extra=dict(batch.extra))


class RoleAdapters:
    """The learner of a run with ``env.role_adapters``: one ``Learner`` per role over one peft model,
    each over its own adapter (the loop calls ``prepare``, ``estimate_advantages``, ``update`` as on a
    ``Learner``). ``train/<metric>`` is the mean over roles (``updates``: the sum), and each role's own
    is ``train/role/<role>/<metric>``."""

    def __init__(self, model: nn.Module, roles: Sequence[str], train: TrainConfig, algo: AlgoConfig,
                 rollout: RolloutConfig, lora: LoraConfig, base_path: str | None = None, seed: int = 0,
                 teacher: nn.Module | None = None) -> None:
        if not roles or len(set(roles)) != len(roles):
            raise ConfigError(f"env.role_adapters: {list(roles)}: give each role once")
        self.roles = list(roles)
        self.model = add_role_adapters(model, lora, self.roles, base_path, seed)
        self.learners: dict[str, Learner] = {}
        for role in self.roles:  # the active adapter's parameters alone require grad: its optimizer's
            self.model.set_adapter(role)
            self.learners[role] = Learner(self.model, train, algo, rollout, seed=seed, teacher=teacher)
        self.ref_model = None  # the reference is the base, adapters disabled
        self._batches: tuple[Batch, dict[str, Batch]] | None = None

    @classmethod
    def for_run(cls, model: nn.Module, cfg: RunConfig, teacher: nn.Module | None = None) -> RoleAdapters:
        assert cfg.env.role_adapters
        return cls(model, cfg.env.role_adapters, cfg.train, cfg.algo, cfg.rollout, cfg.model.lora,
                   base_path=cfg.model.path, seed=cfg.seed, teacher=teacher)

    @property
    def checkpoint_adapter(self) -> str:
        """The adapter the checkpoint's peft files hold (the others are in ``trainer.pt``)."""
        return self.roles[0]

    def _use(self, role: str) -> Learner:
        self.model.set_adapter(role)
        return self.learners[role]

    def _role_batches(self, batch: Batch) -> dict[str, Batch]:
        if self._batches is None or self._batches[0] is not batch:
            masked = {role: role_batch(batch, role) for role in self.roles}
            self._batches = (batch, {role: b for role, b in masked.items() if b.loss_mask.any()})
        return self._batches[1]

    # ------------------------------------------------------------------ update
    def prepare(self, batch: Batch) -> None:
        """Every role's no-grad passes on its masked copy of ``batch``, under its adapter."""
        for role, b in self._role_batches(batch).items():
            self._use(role).prepare(b)

    def estimate_advantages(self, batch: Batch) -> None:
        """Every role's advantages on its own tokens; ``batch.advantages`` gets each role's on its turns."""
        combined = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        for role, b in self._role_batches(batch).items():
            self._use(role).estimate_advantages(b)
            assert b.advantages is not None
            combined = torch.where(b.loss_mask != 0, b.advantages.to(combined.dtype), combined)
        batch.advantages = combined

    def update(self, batch: Batch) -> dict[str, float]:
        """One update of every role's adapter on its own tokens (prepared here unless the loop has)."""
        batches = self._role_batches(batch)
        if any(self.learners[r]._prepared is None or self.learners[r]._prepared[0] is not b
               for r, b in batches.items()):
            self.prepare(batch)
            self.estimate_advantages(batch)
        per_role = {}
        for role, b in batches.items():
            learner = self._use(role)
            per_role[role] = learner.update(b)
            learner.optimizer.zero_grad(set_to_none=True)  # its gradients must not reach another role's clipping
        self._batches = None
        return _combine(per_role)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_model(self) -> nn.Module:
        self.model.set_adapter(self.checkpoint_adapter)
        return self.model

    def state_dict(self) -> dict:
        from peft import get_peft_model_state_dict

        return {"roles": {role: {
            "learner": learner.state_dict(),
            "adapter": {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(
                self.model, adapter_name=role, save_embedding_layers=False).items()},
        } for role, learner in self.learners.items()}}

    def load_state_dict(self, state: dict) -> None:
        from peft import set_peft_model_state_dict

        saved = state.get("roles")
        if saved is None or set(saved) != set(self.roles):
            raise ConfigError(f"env.role_adapters={self.roles}: the checkpoint holds adapters for "
                              f"{sorted(saved) if saved is not None else 'no roles'}")
        device = next(self.model.parameters()).device
        for role, learner in self.learners.items():
            tensors = {k: v.to(device) for k, v in saved[role]["adapter"].items()}
            with torch.no_grad():
                result = set_peft_model_state_dict(self.model, tensors, adapter_name=role)
            if result.unexpected_keys:
                raise ConfigError(f"role {role}: adapter tensors the model has no place for: {result.unexpected_keys[:3]}")
            learner.load_state_dict(saved[role]["learner"])

    def restore_policy(self, ckpt, dtype: str = "float32", device: str = "cpu") -> None:  # type: ignore[no-untyped-def]
        """The checkpoint's adapter files into the first role's adapter (the others come with
        ``load_state_dict``, from ``trainer.pt``)."""
        restore_adapter(self.model, ckpt, self.checkpoint_adapter)


def _combine(per_role: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each role's metrics under ``role/<role>/``, and their mean over the roles that have them (``updates``:
    their sum)."""
    out: dict[str, float] = {}
    names = dict.fromkeys(k for metrics in per_role.values() for k in metrics)
    for name in names:
        values = [m[name] for m in per_role.values() if name in m]
        out[name] = float(sum(values)) if name == "updates" else float(sum(values) / len(values))
    for role, metrics in per_role.items():
        out.update({f"role/{role}/{k}": v for k, v in metrics.items()})
    return out

