"""LoRA checkpoint directories (peft's format): recognise one, find its base model, merge it into
the base. Training LoRA adapters (wrapping, merged weights for the engine, saving and restoring)
is ``learn/lora.py``; this is what loading a model needs of it (docs/lora.md)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import nn

from reinforge.errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"


@contextmanager
def quiet_peft() -> Iterator[None]:
    """peft asks transformers a deprecated question while wrapping a model: not the user's concern."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def is_adapter_dir(path: str | Path) -> bool:
    """A directory holding a peft adapter and no full model (a LoRA checkpoint)."""
    path = Path(path)
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def adapter_base_path(directory: Path) -> str:
    cfg = json.loads((Path(directory) / ADAPTER_CONFIG).read_text())
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{directory}/{ADAPTER_CONFIG}: no base_model_name_or_path; cannot find the base model")
    return base


def merge_adapter(base: nn.Module, directory: str | Path) -> nn.Module:
    """A LoRA checkpoint (adapter directory) as a plain HF model: ``base`` (loaded from the adapter's
    ``adapter_base_path``) with the adapter merged into it."""
    from peft import PeftModel

    with quiet_peft():
        return PeftModel.from_pretrained(base, str(directory), adapter_name=ADAPTER_NAME).merge_and_unload()
