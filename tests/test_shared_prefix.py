"""The shared-prefix training forward gives the same log-probs, entropies and gradients as the HF forward
(mathematically equal paths: compared in float64, tests/numerics.py)."""

import pytest
import torch
from numerics import assert_exact, float64_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from reinforge.learn.logprobs import token_logprobs
from reinforge.learn.shared_prefix import SharedPrefixForward, shared_prefix_logprobs


def _model(kind):
    torch.manual_seed(0)
    common = dict(vocab_size=30, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if kind == "llama":
        return float64_model(LlamaForCausalLM(LlamaConfig(**common)))
    m = float64_model(Qwen2ForCausalLM(Qwen2Config(**common)))
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.bias.normal_()
    return m


def _batch():
    """3 groups: prompts of length 3, 5, 2; completions of varied length; right-padded rows."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 30, (n,), generator=g).tolist() for n in (3, 5, 2)]
    rows, prefix, groups = [], [], []
    for gi, comp_lens in enumerate([(4, 1, 3), (2, 2), (5, 3, 1, 4)]):
        for c in comp_lens:
            rows.append(prompts[gi] + torch.randint(1, 30, (c,), generator=g).tolist())
            prefix.append(len(prompts[gi]))
            groups.append(gi)
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
    prefix = torch.tensor(prefix)
    loss_mask = (torch.arange(width) >= prefix[:, None]).double() * attn
    return ids, attn, loss_mask, prefix, torch.tensor(groups)


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_hf_forward(kind, temperature):
    model = _model(kind)
    ids, attn, mask, prefix, groups = _batch()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    ref_logp, ref_ent = token_logprobs(model, ids, attn, temperature, entropy=True, entropy_grad=True)
    (((ref_logp + 0.1 * ref_ent) * weights * mask).sum()).backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    out = shared_prefix_logprobs(SharedPrefixForward(model), ids, attn, prefix, groups, temperature, entropy=True)
    assert out is not None
    logp, ent = out
    assert_exact(logp * mask, ref_logp * mask)
    assert_exact(ent * mask, ref_ent * mask)
    (((logp + 0.1 * ent) * weights * mask).sum()).backward()
    for n, p in model.named_parameters():
        assert_exact(p.grad, ref_grads[n], msg=n)


def test_rows_whose_prefixes_differ_fall_back():
    model = _model("llama")
    ids, attn, mask, prefix, groups = _batch()
    ids[1, 0] = (ids[0, 0] % 29) + 1  # row 1 of group 0 now has another prompt
    assert shared_prefix_logprobs(SharedPrefixForward(model), ids, attn, prefix, groups) is None
