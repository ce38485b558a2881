"""``encode_prompt``: the chat template or the raw text, memoised per tokenizer, its template and its vocabulary."""

from __future__ import annotations

import pytest

from reinforge.errors import ConfigError
from reinforge.models.loading import load_tokenizer
from reinforge.rollout.prompts import _encode, encode_prompt


class CountingTokenizer:
    """A character tokenizer that counts how often it renders and encodes."""

    def __init__(self, template: str | None = "chat") -> None:
        self.chat_template = template
        self.calls = 0
        self.vocab = 100

    def __len__(self) -> int:
        return self.vocab

    def apply_chat_template(self, messages, tokenize: bool, add_generation_prompt: bool) -> str:
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + f"|{self.chat_template}>"

    def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
        self.calls += 1
        return {"input_ids": [1] * add_special_tokens + [ord(ch) % self.vocab for ch in text]}


class SlottedTokenizer:
    """The same without ``__weakref__``: it cannot be a key of the memo."""

    __slots__ = ("chat_template", "calls", "vocab")
    __init__, __len__, __call__ = CountingTokenizer.__init__, CountingTokenizer.__len__, CountingTokenizer.__call__
    apply_chat_template = CountingTokenizer.apply_chat_template


MESSAGES = [{"role": "user", "content": "12+34="}]


def test_a_prompt_is_encoded_once_per_tokenizer_and_a_copy_is_returned():
    tok = CountingTokenizer()
    first = encode_prompt(tok, MESSAGES)
    assert first == [ord(ch) % 100 for ch in "user:12+34=|chat>"] and tok.calls == 1
    first.append(-1)  # the caller's list is its own
    assert encode_prompt(tok, [dict(m) for m in MESSAGES]) == first[:-1] and tok.calls == 1
    assert encode_prompt(tok, "12+34=") == [1] + [ord(ch) % 100 for ch in "12+34="] and tok.calls == 2
    other = CountingTokenizer()
    encode_prompt(other, MESSAGES)
    assert other.calls == 1 and tok.calls == 2


def test_a_new_chat_template_or_vocabulary_encodes_again():
    tok = CountingTokenizer()
    encode_prompt(tok, MESSAGES)
    tok.chat_template = "other"
    assert encode_prompt(tok, MESSAGES)[-6:] == [ord(ch) % 100 for ch in "other>"] and tok.calls == 2
    tok.vocab = 50
    assert encode_prompt(tok, MESSAGES) == [ord(ch) % 50 for ch in "user:12+34=|other>"] and tok.calls == 3


def test_without_weak_references_or_json_each_call_encodes():
    tok = SlottedTokenizer()
    assert encode_prompt(tok, MESSAGES) == encode_prompt(tok, MESSAGES) and tok.calls == 2
    plain = CountingTokenizer()
    odd = [{"role": "user", "content": "12+34=", "extra": object()}]  # not JSON: encoded every time
    encode_prompt(plain, odd)
    encode_prompt(plain, odd)
    assert plain.calls == 2


def test_the_shipped_tokenizer_gives_the_uncached_ids_and_messages_need_a_template():
    tok = load_tokenizer("tiny-base")
    assert encode_prompt(tok, MESSAGES) == _encode(tok, MESSAGES) == encode_prompt(tok, MESSAGES)
    with pytest.raises(ConfigError, match="no chat template"):
        encode_prompt(CountingTokenizer(template=None), MESSAGES)
