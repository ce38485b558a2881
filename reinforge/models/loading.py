"""Load a causal LM and its tokenizer from a local directory (or a shipped alias).

A LoRA checkpoint (a directory with a peft adapter and no full model) loads as its base model
with the adapter merged: eval, serve and export see a plain HF causal LM either way.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from reinforge.assets import SHIPPED_MODELS, resolve_model_path
from reinforge.errors import ConfigError
from reinforge.models.adapters import adapter_base_path, is_adapter_dir, merge_adapter

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    directory = _existing_model_dir(path)
    tok = AutoTokenizer.from_pretrained(directory)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_processor(path: str):
    """The model's ``AutoProcessor`` when its directory has one (a vision-language model: tokenizer and image
    processor; models/processors.py: without torchvision, a family's processor without its video processor), else
    None (a text model: ``load_tokenizer`` is all it needs)."""
    directory = Path(_existing_model_dir(path))
    if not any((directory / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")):
        return None
    from reinforge.models.processors import load_processor as family_processor

    return family_processor(str(directory))


def is_vision_language(directory: str) -> bool:
    """The config describes a vision-language model (it has a ``vision_config``)."""
    import json

    config = Path(directory) / "config.json"
    return config.is_file() and "vision_config" in json.loads(config.read_text())


def load_model(path: str, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    directory = _existing_model_dir(path)
    if is_adapter_dir(directory):  # a LoRA checkpoint: its base with the adapter merged
        return merge_adapter(load_model(str(adapter_base_path(Path(directory))), dtype, device), directory)
    _refuse_reward_model(directory)
    hf_logging.disable_progress_bar()
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if is_vision_language(directory):  # LLaVA, Idefics3, ...: the image-text-to-text class (docs/vision.md)
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_pretrained(directory, dtype=DTYPES[dtype])
        else:
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=DTYPES[dtype])
    finally:
        hf_logging.set_verbosity(previous)
    logging.getLogger(__name__).debug("loaded %s", directory)
    return model.to(device)


def _refuse_reward_model(directory: str) -> None:
    """A reward model (a sequence or token classifier, e.g. ``tiny-rm``) is no policy: say so."""
    import json

    config = Path(directory) / "config.json"
    architectures = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    if any(str(a).endswith(("ForSequenceClassification", "ForTokenClassification")) for a in architectures):
        raise ConfigError(f"model.path: {directory} is a reward model ({architectures[0]}), not a causal LM; a reward "
                          "model is named in reward.terms (reward_model.path) or reward.step_verifier")


def _existing_model_dir(path: str) -> str:
    directory = _latest_checkpoint_of_run(resolve_model_path(path))
    if not directory.is_dir():
        raise ConfigError(f"model.path: {path!r} is not a directory with an HF model (or a shipped alias: {', '.join(SHIPPED_MODELS)})")
    if not (directory / "config.json").is_file() and not (directory / "adapter_config.json").is_file():
        raise ConfigError(f"model.path: {directory} has no config.json (nor a LoRA adapter_config.json); is it a Hugging "
                          "Face model directory?")
    return str(directory)


def _latest_checkpoint_of_run(directory: Path) -> Path:
    """A run directory (``runs/<name>``, with ``checkpoints/step_N``) means its latest checkpoint, so a
    run can start from another's result (``model.path=runs/<sft run>``); any other path is itself."""
    steps = [p for p in (directory / "checkpoints").glob("step_*") if p.name[5:].isdigit()] \
        if (directory / "checkpoints").is_dir() else []
    return max(steps, key=lambda p: int(p.name[5:])) if steps else directory
