"""A trained process reward model as a step verifier (``reward.step_verifier: {name: prm, path: ...}``),
and how a PRM reads a completion, shared with its trainer (``reinforge prm``).

The completion is split into steps at ``step_separator`` (empty pieces dropped), rendered as the
reward model renders it (``reward_model.reward_text_ids``'s rule: the PRM tokenizer's chat template
over prompt + completion), and each step's score is ``sigmoid(logit)`` at the token that holds its
last character: the probability that the step is on a path to the right answer (Math-Shepherd).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

import torch
from pydantic import Field

from reinforge.errors import ConfigError, DataError
from reinforge.registry import Settings
from reinforge.rewards.steps import STEP_VERIFIERS
from reinforge.types import Messages, Task


def step_ends(steps: tuple[str, ...] | list[str], separator: str) -> list[int]:
    """Character offsets, in the joined completion, one past each step's last character."""
    ends, at = [], 0
    for k, step in enumerate(steps):
        at += (len(separator) if k else 0) + len(step)
        ends.append(at)
    return ends


def encode_steps(tokenizer: Any, prompt: str | Messages, completion: str, ends: list[int], where: str
                 ) -> tuple[list[int], list[int]]:
    """(token ids of the rendered prompt + completion, the token index of each step's last character)."""
    if isinstance(prompt, str):
        text, special = prompt + completion, True
    elif getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": completion}], tokenize=False)
        special = False
    else:
        text, special = "\n".join(m["content"] for m in prompt) + completion, True
    start = text.rfind(completion)
    if start < 0:
        raise DataError(f"{where}: the chat template does not render the completion as it is; steps cannot be located")
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    positions = []
    for end in ends:
        char = start + end - 1
        token = next((i for i, (a, b) in enumerate(offsets) if a <= char < b), None)
        if token is None:
            raise DataError(f"{where}: no token holds the end of a step (character {char})")
        positions.append(token)
    return list(enc["input_ids"]), positions



class PRMSettings(Settings):
    path: str = Field(description="the PRM: an AutoModelForTokenClassification directory (reinforge prm's model/)")
    step_separator: str = Field("\n", description="what separates the steps in a completion; '' makes every "
                                "character a step (steps cut by tokens of a character-level model)")
    device: str = Field("cpu", description="where the PRM runs")


@lru_cache(maxsize=4)
def _load_prm(path: str, device: str) -> tuple[Any, Any, threading.Lock]:
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    from reinforge.models.loading import _existing_model_dir, load_tokenizer

    directory = _existing_model_dir(path)
    hf_logging.disable_progress_bar()
    model = AutoModelForTokenClassification.from_pretrained(directory, dtype=torch.float32)
    if model.config.num_labels != 1:
        raise ConfigError(f"step verifier prm: {directory} has {model.config.num_labels} labels; a PRM has one")
    return model.to(device).eval(), load_tokenizer(directory), threading.Lock()


@STEP_VERIFIERS.register(
    "prm",
    formula="s_k = sigmoid(PRM logit at the last token of step k); steps split at step_separator",
    paper="Wang et al. 2024, Math-Shepherd (arXiv:2312.08935); Lightman et al. 2023, Let's Verify Step by Step "
          "(arXiv:2305.20050)",
    settings=PRMSettings,
)
def prm_steps(task: Task, completion: str, cfg: PRMSettings) -> list[tuple[int, float]]:
    """A trained PRM's score for every step of the completion."""
    pieces = completion.split(cfg.step_separator) if cfg.step_separator else list(completion)
    ends, at = [], 0
    for k, piece in enumerate(pieces):
        at += (len(cfg.step_separator) if k else 0) + len(piece)
        if piece.strip():
            ends.append(at)
    if not ends:
        return []
    model, tokenizer, lock = _load_prm(cfg.path, cfg.device)
    try:
        ids, positions = encode_steps(tokenizer, task.prompt, completion, ends, f"task {task.id}")
    except DataError:
        return []  # a completion the template does not render as it is has no steps to score
    with lock, torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=cfg.device)).logits[0, :, 0].float()
    scores = torch.sigmoid(logits[positions]).tolist()
    return list(zip(ends, scores, strict=True))
