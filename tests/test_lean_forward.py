"""LeanLlama's logits equal the HF forward's (Llama and Qwen2 with GQA and QKV bias), with left padding
(mathematically equal paths: compared in float64, tests/numerics.py)."""

import pytest
import torch
from numerics import assert_exact, float64_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from reinforge.models.lean_llama import LeanLlama, supports


def _tiny(kind: str):
    torch.manual_seed(0)
    common = dict(vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if kind == "llama":
        return float64_model(LlamaForCausalLM(LlamaConfig(**common, rope_theta=500.0)).eval())
    return float64_model(Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False)).eval())


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_logits_match_hf_with_left_padding_and_cache(kind):
    model = _tiny(kind)
    if kind == "qwen2":
        with torch.no_grad():  # Qwen2 has q/k/v biases: make them non-zero so they are exercised
            for layer in model.model.layers:
                layer.self_attn.q_proj.bias.normal_()
                layer.self_attn.k_proj.bias.normal_()
    assert supports(model)
    lean = LeanLlama(model)
    ids = torch.randint(1, 40, (3, 7))
    attn = torch.ones(3, 7, dtype=torch.long)
    attn[1, :3] = 0  # left padding
    attn[2, :6] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = lean.new_cache(3, 10)
    lean_logits = lean.forward(ids, pos, attn.bool(), cache)
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
    assert_exact(lean_logits, hf.logits[:, -1])
    hf_cache, next_pos = hf.past_key_values, pos[:, -1:] + 1
    for _ in range(3):  # decode steps
        tok = lean_logits.argmax(-1, keepdim=True)
        attn = torch.cat([attn, torch.ones(3, 1, dtype=torch.long)], dim=1)
        lean_logits = lean.forward(tok, next_pos, attn.bool(), cache)
        with torch.no_grad():
            hf = model(input_ids=tok, attention_mask=attn, position_ids=next_pos, past_key_values=hf_cache, use_cache=True)
        hf_cache = hf.past_key_values
        assert_exact(lean_logits, hf.logits[:, -1])
        next_pos = next_pos + 1


@pytest.mark.numerics
def test_sync_picks_up_in_place_weight_updates():
    model = _tiny("llama")
    lean = LeanLlama(model)
    ids = torch.randint(1, 40, (2, 5))
    attn = torch.ones(2, 5, dtype=torch.long)
    pos = attn.cumsum(-1) - 1
    before = lean.forward(ids, pos, attn.bool(), lean.new_cache(2, 5))
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)
    lean.sync()
    after = lean.forward(ids, pos, attn.bool(), lean.new_cache(2, 5))
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=attn).logits[:, -1]
    assert not torch.allclose(before, after)
    assert_exact(after, hf)
