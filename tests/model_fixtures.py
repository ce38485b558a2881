"""Small random models saved beside the shipped tokenizer, for end-to-end runs that need what the
shipped tiny-base is not: a longer context, or a reward model."""

from __future__ import annotations

from pathlib import Path


def _llama_config(tok, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, pad_token_id=tok.pad_token_id, **extra)


def long_context_model(directory: Path) -> Path:
    """The shipped tokenizer with a random one-layer Llama of 512 positions (reasoning-gym prompts are
    longer than tiny-base's 64-token context, which the engine refuses to exceed)."""
    import torch
    from transformers import LlamaForCausalLM

    from reinforge.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-base")
    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama_config(tok, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                                           eos_token_id=tok.eos_token_id, tie_word_embeddings=True))
    path = directory / "long-model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_reward_model(directory: Path) -> Path:
    """A random one-layer LlamaForSequenceClassification with a scalar head and the shipped tokenizer."""
    import torch
    from transformers import LlamaForSequenceClassification

    from reinforge.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-base")
    torch.manual_seed(0)
    rm = LlamaForSequenceClassification(_llama_config(tok, num_labels=1, max_position_embeddings=64))
    path = directory / "reward-model"
    rm.save_pretrained(path)
    tok.save_pretrained(path)
    return path
