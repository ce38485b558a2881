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


def test_only_the_real_completion_tokens_go_through_the_linears():
    """Padding after a row's last completion token costs no projection, MLP or LM-head work: the MLP sees, in one
    call, the prompts' positions and exactly the batch's real completion tokens, not N x C positions; the LM head
    only the real completion tokens."""
    model = _model("llama")
    ids, attn, mask, prefix, groups = _batch()
    rows = []
    hooks = [model.model.layers[0].mlp.register_forward_hook(lambda m, a, out: rows.append(("mlp", a[0].shape))),
             model.lm_head.register_forward_hook(lambda m, a, out: rows.append(("head", a[0].shape)))]
    shared_prefix_logprobs(SharedPrefixForward(model), ids, attn, prefix, groups)
    for h in hooks:
        h.remove()
    real = int(mask.sum())  # 25 completion tokens in 9 rows padded to 5
    assert real < 9 * 5
    assert rows == [("mlp", (3 * 5 + real, 32)), ("head", (real, 32))]  # 3 prompts padded to 5, then the real tokens


@pytest.mark.parametrize(("dtype", "queries", "kernel"), [(torch.bfloat16, 6, "math"), (torch.bfloat16, 256, "flash"),
                                                          (torch.float32, 6, "flash")])
def test_cpu_attention_takes_the_math_kernel_for_short_bf16_queries(dtype, queries, kernel):
    """On the CPU the flash kernel's bf16 backward is several times slower than the math kernel's for short queries
    (benchmarks/BENCHMARKS.md); float32 and long queries keep flash. Both give the same attention."""
    from torch.profiler import ProfilerActivity, profile

    from reinforge.learn.shared_prefix import attend

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g).to(dtype) for n in (queries, queries + 3, queries + 3))
    mask = torch.ones(2, 1, queries, queries + 3, dtype=torch.bool).tril(3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = attend(q, k, v, mask, gqa=False)
    names = {e.key for e in prof.key_averages()}
    assert any(kernel in n for n in names if "scaled_dot_product" in n), names
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    torch.testing.assert_close(out.float(), ref, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)
