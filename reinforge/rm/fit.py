"""The optimisation loop both reward-model trainers share (``reinforge rm`` and ``reinforge prm``):
AdamW with a separate head learning rate, warmup then a constant or cosine schedule (the RL
learner's ``learn.optim.lr_factor``), gradient
clipping, shuffled epochs of examples, a metrics record every step, a held-out figure every
``eval_every`` steps, console lines and a time limit."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from rich.console import Console
from torch import Tensor

from reinforge.learn.optim import lr_factor
from reinforge.rm.model import head_parameters
from reinforge.track.jsonl import JsonlSink

LossOf = Callable[[np.ndarray], tuple[Tensor, dict[str, Tensor]]]
HeldOut = Callable[[], tuple[str, float]]


def optimizer_for(model: torch.nn.Module, train: Any) -> torch.optim.Optimizer:
    """AdamW over the body at ``lr`` and the score head, if the model has one, at ``head_lr`` (default ``lr``)."""
    head = head_parameters(model)
    ids = {id(p) for p in head}
    body = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": body, "lr": train.lr}, {"params": head, "lr": train.head_lr or train.lr}]
    return torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=train.weight_decay)


def fit(model: torch.nn.Module, train: Any, examples: int, seed: int, loss_of: LossOf, heldout: HeldOut,
        sink: JsonlSink, console: Console, label: str = "") -> int:
    """Train ``model`` in place: each step ``loss_of(indices)`` on ``train.batch_size`` examples of a
    seeded shuffle; returns the steps taken (``train.time_limit_s`` may stop it early)."""
    optimizer = optimizer_for(model, train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, cfg=train))
    rng = np.random.default_rng(seed)
    order, cursor, start, step = rng.permutation(examples), 0, time.monotonic(), 0
    model.train()
    for step in range(1, train.steps + 1):
        if cursor + train.batch_size > len(order):
            order, cursor = rng.permutation(examples), 0
        index = order[cursor : cursor + train.batch_size]
        cursor += train.batch_size
        loss, metrics = loss_of(index)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        scheduler.step()
        record = {"step": step, "loss": loss.item(), "grad_norm": float(grad_norm), "lr": scheduler.get_last_lr()[0],
                  **{f"train/{k}": float(v) for k, v in metrics.items()}, **({"member": label.strip()} if label else {})}
        held = heldout() if train.eval_every and step % train.eval_every == 0 and step < train.steps else None
        if held is not None:
            record[f"heldout/{held[0]}"] = held[1]
        sink.write(record)
        if step % train.log_every == 0 or held is not None:
            figures = "  ".join(f"{k.removeprefix('train/')} {v:.3f}" for k, v in record.items() if k.startswith("train/"))
            extra = f"  held-out {held[0]} {held[1]:.3f}" if held is not None else ""
            console.print(f"{label}step {step}/{train.steps}  loss {record['loss']:.4f}  {figures}{extra}  "
                          f"{time.monotonic() - start:.0f}s", highlight=False)
        if train.time_limit_s and time.monotonic() - start > train.time_limit_s:
            console.print(f"{label}time limit {train.time_limit_s:g}s reached at step {step}", highlight=False)
            break
    return step
