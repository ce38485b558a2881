"""Demonstrations: given answers to train on with a supervised term (``nll``), as trajectories whose
loss mask covers only the answer's tokens.

Two row forms, from JSONL, CSV, Parquet or a ``datasets`` directory (``demonstrations.path``):

- chat: ``{"messages": [{"role", "content"}, ...]}`` rendered by the tokenizer's chat template;
  every assistant message is trained on (its content and the template's end-of-turn tokens),
  nothing else (assistant-only masking);
- prompt and completion: ``{"prompt": text or messages, "completion": text}``: the prompt encoded
  as the rollout encodes prompts (chat template with the generation prompt for messages), then the
  completion's tokens and the end-of-sequence token, which are trained on.

Or ``demonstrations.path: task``: the run's own training tasks with their reference answers as
completions (the built-in arithmetic task: ``12+34=`` -> ``46``), prompted exactly as in RL.
Column names are set by ``demonstrations.columns``. A bad row is a ``DataError`` naming its file
and line (or row).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from reinforge.errors import DataError
from reinforge.rollout.prompts import encode_prompt
from reinforge.types import Messages, Task, Trajectory

Row = tuple[str, dict[str, Any]]  # (where: file:line, the row)


def _template(tokenizer, messages: Messages, generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def chat_demonstration(tokenizer, messages: Messages, where: str) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a conversation: 1 on every assistant message's tokens (as the chat
    template renders them, end-of-turn included), 0 elsewhere."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: a chat demonstration needs a tokenizer with a chat template; give "
                        "prompt/completion rows instead")
    if not any(m.get("role") == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message to train on")
    ids = _template(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(ids)
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prefix = _template(tokenizer, messages[:k], generation_prompt=True) if k else []
        upto = _template(tokenizer, messages[: k + 1], generation_prompt=False)
        if upto[: len(prefix)] != prefix or ids[: len(upto)] != upto:
            raise DataError(f"{where}: the chat template does not render the conversation up to message {k} as a "
                            "prefix of the whole; assistant-only masking needs a template that appends messages")
        mask[len(prefix): len(upto)] = [1] * (len(upto) - len(prefix))
    return ids, mask


def completion_demonstration(tokenizer, prompt: str | Messages, completion: str, where: str
                             ) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a prompt (encoded as rollouts encode it) and its completion, which
    ends with the end-of-sequence token; 1 on the completion's tokens."""
    if not isinstance(completion, str) or not completion:
        raise DataError(f"{where}: completion must be a non-empty string")
    prompt_ids = encode_prompt(tokenizer, prompt)
    answer = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        answer.append(tokenizer.eos_token_id)
    return prompt_ids + answer, [0] * len(prompt_ids) + [1] * len(answer)


def rows_to_demonstrations(rows: Iterable[Row], tokenizer, columns: Any) -> list[Trajectory]:
    """One demonstration trajectory per row (``columns``: the names of the messages, prompt and
    completion columns)."""
    out = []
    for where, row in rows:
        if columns.messages in row:
            messages = row[columns.messages]
            if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
                raise DataError(f"{where}: {columns.messages} must be a list of {{role, content}} messages")
            (ids, mask), answer = chat_demonstration(tokenizer, messages, where), ""
        elif columns.prompt in row and columns.completion in row:
            answer = row[columns.completion]
            ids, mask = completion_demonstration(tokenizer, row[columns.prompt], answer, where)
        else:
            raise DataError(f"{where}: a demonstration needs a {columns.messages!r} column or {columns.prompt!r} "
                            f"and {columns.completion!r}; the row has {sorted(row)}")
        out.append(demonstration(ids, mask, where, answer))
    if not out:
        raise DataError("demonstrations.path: no rows")
    return out


def task_demonstrations(tasks: Sequence[Task], tokenizer, prompt_of: Callable[[Task], Any]) -> list[Trajectory]:
    """The tasks' reference answers as completions of their prompts (``prompt_of``: how the rollout
    prompts a task, e.g. its environment's ``reset``)."""
    out = []
    for task in tasks:
        if not task.answer:
            raise DataError(f"task {task.id}: no reference answer to demonstrate")
        ids, mask = completion_demonstration(tokenizer, prompt_of(task), str(task.answer), f"task {task.id}")
        out.append(demonstration(ids, mask, task.id, str(task.answer)))
    return out


def demonstration(ids: list[int], mask: list[int], task_id: str, answer: str = "") -> Trajectory:
    """A demonstration row: trained on where ``mask`` is 1, no sampling log-probs, its own group;
    ``answer``: the completion's text (what a verifier scores; empty for a chat row)."""
    return Trajectory(token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), version=-1, group_id=-1,
                      task_id=task_id, completion_text=answer, demonstration=True)
