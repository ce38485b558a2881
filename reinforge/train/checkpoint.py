"""Atomic, exactly resumable checkpoints.

``checkpoints/step_N/`` holds the model and tokenizer (``save_pretrained``), ``trainer.pt``
(optimizer, scheduler, learner state), ``rng.pt`` (python, numpy, torch and rollout generator
states) and ``state.json`` (step, data position, policy version). It is written to a hidden
temporary directory and renamed into place, so a crash never leaves a half-written checkpoint;
only the last ``keep`` are kept.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d+)$")


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    rollout_generator: torch.Generator,
    state: dict[str, Any],
    keep: int,
) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(trainer_state, tmp / "trainer.pt")
    torch.save(
        {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "rollout": rollout_generator.get_state(),
        },
        tmp / "rng.pt",
    )
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, rollout_generator: torch.Generator) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore global RNG states and the rollout generator; return (trainer_state, state)."""
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    rollout_generator.set_state(rng["rollout"])
    trainer_state = torch.load(path / "trainer.pt", weights_only=False)
    state = json.loads((path / "state.json").read_text())
    return trainer_state, state


def _fsync_dir(path: Path) -> None:
    for f in path.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
