"""Several LoRA adapters trained on one frozen base (docs/lora.md, "Several adapters on one base").

N named adapters live on one peft model (peft's ``add_adapter`` / ``set_adapter``): the base's
weights exist once. Each adapter has its own optimizer (AdamW), learning-rate schedule
(``learn/optim.py``'s warm-up then constant or cosine), random stream (its initialisation and its
dropout) and checkpoint, so training it here gives what a run with that adapter alone gives (tested:
three adapters trained together equal three single-adapter runs).

The API (what a training service needs; ``MultiLora``):

- ``create_adapter(name, lora, seed, adam, schedule)``: A random (from ``seed`` alone), B = 0;
- ``forward_backward(input_ids, attention_mask, adapters, loss_fn)``: one batch whose rows may
  belong to several adapters; the forward runs per adapter (its rows, trimmed to their length) and
  ``loss_fn(logp, rows)`` gives that group's loss, whose gradient accumulates into its adapter;
- ``optim_step(name, adam)``: one AdamW step of one adapter (optionally new Adam hyper-parameters),
  then its schedule advances and its gradients are cleared;
- ``save_adapter(name, dir)`` / ``load_adapter(name, dir)``: the adapter in peft's format plus its
  optimizer, schedule, random stream and step count (``adapter_state.pt``);
- ``remove_adapter(name)``; ``adapter_weights(name)``: its A and B for an engine (adapter-only sync).

Loss functions, batching of requests and any queueing belong to the caller.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch
from torch import Tensor, nn

from reinforge.config import LoraConfig
from reinforge.errors import ConfigError
from reinforge.learn.logprobs import token_logprobs
from reinforge.learn.lora import (
    adapter_weights,
    check_targets,
    peft_config,
    restore_adapter,
    save_adapter,
    wrap_lora,
)
from reinforge.learn.optim import build_optimizer
from reinforge.models.adapters import quiet_peft
from reinforge.models.lean_lora import AdapterWeights
from reinforge.models.precision import compute_dtype

STATE_FILE = "adapter_state.pt"
LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss_fn(logp, rows)``: ``logp`` [b, L] the log-probs of one adapter's rows (``token_logprobs``:
column t is log p(x_t | x_<t), column 0 is 0), ``rows`` [b] their indices in the batch; a scalar loss."""


@dataclass(frozen=True)
class AdamParams:
    """AdamW's hyper-parameters for one adapter (``grad_clip`` > 0: clip its gradient norm first)."""

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 0.0


@dataclass(frozen=True)
class Schedule:
    """The learning-rate multiplier over an adapter's optimizer steps (``optim.lr_factor``)."""

    warmup_steps: int = 0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    steps: int = 1


@dataclass
class Adapter:
    """One adapter's training state besides its weights (which are in the peft model)."""

    lora: LoraConfig
    seed: int
    adam: AdamParams
    schedule: Schedule
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rng: Tensor  # the torch CPU generator's state of its stream (dropout)
    steps: int = 0
    params: list[nn.Parameter] = field(default_factory=list)


