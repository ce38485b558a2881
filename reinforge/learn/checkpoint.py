"""Atomic, exactly resumable checkpoints.

``checkpoints/step_N/`` holds the model and tokenizer (``save_pretrained``; for a LoRA policy
the adapter alone, ``adapter_config.json`` + ``adapter_model.safetensors``), ``trainer.pt``
(optimizer, scheduler, learner state), ``rng.pt`` (python, numpy, torch and rollout generator
states), ``reward.pt`` (the reward's state, where it keeps one: a reward model's running normaliser, a
co-evolving reward model's weights and optimizer), ``state.json`` (step, data position, policy version) and, written last, ``manifest.json``
(every file's size and SHA-256). It is written to a hidden temporary directory and renamed into
place, so a crash never leaves a half-written checkpoint; only the last ``keep`` are kept. On
resume, ``latest_valid_checkpoint`` checks the manifest and falls back to the previous checkpoint
when the newest is truncated or corrupt; a full disk (ENOSPC) while writing stops the run with a
clear message and leaves the previous checkpoints intact.

``restore_policy`` loads a checkpoint's weights into the training policy (full or LoRA) and
``export_model`` writes a checkpoint as a plain HF model directory (LoRA merged).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from reinforge.errors import ReinforgeError
from reinforge.learn.lora import is_lora_model, restore_adapter, save_adapter
from reinforge.models.adapters import ADAPTER_NAME, is_adapter_dir

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
    reward_state: dict[str, Any] | None = None,
    adapter_name: str = ADAPTER_NAME,
) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_files(tmp, step, model, tokenizer, trainer_state, rollout_generator, state, reward_state, adapter_name)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno != errno.ENOSPC:
            raise
        previous = latest_checkpoint(run_dir)
        raise ReinforgeError(
            f"no space left on the device while writing the step-{step} checkpoint to {root}: the run stops here. "
            + (f"The previous checkpoint {previous} is intact; free some space and resume with "
               f"`reinforge train --resume {run_dir}`." if previous else "No earlier checkpoint exists.")) from e
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_files(tmp: Path, step: int, model: torch.nn.Module, tokenizer: Any, trainer_state: dict[str, Any],
                 rollout_generator: torch.Generator, state: dict[str, Any],
                 reward_state: dict[str, Any] | None = None, adapter_name: str = ADAPTER_NAME) -> None:
    """Every file of a checkpoint into ``tmp``, the manifest last, each fsynced (of a LoRA policy, its
    adapter ``adapter_name`` alone)."""
    tmp.mkdir()
    if is_lora_model(model):
        save_adapter(model, tmp, adapter_name)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(trainer_state, tmp / "trainer.pt")
    if reward_state:
        torch.save(reward_state, tmp / REWARD_STATE)
    torch.save(
        {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "rollout": rollout_generator.get_state(),
            "rollout_device": rollout_generator.device.type,
        },
        tmp / "rng.pt",
    )
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    files = {f.name: {"size": f.stat().st_size, "sha256": _sha256(f)} for f in sorted(tmp.iterdir()) if f.is_file()}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=2))
    _fsync_dir(tmp)


MANIFEST = "manifest.json"
REWARD_STATE = "reward.pt"  # the reward's state, where it has one (a normaliser, a co-evolving reward model)


def load_reward_state(path: Path) -> dict[str, Any]:
    """A checkpoint's ``reward.pt`` (empty when the reward keeps no state)."""
    f = path / REWARD_STATE
    return torch.load(f, weights_only=False, map_location="cpu") if f.is_file() else {}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_checkpoint(path: Path) -> str | None:
    """None if every file listed in the checkpoint's manifest is there with its size and SHA-256; else
    what is wrong. A checkpoint written before manifests existed is accepted as it is."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return None if (path / "state.json").is_file() else "no manifest.json and no state.json"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return f"manifest.json is unreadable ({e})"
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta["size"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {meta['size']} (truncated?)"
        if _sha256(f) != meta["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (corrupt)"
    return None


def latest_valid_checkpoint(run_dir: Path, warn: Any = print) -> Path | None:
    """The newest checkpoint that passes ``verify_checkpoint``; each one skipped is reported through ``warn``."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            return ckpt
        warn(f"checkpoint {ckpt} is damaged ({problem}); trying the one before it")
    return None


