"""One training client's model: its forward and backward passes, its optimizer steps and its checkpoints.

``TrainingState`` is what the service asks of a training client's model; ``OwnCopyTrainer`` gives
each client its own copy of the base model (LoRA adapters on it via ``learn/lora.py``, or every
weight trained). A shared-base implementation (several clients' adapters on one copy of the base)
fits the same interface. The pieces are reinforge's own: ``models/loading.py`` loads the base,
``learn/logprobs.token_logprobs`` computes the log-probabilities, the losses are the registered
parts ``service/losses.py`` names, ``learn/optim.build_optimizer`` builds AdamW, and
``learn/checkpoint.save_checkpoint`` writes checkpoints atomically.

Gradients of a ``forward_backward`` are computed into tensors of their own (``torch.autograd.grad``)
and added to the accumulated gradients only once the whole pass has succeeded; ``optim_step`` checks
that the accumulated gradients are finite before it touches a weight, then steps and clears them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from reinforge.service.losses import TinkerLoss, loss_inputs
from reinforge.service.schema import AdamParams, FieldError, LoraConfig

LORA_ALPHA = 32  # the update is (alpha / r) B A: a fixed alpha, so the learning rate's scale changes with r
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class PassResult:
    """One forward (and backward) pass: each datum's target log-probs and the metrics."""

    logprobs: list[np.ndarray]
    metrics: dict[str, float]


class TrainingState(Protocol):
    """What the service needs of a training client's model (whatever holds its weights)."""

    base_model: str
    lora: LoraConfig | None
    vocab_size: int

    def run(self, rows: list[list[int]], targets: list[list[int]], raw_inputs: list[dict[str, Any]],
            loss: tuple[str, TinkerLoss, dict[str, float]], backward: bool) -> PassResult: ...

    def optim_step(self, params: AdamParams) -> dict[str, float]: ...

    def save(self, directory: Path, tokenizer: Any) -> Path: ...

    def load(self, checkpoint: Path, optimizer: bool) -> None: ...

    def sampler_weights(self) -> dict[str, Tensor]: ...

    def named_trainable(self) -> dict[str, Tensor]: ...


