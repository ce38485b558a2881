"""Turn a task prompt (raw text or chat messages) into the token ids the model sees."""

from __future__ import annotations

import json
import weakref

from reinforge.errors import ConfigError

Messages = list[dict[str, str]]
ENCODED_LIMIT = 1 << 16  # prompts remembered per tokenizer; the memo starts afresh past it
_encoded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (signature, {prompt key: ids})


def prompt_messages(prompt: str | Messages, system_prompt: str | None) -> str | Messages:
    if system_prompt is None:
        return prompt
    if isinstance(prompt, str):
        raise ConfigError("task.system_prompt needs chat-message prompts, but this prompt is raw text")
    return [{"role": "system", "content": system_prompt}, *prompt]


def encode_prompt(tokenizer, prompt: str | Messages) -> list[int]:
    """Chat messages go through the tokenizer's chat template with the generation prompt; raw text is encoded as is.

    Memoised per tokenizer, its chat template and its vocabulary size (a held-out set is encoded once in a
    run, not at every evaluation); a tokenizer that cannot be weakly referenced, or a prompt that is not
    JSON, is encoded each time."""
    try:
        key = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
        signature = (getattr(tokenizer, "chat_template", None), len(tokenizer) if hasattr(tokenizer, "__len__") else -1)
        entry = _encoded.get(tokenizer)
        if entry is None or entry[0] != signature or len(entry[1]) >= ENCODED_LIMIT:
            entry = _encoded[tokenizer] = (signature, {})
    except TypeError:  # not JSON, or a tokenizer without weak references
        return _encode(tokenizer, prompt)
    ids = entry[1].get(key)
    if ids is None:
        ids = entry[1][key] = _encode(tokenizer, prompt)
    return list(ids)


def _encode(tokenizer, prompt: str | Messages) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "the prompt is a list of chat messages but the tokenizer has no chat template; "
            "give raw-text prompts or a tokenizer with a chat_template"
        )
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
