"""The reward model's network: any Hugging Face causal LM (or reward model) as an
``AutoModelForSequenceClassification`` with ``heads`` score outputs (``model.kind: sequence_classifier``)
or as GenARM's autoregressive reward model (``model.kind: autoregressive``, ``rewards/arm.py``: the
causal LM itself, all of it trained, no head), and its atomic save.

From a causal LM the transformer's weights are kept and a score head (``hidden -> heads``) is added.
One head starts at zero, so every score starts at 0 and the first steps move the head before the
body (a random head adds noise that the pairwise loss must first undo). Several heads keep the
model's random initialisation: zero heads would get equal gradients and stay one head. From a reward model directory both
are kept (continued training); its number of heads must match.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from reinforge.errors import ConfigError
from reinforge.models.adapters import is_adapter_dir
from reinforge.models.loading import _existing_model_dir, load_tokenizer
from reinforge.rewards.arm import KIND, AutoregressiveRewardModel

_SUFFIX = {"sequence": "ForSequenceClassification", "token": "ForTokenClassification"}


def _is_reward_model(config: Any, per: str) -> bool:
    return any(str(a).endswith(_SUFFIX[per]) for a in (config.architectures or []))


def build_reward_model(path: str, heads: int, device: str = "cpu", per: str = "sequence") -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` for training a reward model from ``path`` (see the module docstring):
    ``per="sequence"`` an outcome reward model (``AutoModelForSequenceClassification``), ``"token"`` a
    process reward model (``AutoModelForTokenClassification``, a score at every token)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    directory = _existing_model_dir(path)
    if is_adapter_dir(directory):
        raise ConfigError(f"model.path: {directory} is a LoRA adapter; export it to a full model first "
                          "(`reinforge export`) and start the reward model from that")
    config = AutoConfig.from_pretrained(directory)
    continued = _is_reward_model(config, per)
    if continued and config.num_labels != heads:
        raise ConfigError(f"model.heads: {heads}, but the reward model at {directory} has {config.num_labels} "
                          "head(s); continue it with the same number")
    tokenizer = load_tokenizer(directory)
    hf_logging.disable_progress_bar()
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a fresh head is 'missing' from a causal LM's weights: expected
    try:
        auto = AutoModelForSequenceClassification if per == "sequence" else AutoModelForTokenClassification
        model = auto.from_pretrained(directory, num_labels=heads, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(previous)
    if model.config.get_text_config().pad_token_id is None:
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.config.pad_token_id = model.config.get_text_config().pad_token_id
    if not continued and heads == 1:
        head = _score_head(model)
        torch.nn.init.zeros_(head.weight)
        if head.bias is not None:
            torch.nn.init.zeros_(head.bias)
    return model.to(device), tokenizer


def build_autoregressive_reward_model(path: str, beta: float, device: str = "cpu"
                                      ) -> tuple[AutoregressiveRewardModel, Any]:
    """``(model, tokenizer)``: GenARM's pi_r initialised from the causal LM at ``path`` (or continued from an
    autoregressive reward model directory, whose saved beta gives way to ``beta``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = _existing_model_dir(path)
    if is_adapter_dir(directory):
        raise ConfigError(f"model.path: {directory} is a LoRA adapter; export it to a full model first "
                          "(`reinforge export`) and start the reward model from that")
    if any(_is_reward_model(AutoConfig.from_pretrained(directory), per) for per in _SUFFIX):
        raise ConfigError(f"model.path: {directory} is a classifier reward model; an autoregressive reward model "
                          "starts from a causal LM (or an autoregressive reward model)")
    tokenizer = load_tokenizer(directory)
    lm = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    if lm.config.get_text_config().pad_token_id is None:
        lm.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    return AutoregressiveRewardModel(lm, beta).to(device), tokenizer


def build_for(model_cfg: Any) -> tuple[torch.nn.Module, Any]:
    """The recipe's ``model`` section's network by its ``kind``."""
    if model_cfg.kind == KIND:
        return build_autoregressive_reward_model(model_cfg.path, model_cfg.beta, model_cfg.device)
    return build_reward_model(model_cfg.path, model_cfg.heads, model_cfg.device)


def trained_record(model: torch.nn.Module, reference_template: str | None) -> dict[str, Any]:
    """What ``reinforge_rm.json`` keeps for the scorer: the reference template, and an autoregressive
    reward model's kind and beta."""
    record: dict[str, Any] = {"reference_template": reference_template}
    if isinstance(model, AutoregressiveRewardModel):
        record.update(kind=KIND, beta=model.beta)
    return record


def _score_head(model: torch.nn.Module) -> torch.nn.Linear:
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Linear):
            return head
    raise ConfigError(f"{type(model).__name__}: no linear score head (score / classifier) found")


def head_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The score head's parameters (none for an autoregressive reward model, which has no head)."""
    if isinstance(model, AutoregressiveRewardModel):
        return []
    return list(_score_head(model).parameters())


def save_reward_model(model: torch.nn.Module, tokenizer: Any, out: Path, trained: dict[str, Any] | None = None) -> Path:
    """``out`` as a Hugging Face directory (safetensors and tokenizer, and ``trained``, how it was trained,
    as ``reinforge_rm.json`` for the scorer), written to a temporary sibling and renamed into place, so
    a crash never leaves half a model at ``out``."""
    from reinforge.rewards.reward_model import RM_CONFIG

    tmp = out.with_name(f".tmp_{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if trained:
        (tmp / RM_CONFIG).write_text(json.dumps(trained, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
