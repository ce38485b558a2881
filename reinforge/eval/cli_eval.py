"""`reinforge eval`: load a model, evaluate it on a task's held-out split, print a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from reinforge.assets import resolve_model_path
from reinforge.config import TaskConfig
from reinforge.data.sources import build_task_splits
from reinforge.errors import ConfigError
from reinforge.eval.heldout import evaluate
from reinforge.rewards.verifiers import VERIFIERS
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.train.checkpoint import latest_checkpoint
from reinforge.train.model import load_model, load_tokenizer


def resolve_eval_model(model: str) -> str:
    """A run directory means its latest checkpoint; anything else is a model path or alias."""
    path = resolve_model_path(model)
    if (path / "checkpoints").is_dir():
        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise ConfigError(f"--model {model}: run directory without checkpoints")
        return str(ckpt)
    return model


def run_eval(
    model: str, task: str, data: Path | None, samples: int, temperature: float, max_new_tokens: int,
    heldout_size: int, seed: int,
) -> dict[str, Any]:
    from pydantic import ValidationError
    from rich.console import Console
    from rich.table import Table

    try:
        task_cfg = TaskConfig(kind=task, path=str(data) if data else None, heldout_size=heldout_size)
    except ValidationError as e:
        raise ConfigError(f"--task/--data: {e.errors()[0]['msg']}") from None
    splits = build_task_splits(task_cfg)
    path = resolve_eval_model(model)
    torch.manual_seed(seed)
    engine = TorchRolloutEngine(load_model(path), load_tokenizer(path), seed=seed)
    result = evaluate(
        engine, splits.heldout, VERIFIERS.get(task_cfg.verifier), max_new_tokens, samples, temperature
    )
    Console().print(f"{path} on {splits.name}: {result.num_prompts} held-out prompts, {samples} samples each")
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("greedy accuracy", f"{result.greedy_accuracy:.3f}")
    for k, v in result.pass_at_k.items():
        table.add_row(f"pass@{k}", f"{v:.3f}")
    Console().print(table)
    return {
        "model": path, "task": splits.name, "num_prompts": result.num_prompts, "samples": samples,
        "temperature": temperature, "greedy_accuracy": result.greedy_accuracy,
        "pass_at_k": {str(k): v for k, v in result.pass_at_k.items()},
    }