class MultiLora:
    """N LoRA adapters on one frozen base model (``model``: a plain HF causal LM, wrapped here)."""

    def __init__(self, model: nn.Module, base_path: str | None = None) -> None:
        self.base: nn.Module | None = model.requires_grad_(False)
        self.base_path = base_path
        self.model: nn.Module | None = None  # the peft model, made with the first adapter
        self.adapters: dict[str, Adapter] = {}

    @property
    def names(self) -> list[str]:
        return list(self.adapters)

    @property
    def device(self) -> torch.device:
        return next((self.model or self.base).parameters()).device  # type: ignore[union-attr]

    # ------------------------------------------------------------------ adapters
    def create_adapter(self, name: str, lora: LoraConfig | None = None, *, seed: int = 0,
                       adam: AdamParams | None = None, schedule: Schedule | None = None) -> None:
        """Add adapter ``name`` (``lora``: rank, alpha, target modules, dropout; its ``enabled`` is
        ignored) with A initialised from ``seed`` alone and B = 0, and its own AdamW and schedule."""
        if name in self.adapters:
            raise ValueError(f"adapter {name!r} exists; remove it first")
        if not name or "." in name or name in "lora_":
            raise ValueError(f"adapter name {name!r}: a non-empty name without dots, not part of peft's prefix 'lora_'")
        lora = lora or LoraConfig(enabled=True)
        if lora.bias != "none":
            raise ConfigError("adapters on a shared base train A and B only: lora.bias must be none")
        if self.model is None:
            self.model = wrap_lora(self.base, lora, self.base_path, seed=seed, adapter_name=name)
            self.base = None
        else:
            check_targets(self.model.get_base_model(), list(lora.target_modules))
            with torch.random.fork_rng(devices=[]), quiet_peft():
                torch.manual_seed(seed)
                self.model.add_adapter(name, peft_config(lora, self.model.get_base_model()))
        params = _adapter_params(self.model, name)
        for p in params:
            p.requires_grad_(True)
        adam, schedule = adam or AdamParams(), schedule or Schedule()
        optimizer, scheduler = build_optimizer(params, _optim_cfg(adam, schedule))
        rng = torch.Generator().manual_seed(seed).get_state()
        self.adapters[name] = Adapter(lora, seed, adam, schedule, optimizer, scheduler, rng, params=params)

    def remove_adapter(self, name: str) -> None:
        """Delete adapter ``name``: its weights, optimizer and state (the base stays)."""
        self._adapter(name)
        with warnings.catch_warnings():  # peft says which adapter it made active instead: none is, until a forward
            warnings.simplefilter("ignore", UserWarning)
            self.model.delete_adapter(name)  # type: ignore[union-attr]
        del self.adapters[name]

    def _adapter(self, name: str) -> Adapter:
        if name not in self.adapters:
            raise KeyError(f"no adapter {name!r} (there are {self.names})")
        return self.adapters[name]

    def adapter_weights(self, name: str) -> AdapterWeights:
        """Adapter ``name``'s A and B per module (its own tensors), as an engine takes them."""
        self._adapter(name)
        return adapter_weights(self.model, name)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ training
    def forward_backward(self, input_ids: Tensor, attention_mask: Tensor, adapters: Sequence[str],
                         loss_fn: LossFn) -> tuple[Tensor, dict[str, float]]:
        """Forward and backward of a batch whose row i belongs to adapter ``adapters[i]`` (right-padded
        ``input_ids`` [N, L]); gradients accumulate into each adapter until its ``optim_step``.
        Returns the log-probs [N, L] (detached) and each adapter's loss."""
        return self._run(input_ids, attention_mask, adapters, loss_fn)

    @torch.no_grad()
    def forward(self, input_ids: Tensor, attention_mask: Tensor, adapters: Sequence[str]) -> Tensor:
        """The log-probs [N, L] of every row under its adapter, no gradient."""
        return self._run(input_ids, attention_mask, adapters, None)[0]

    def _run(self, input_ids: Tensor, attention_mask: Tensor, adapters: Sequence[str],
             loss_fn: LossFn | None) -> tuple[Tensor, dict[str, float]]:
        if len(adapters) != input_ids.shape[0]:
            raise ValueError(f"{len(adapters)} adapter names for {input_ids.shape[0]} rows")
        logp = torch.zeros(input_ids.shape, dtype=compute_dtype(self._dtype), device=input_ids.device)
        losses: dict[str, float] = {}
        for name in dict.fromkeys(adapters):
            adapter = self._adapter(name)
            rows = torch.tensor([i for i, a in enumerate(adapters) if a == name], device=input_ids.device)
            width = int(attention_mask[rows].sum(-1).max())
            ids, mask = input_ids[rows, :width], attention_mask[rows, :width]
            self.model.set_adapter(name)  # type: ignore[union-attr]
            self.model.train(loss_fn is not None)  # type: ignore[union-attr]
            with self._stream(adapter):
                group, _ = token_logprobs(self.model, ids, mask)
            logp[rows, :width] = group.detach().to(logp.dtype)
            if loss_fn is not None:
                loss = loss_fn(group, rows)
                loss.backward()
                losses[name] = float(loss.detach())
        return logp, losses

    @property
    def _dtype(self) -> torch.dtype:
        return next((self.model or self.base).parameters()).dtype  # type: ignore[union-attr]

    @contextlib.contextmanager
    def _stream(self, adapter: Adapter) -> Iterator[None]:
        """Run with the adapter's own CPU random stream (its dropout), then keep where it got to."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(adapter.rng)
            yield
            adapter.rng = torch.get_rng_state()

    def optim_step(self, name: str, adam: AdamParams | None = None) -> dict[str, float]:
        """One AdamW step of adapter ``name`` on its accumulated gradients (``adam``: new hyper-parameters,
        kept for its later steps), then its schedule advances and its gradients are cleared."""
        adapter = self._adapter(name)
        if adam is not None:
            _set_adam(adapter, adam)
        out = {"lr": adapter.optimizer.param_groups[0]["lr"]}
        if adapter.adam.grad_clip > 0:
            out["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(adapter.params, adapter.adam.grad_clip))
        adapter.optimizer.step()
        adapter.scheduler.step()
        adapter.optimizer.zero_grad(set_to_none=True)
        adapter.steps += 1
        return out

    # ------------------------------------------------------------------ checkpoints
    def save_adapter(self, name: str, directory: str | Path) -> Path:
        """Adapter ``name`` into ``directory``: peft's files (``adapter_config.json``,
        ``adapter_model.safetensors``) and ``adapter_state.pt`` (optimizer, schedule, random stream, steps)."""
        adapter, directory = self._adapter(name), Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_adapter(self.model, directory, adapter_name=name)  # type: ignore[arg-type]
        torch.save({"optimizer": adapter.optimizer.state_dict(), "scheduler": adapter.scheduler.state_dict(),
                    "rng": adapter.rng, "steps": adapter.steps, "seed": adapter.seed, "lora": adapter.lora.model_dump(),
                    "adam": asdict(adapter.adam), "schedule": asdict(adapter.schedule)}, directory / STATE_FILE)
        return directory

    def load_adapter(self, name: str, directory: str | Path) -> None:
        """Adapter ``name`` as saved in ``directory`` (created if absent, else overwritten; an adapter
        saved without ``adapter_state.pt``, e.g. a LoRA run's checkpoint, gets a fresh optimizer)."""
        directory = Path(directory)
        state = torch.load(directory / STATE_FILE, weights_only=False, map_location="cpu") \
            if (directory / STATE_FILE).is_file() else None
        if name not in self.adapters:
            lora = LoraConfig(**state["lora"]) if state else _saved_lora(directory)
            adam = AdamParams(**{**state["adam"], "betas": tuple(state["adam"]["betas"])}) if state else None
            self.create_adapter(name, lora, seed=state["seed"] if state else 0, adam=adam,
                                schedule=Schedule(**state["schedule"]) if state else None)
        restore_adapter(self.model, directory, adapter_name=name)  # type: ignore[arg-type]
        if state is not None:
            adapter = self.adapters[name]
            adapter.optimizer.load_state_dict(state["optimizer"])
            adapter.scheduler.load_state_dict(state["scheduler"])
            adapter.rng, adapter.steps = state["rng"], state["steps"]


def _adapter_params(model: nn.Module, name: str) -> list[nn.Parameter]:
    """Adapter ``name``'s A and B of every adapted layer, in module order."""
    from peft.tuners.lora import LoraLayer

    return [p for m in model.modules() if isinstance(m, LoraLayer) and name in m.lora_A
            for p in (m.lora_A[name].weight, m.lora_B[name].weight)]


def _optim_cfg(adam: AdamParams, schedule: Schedule) -> SimpleNamespace:
    """What ``optim.build_optimizer`` reads (the ``train`` section's names)."""
    return SimpleNamespace(lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay,
                           fused_optimizer=False, **asdict(schedule))


def _set_adam(adapter: Adapter, adam: AdamParams) -> None:
    """New hyper-parameters for an adapter's later steps; the schedule multiplies the new ``lr``."""
    sched = adapter.scheduler
    sched.base_lrs = [adam.lr for _ in sched.base_lrs]
    factor = sched.lr_lambdas[0](sched.last_epoch)
    for group in adapter.optimizer.param_groups:
        group.update(lr=adam.lr * factor, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay)
    adapter.adam = adam


def _saved_lora(directory: Path) -> LoraConfig:
    """``LoraConfig`` of a peft adapter directory (rank, alpha, targets, dropout)."""
    import json

    cfg = json.loads((directory / "adapter_config.json").read_text())
    targets = cfg["target_modules"]
    return LoraConfig(enabled=True, r=cfg["r"], alpha=cfg["lora_alpha"], dropout=cfg.get("lora_dropout", 0.0),
                      target_modules=sorted(targets) if isinstance(targets, list | set) else [targets])