def load_checkpoint(path: Path, rollout_generator: torch.Generator) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore global RNG states and the rollout generator; return (trainer_state, state)."""
    # map_location: a checkpoint written on a GPU resumes on a machine without one (the optimizer moves its
    # state to its parameters' device when it loads it)
    rng = torch.load(path / "rng.pt", weights_only=False, map_location="cpu")
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    restore_rollout_generator(rollout_generator, rng["rollout"], rng.get("rollout_device"))
    trainer_state = torch.load(path / "trainer.pt", weights_only=False, map_location="cpu")
    state = json.loads((path / "state.json").read_text())
    return trainer_state, state


def restore_rollout_generator(generator: torch.Generator, state: torch.Tensor, saved_on: str | None,
                              warn: Any = print) -> None:
    """Continue the rollout generator's stream; a run resumed on another device type (a CUDA run resumed
    on the CPU, say) cannot, since the two generators are different algorithms: the generator is then
    seeded from a hash of the saved state (the same seed every time that checkpoint resumes) and
    ``warn`` says that the sampling stream differs from the uninterrupted run's."""
    if saved_on in (None, generator.device.type):
        generator.set_state(state)
        return
    seed = int.from_bytes(hashlib.sha256(state.cpu().numpy().tobytes()).digest()[:8], "little")
    generator.manual_seed(seed)
    warn(f"the checkpoint's rollout generator ran on {saved_on}, this run samples on {generator.device.type}: "
         "seeded from the saved state instead, so the sampled completions differ from an uninterrupted run's")


def restore_policy(model: torch.nn.Module, ckpt: Path, dtype: str = "float32", device: str = "cpu",
                   adapter_name: str = ADAPTER_NAME) -> None:
    """Set the training policy's weights to the checkpoint's, exactly: the adapter (``adapter_name``) of
    a LoRA policy, every weight otherwise."""
    if is_lora_model(model):
        if not is_adapter_dir(ckpt):
            raise ReinforgeError(f"{ckpt}: a full-model checkpoint, but model.lora.enabled=true (resume with "
                                 "the run's own config)")
        restore_adapter(model, ckpt, adapter_name)
        return
    if is_adapter_dir(ckpt):
        raise ReinforgeError(f"{ckpt}: a LoRA checkpoint, but model.lora.enabled=false (resume with the run's "
                             "own config)")
    from reinforge.models.loading import load_model

    model.load_state_dict(load_model(str(ckpt), dtype, device).state_dict())


def resolve_checkpoint(path: Path) -> Path:
    """A run directory means its latest checkpoint; a checkpoint (or model) directory is itself."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise ReinforgeError(f"{path}: a run directory without checkpoints")
        return ckpt
    if not path.is_dir():
        raise ReinforgeError(f"{path}: neither a run directory nor a checkpoint directory")
    return path


TRAINER_FILES = ("trainer.pt", "rng.pt", "state.json", "manifest.json")


def export_model(source: Path, out: Path, dtype: str | None = None) -> Path:
    """Write the model of ``source`` (a run directory: its latest checkpoint; or a checkpoint) to
    ``out`` as a Hugging Face model directory with its tokenizer (a vision-language model: its processor),
    which ``AutoModelForCausalLM.from_pretrained(out)`` loads (a vision-language model:
    ``AutoModelForImageTextToText`` and ``AutoProcessor``).

    A LoRA checkpoint is merged into its base (in ``dtype``, default the run's ``model.dtype``); a
    full checkpoint's model files are copied as they are (no optimizer or RNG state)."""
    ckpt = resolve_checkpoint(source)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReinforgeError(f"--out {out}: exists and is not an empty directory")
    lora = is_adapter_dir(ckpt)
    if not lora and not (ckpt / "config.json").is_file():
        raise ReinforgeError(f"{ckpt}: no model in it (no config.json, no adapter_config.json)")
    if lora:
        from reinforge.models.loading import load_model, load_processor, load_tokenizer

        model, tokenizer = load_model(str(ckpt), dtype or _run_dtype(ckpt)), load_tokenizer(str(ckpt))
        processor = load_processor(str(ckpt))  # a vision-language model's: its tokenizer and image processor
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        (processor or tokenizer).save_pretrained(out)
    else:
        out.mkdir(parents=True, exist_ok=True)
        for f in ckpt.iterdir():
            if f.is_file() and f.name not in TRAINER_FILES:
                shutil.copy2(f, out / f.name)
    return out


def _run_dtype(ckpt: Path) -> str:
    """``model.dtype`` of the run a checkpoint belongs to (runs/<name>/checkpoints/step_N), else float32."""
    config = ckpt.parent.parent / "config.yaml"
    if config.is_file():
        data = yaml.safe_load(config.read_text()) or {}
        return str((data.get("model") or {}).get("dtype", "float32"))
    return "float32"


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
