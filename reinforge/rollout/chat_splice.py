"""Token-exact multi-turn context: append tokens, never re-tokenise a prior turn.

A multi-turn episode's token sequence is built by appending:

    prompt_ids(first messages)                      context  (chat template + generation prompt)
    model tokens of turn 1, exactly as sampled      trained  (loss mask 1)
    close_turn_ids(turn 1)                          context  (what the template puts after an
                                                              assistant message, if the model did
                                                              not emit it: e.g. "<|im_end|>\\n")
    observation_ids(tool / user messages)           context  (the template's rendering of the new
                                                              messages through the next generation
                                                              prompt)
    model tokens of turn 2 ...

New messages are rendered as the template's *delta*: the text of a reference conversation
``[user "U", assistant "A"] + new`` (with the generation prompt) minus the text of the reference
conversation alone. That needs a template that is append-only after a finished assistant turn
(true of the Llama, Qwen2.5, Mistral, ChatML and the shipped tiny templates; Qwen3's template,
which rewrites earlier assistant turns' reasoning, is not): a template that is not raises
``ChatTemplateError`` at construction rather than producing a context the model never saw.
Only the delta text is tokenised, so the tokens of earlier turns are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reinforge.errors import ReinforgeError

Message = dict[str, Any]
_REF_USER, _REF_ASSISTANT = "U", "A"


class ChatTemplateError(ReinforgeError):
    """The tokenizer's chat template cannot be spliced turn by turn."""


class ChatSplicer:
    """Renders the pieces of a multi-turn context as token ids (see the module docstring).

    ``tools`` (OpenAI tool schemas) are passed to the chat template wherever it renders them."""

    def __init__(self, tokenizer, tools: Sequence[dict] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("multi-turn episodes need a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        ref = [{"role": "user", "content": _REF_USER}]
        with_answer = self._render([*ref, {"role": "assistant", "content": _REF_ASSISTANT}])
        head = self._render(ref, generation_prompt=True)
        if not with_answer.startswith(head + _REF_ASSISTANT):
            raise ChatTemplateError(
                "the chat template does not render an assistant message as generation prompt + content: "
                f"{head!r} + {_REF_ASSISTANT!r} is not a prefix of {with_answer!r}"
            )
        self._reference_text = with_answer
        self._turn_suffix = with_answer[len(head) + len(_REF_ASSISTANT):]
        self.turn_suffix_ids = self._encode(self._turn_suffix)
        eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    def _render(self, messages: Sequence[Message], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The first context: the messages through the generation prompt."""
        return self._encode(self._render(messages, generation_prompt=True))

    def close_turn_ids(self, generated_ids: Sequence[int]) -> list[int]:
        """What the template puts after an assistant message that the model did not itself emit.

        A turn that ended on an end-of-sequence token which is the first token of the template's
        turn suffix gets the rest of the suffix; any other turn (stopped by length or a stop
        string) gets the whole suffix."""
        suffix = self.turn_suffix_ids
        if generated_ids and suffix and generated_ids[-1] == suffix[0] and generated_ids[-1] in self.eos_ids:
            return suffix[1:]
        return list(suffix)

    def strip_turn_end(self, generated_ids: Sequence[int]) -> list[int]:
        """The turn's content tokens: without a final end-of-sequence token."""
        if generated_ids and generated_ids[-1] in self.eos_ids:
            return list(generated_ids[:-1])
        return list(generated_ids)

    def observation_ids(self, messages: Sequence[Message]) -> list[int]:
        """``messages`` (tool results, user replies) rendered after a finished assistant turn,
        through the next generation prompt."""
        if not messages:
            raise ValueError("observation_ids needs at least one message")
        reference = [{"role": "user", "content": _REF_USER}, {"role": "assistant", "content": _REF_ASSISTANT}]
        text = self._render([*reference, *messages], generation_prompt=True)
        if not text.startswith(self._reference_text):
            raise ChatTemplateError(
                "the chat template is not append-only: rendering new messages changed the earlier turns "
                f"({self._reference_text!r} is not a prefix of {text!r}); multi-turn training would see "
                "a context the model never saw"
            )
        return self._encode(text[len(self._reference_text):])
