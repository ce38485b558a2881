"""A character-level ASCII tokenizer with a ChatML-like template (tools rendered in a system block)
and a tiny random Llama over it: enough to drive multi-turn episodes in tests."""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def ascii_chat_tokenizer(template: str = CHATML) -> PreTrainedTokenizerFast:
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<|im_end|>", unk_token="<unk>", padding_side="left")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = template
    return tok


def tiny_random_llama(tokenizer, max_positions: int = 256, seed: int = 0, init_range: float = 0.02) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=True, initializer_range=init_range, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


def two_policies_and_requests():
    """(tokenizer, old model, new model, two requests): two random tiny Llamas far enough apart
    (init range 0.5) that switching weights changes greedy tokens, for weight-update tests."""
    from reinforge.rollout.types import GenerationRequest

    tok = ascii_chat_tokenizer()
    old, new = tiny_random_llama(tok, seed=0, init_range=0.5), tiny_random_llama(tok, seed=1, init_range=0.5)
    requests = [GenerationRequest(tok("hello", add_special_tokens=False)["input_ids"], "a"),
                GenerationRequest(tok("other prompt", add_special_tokens=False)["input_ids"], "b")]
    return tok, old, new, requests
