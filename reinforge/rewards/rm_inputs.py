"""What a reward model reads: the text of a (prompt, completion) pair as token ids, a reference-based
model's prompt, right-padded batches, and how ``reinforge rm`` trained a model directory
(``reinforge_rm.json``), shared by the scorer (``rewards.reward_model``) and the trainer (``reinforge.rm``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from reinforge.errors import ConfigError

RM_CONFIG = "reinforge_rm.json"  # how ``reinforge rm`` trained a model: {"reference_template": ..., "kind": ..., "beta": ...}


def with_reference(prompt: str | list[dict[str, str]], template: str | None, answer: str | None
                   ) -> str | list[dict[str, str]]:
    """A reference-based reward model's prompt (the VerifyRM design of Cooper, Hong et al. 2025,
    arXiv:2508.05613): ``template`` formatted with the reference ``answer`` appended to the last user
    message (or to a text prompt). No template: the prompt as it is."""
    if template is None:
        return prompt
    if not answer:
        raise ConfigError("a reference-based reward model scores against the task's reference answer; this task "
                          "has none")
    extra = template.format(answer=answer)
    if isinstance(prompt, str):
        return prompt + extra
    last = max((i for i, m in enumerate(prompt) if m["role"] == "user"), default=len(prompt) - 1)
    return [{**m, "content": m["content"] + extra} if i == last else m for i, m in enumerate(prompt)]


def trained_with(path: str | Path) -> dict[str, Any]:
    """How ``reinforge rm`` trained the model directory ``path`` (its ``reinforge_rm.json``; {} without one)."""
    config = Path(path) / RM_CONFIG
    return json.loads(config.read_text()) if config.is_file() else {}


def reference_template(path: str | Path) -> str | None:
    """The reference template a model directory was trained with (its ``reinforge_rm.json``), else None."""
    return trained_with(path).get("reference_template")


def reward_text_ids(tokenizer: Any, prompt: str | list[dict[str, str]], completion: str) -> list[int]:
    """The ids a reward model scores for ``completion`` as the answer to ``prompt`` (the module
    docstring's rule); ``reinforge rm`` trains on exactly these."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt + completion, add_special_tokens=True)["input_ids"])
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": completion}], tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    text = "\n".join(m["content"] for m in prompt) + completion
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def right_padded(rows: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) ``[len(rows), longest]``: each row at the left, ``pad_id`` after it."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r)
        mask[k, : len(r)] = 1
    return ids, mask