def lora_targets(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """The module names Tinker's flags select that the model has (the unembedding only when it is not
    tied to the embedding: a LoRA on a tied head would be merged into the embedding too)."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()  # a LoRA-wrapped linear counts as its name
             if (isinstance(m, nn.Linear) or hasattr(m, "base_layer")) and ".lora_" not in n
             and not n.endswith("base_layer")}
    wanted = (ATTN if cfg.train_attn else ()) + (MLP if cfg.train_mlp else ())
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if cfg.train_unembed and not tied:
        wanted += ("lm_head",)
    found = [n for n in wanted if n in names]
    if not found:
        raise FieldError("lora_config", f"no module of the model matches; its linear layers are {sorted(names)}")
    return found


class OwnCopyTrainer:
    """A training client on its own copy of the base model (``TrainingState``). ``adapter_name``: its
    LoRA adapter's name in ``model`` (``service/shared_base.py`` names one adapter a client)."""

    adapter_name = "default"

    def __init__(self, base_model: str, path: str, lora: LoraConfig | None, device: str = "cpu",
                 dtype: str = "float32") -> None:
        from reinforge.models.loading import load_model

        self.base_model, self.lora, self.device = base_model, lora, torch.device(device)
        model = load_model(path, dtype, device)
        self.vocab_size = int(model.config.vocab_size)
        if lora is not None:
            from reinforge.config import LoraConfig as RLora
            from reinforge.learn.lora import wrap_lora

            cfg = RLora(enabled=True, r=lora.rank, alpha=LORA_ALPHA, target_modules=lora_targets(model, lora))
            model = wrap_lora(model, cfg, base_path=path, seed=lora.seed or 0)
        self.model = model.eval()  # no dropout: a pass is a function of the weights and the data
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._new_optimizer()
        self._grads: list[Tensor] | None = None
        self._lock = threading.Lock()
        self.steps = 0

    def _new_optimizer(self) -> torch.optim.Optimizer:
        from reinforge.learn.optim import build_optimizer

        cfg = SimpleNamespace(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0, fused_optimizer=False, warmup_steps=0,
                              lr_schedule="constant", steps=1)
        return build_optimizer(self.params, cfg)[0]

    # ------------------------------------------------------------------------------------------ passes
    def run(self, rows: list[list[int]], targets: list[list[int]], raw_inputs: list[dict[str, Any]],
            loss: tuple[str, TinkerLoss, dict[str, float]], backward: bool) -> PassResult:
        """The loss summed over every token of every datum; with ``backward``, its gradient is added to
        the accumulated gradients (only once the whole pass has run)."""
        from reinforge.learn.logprobs import token_logprobs

        name, fn, config = loss
        self._activate()
        width = max(len(r) for r in rows) + 1
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for i, (row, target) in enumerate(zip(rows, targets, strict=True)):
            full = row + target[-1:]  # target t is row t + 1: the whole sequence is the row and its last target
            ids[i, :len(full)] = torch.tensor(full, device=self.device)
            mask[i, :len(full)] = 1
        inputs = loss_inputs(fn, name, raw_inputs, (len(rows), width - 1), self.device)
        with torch.set_grad_enabled(backward):
            logp = token_logprobs(self.model, ids, mask)[0][:, 1:] * inputs["mask"]
            total = fn.per_token(logp, inputs, config).sum()
            grads = torch.autograd.grad(total, self.params, allow_unused=True) if backward else None
        if grads is not None:
            self._accumulate(grads)
        out = logp.detach().float().cpu().numpy()
        return PassResult([out[i, :len(r)] for i, r in enumerate(rows)], {"loss:sum": float(total.detach())})

    def _accumulate(self, grads: tuple[Tensor | None, ...]) -> None:
        with self._lock:
            if self._grads is None:
                self._grads = [torch.zeros_like(p) for p in self.params]
            for acc, g in zip(self._grads, grads, strict=True):
                if g is not None:
                    acc.add_(g)

    @torch.no_grad()
    def optim_step(self, params: AdamParams) -> dict[str, float]:
        """One AdamW step with ``params`` on the accumulated gradients (zeros when none), which it clears.
        Non-finite gradients: no weight changes, the gradients are dropped and the step is refused."""
        with self._lock:
            grads, self._grads = self._grads, None
        grads = grads or [torch.zeros_like(p) for p in self.params]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads else \
            torch.zeros(())
        if not torch.isfinite(norm):
            raise FieldError("adam_params", "the accumulated gradients are not finite; no step was taken and "
                             "they were dropped")
        if params.grad_clip_norm > 0 and norm > params.grad_clip_norm:
            for g in grads:
                g.mul_(params.grad_clip_norm / (norm + 1e-6))
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g
        for group in self.optimizer.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                         weight_decay=params.weight_decay)
        self.optimizer.step()
        for p in self.params:
            p.grad = None
        self.steps += 1
        return {"grad_norm": float(norm)}

    # ------------------------------------------------------------------------------------------ state
    def save(self, directory: Path, tokenizer: Any) -> Path:
        """The weights (the adapter alone for LoRA) and the optimizer, atomically (``save_checkpoint``)."""
        from reinforge.learn.checkpoint import save_checkpoint

        trainer_state = {"optimizer": self.optimizer.state_dict(), "steps": self.steps}
        state = {"base_model": self.base_model, "lora": self.lora.model_dump() if self.lora else None}
        return save_checkpoint(directory, 0, self.model, tokenizer, trainer_state, torch.Generator(), state, keep=1,
                               adapter_name=self.adapter_name)

    def load(self, checkpoint: Path, optimizer: bool) -> None:
        """The checkpoint's weights; its optimizer state too with ``optimizer``, a fresh optimizer otherwise.
        The accumulated gradients are dropped."""
        from reinforge.learn.checkpoint import restore_policy

        restore_policy(self.model, checkpoint, device=str(self.device), adapter_name=self.adapter_name)
        self.optimizer = self._new_optimizer()
        if optimizer:
            saved = torch.load(checkpoint / "trainer.pt", weights_only=False, map_location=self.device)
            self.optimizer.load_state_dict(saved["optimizer"])
            self.steps = int(saved.get("steps", 0))
        with self._lock:
            self._grads = None

    @torch.no_grad()
    def sampler_weights(self) -> dict[str, Tensor]:
        """A copy of the current weights under the plain model's names (LoRA merged)."""
        from reinforge.learn.lora import merged_weights

        self._activate()
        return {name: t.detach().clone() for name, t in merged_weights(self.model).items()}

    def named_trainable(self) -> dict[str, Tensor]:
        """The weights this client trains, under names without its adapter's name (copies)."""
        ids = {id(p) for p in self.params}
        return {n.replace(f".{self.adapter_name}.", "."): p.detach().clone() for n, p in self.model.named_parameters()
                if id(p) in ids}

    def _activate(self) -> None:
        """Make the model act as this client's (nothing to do on a copy of its own)."""
