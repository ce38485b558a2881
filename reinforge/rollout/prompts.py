"""Turn a task prompt (raw text or chat messages) into the token ids the model sees."""

from __future__ import annotations

from reinforge.errors import ConfigError

Messages = list[dict[str, str]]


def prompt_messages(prompt: str | Messages, system_prompt: str | None) -> str | Messages:
    if system_prompt is None:
        return prompt
    if isinstance(prompt, str):
        raise ConfigError("task.system_prompt needs chat-message prompts, but this prompt is raw text")
    return [{"role": "system", "content": system_prompt}, *prompt]


def encode_prompt(tokenizer, prompt: str | Messages) -> list[int]:
    """Chat messages go through the tokenizer's chat template with the generation prompt; raw text is encoded as is."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "the prompt is a list of chat messages but the tokenizer has no chat template; "
            "give raw-text prompts or a tokenizer with a chat_template"
        )
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
