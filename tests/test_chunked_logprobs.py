"""The LM head in chunks of positions (learn/lm_head.py, ``train.logprob_chunk_tokens``) gives the plain
path's log-probs, entropies and gradients (mathematically equal paths: compared in float64,
tests/numerics.py) in the plain, shared-prefix and packed forwards and through a whole learner update,
while its largest logits allocation is one chunk's instead of the whole batch's."""

from __future__ import annotations

import types

import pytest
import torch
from numerics import assert_all_exact, assert_exact, exact_approx, float64_model
from test_memory_features import _update
from test_shared_prefix import _batch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoModelForCausalLM, Gemma2Config, GraniteConfig, LlamaConfig, Qwen2Config

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.learn.lm_head import check_plain_head, chunked_token_logprobs, final_hidden
from reinforge.learn.logprobs import token_logprobs
from reinforge.learn.packing import packed_token_logprobs
from reinforge.learn.shared_prefix import SharedPrefixForward, shared_prefix_logprobs
from reinforge.models.loading import load_model

pytestmark = pytest.mark.filterwarnings(r"ignore:Seems like `optimizer.step\(\)` has been overridden")

VOCAB = 97


def _model(kind: str = "llama", tied: bool = False, vocab: int = VOCAB, hidden: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied)
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)
    model = AutoModelForCausalLM.from_config(config)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    return model


def _rows(n: int = 3, width: int = 11, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows of lengths width, width - 4, width - 1."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (n, width), generator=g)
    attn = torch.ones_like(ids)
    attn[1, width - 4:] = 0
    attn[2 % n, width - 1:] = 0
    return ids * attn, attn


def _grads_of(model: torch.nn.Module, fn) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """(logp, entropy) of ``fn()``, and every parameter's gradient of a weighted sum of both."""
    model.zero_grad()
    logp, ent = fn()
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(2), dtype=logp.dtype)
    ((logp + (0.1 * ent if ent is not None else 0)) * weights).sum().backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return logp.detach(), (ent.detach() if ent is not None else None), grads


def _assert_same(a, b) -> None:
    assert_exact(a[0], b[0], "logp")
    if b[1] is not None:
        assert_exact(a[1], b[1], "entropy")
    assert sum(float(g.norm()) for g in b[2]) > 1e-3
    assert_all_exact(a[2], b[2])


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_final_hidden_is_what_lm_head_reads(kind):
    """In transformers 5 the decoder's last_hidden_state has the final norm applied: lm_head of it is
    the causal LM's logits."""
    model = float64_model(_model(kind))
    ids, attn = _rows()
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
    assert_exact(model.get_output_embeddings()(final_hidden(model, ids, attn)), logits)


@pytest.mark.numerics
@pytest.mark.parametrize("kind,tied", [("llama", False), ("llama", True), ("qwen2", False)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 7, 1000])  # 7 does not divide 3 x 10 positions; 1000 is one chunk
def test_chunked_equals_plain_values_and_gradients(kind, tied, temperature, chunk):
    model = float64_model(_model(kind, tied))
    ids, attn = _rows()
    plain = _grads_of(model, lambda: token_logprobs(model, ids, attn, temperature, True, entropy_grad=True))
    chunked = _grads_of(model, lambda: token_logprobs(model, ids, attn, temperature, True, entropy_grad=True,
                                                      chunk_tokens=chunk))
    _assert_same(chunked, plain)


@pytest.mark.numerics
def test_entropy_without_gradient_and_without_grad_mode():
    model = float64_model(_model())
    ids, attn = _rows()
    logp, ent = token_logprobs(model, ids, attn, 0.9, entropy=True, entropy_grad=False, chunk_tokens=5)
    assert logp.requires_grad and not ent.requires_grad  # a detached statistic, as on the plain path
    plain = _grads_of(model, lambda: token_logprobs(model, ids, attn, 0.9, entropy=False))
    chunked = _grads_of(model, lambda: token_logprobs(model, ids, attn, 0.9, entropy=False, chunk_tokens=5))
    _assert_same(chunked, plain)
    with torch.no_grad():  # the no-grad passes (old and reference log-probs): no checkpoint, same values
        a = token_logprobs(model, ids, attn, 0.9, entropy=True, chunk_tokens=4)
        b = token_logprobs(model, ids, attn, 0.9, entropy=True)
    assert_exact(a[0], b[0])
    assert_exact(a[1], b[1])


@pytest.mark.numerics
def test_the_shipped_tiny_model():
    model = float64_model(load_model("tiny-base"))
    ids, attn = _rows(vocab=model.config.vocab_size)
    plain = _grads_of(model, lambda: token_logprobs(model, ids, attn, 1.0, True, entropy_grad=True))
    chunked = _grads_of(model, lambda: token_logprobs(model, ids, attn, 1.0, True, entropy_grad=True,
                                                      chunk_tokens=6))
    _assert_same(chunked, plain)


@pytest.mark.numerics
def test_packed_forward_chunked_equals_plain():
    model = float64_model(_model())
    ids, attn = _rows()
    plain = _grads_of(model, lambda: packed_token_logprobs(model, ids, attn, 22, 0.8, True, entropy_grad=True))
    chunked = _grads_of(model, lambda: packed_token_logprobs(model, ids, attn, 22, 0.8, True, entropy_grad=True,
                                                             chunk_tokens=5))
    _assert_same(chunked, plain)


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_shared_prefix_forward_chunked_equals_plain(kind):
    model = float64_model(_model(kind, vocab=30))
    ids, attn, _, prefix, groups = _batch()  # test_shared_prefix's rows: vocabulary 30

    def run(chunk):
        fwd = SharedPrefixForward(model, chunk_tokens=chunk)
        return lambda: shared_prefix_logprobs(fwd, ids, attn, prefix, groups, 0.7, entropy=True)

    _assert_same(_grads_of(model, run(5)), _grads_of(model, run(0)))


@pytest.mark.numerics
def test_lora_wrapped_model_with_the_head_adapted():
    """peft wraps lm_head: the chunked path takes it from get_output_embeddings(), adapter included (and
    disabled with the others: the LoRA reference)."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(3)
    model = peft.get_peft_model(float64_model(_model()), peft.LoraConfig(
        r=4, target_modules=["q_proj", "lm_head"], init_lora_weights=False))  # B != 0: the adapters matter
    ids, attn = _rows()
    plain = _grads_of(model, lambda: token_logprobs(model, ids, attn, 1.0, True, entropy_grad=True))
    chunked = _grads_of(model, lambda: token_logprobs(model, ids, attn, 1.0, True, entropy_grad=True,
                                                      chunk_tokens=7))
    _assert_same(chunked, plain)
    with torch.no_grad(), model.disable_adapter():
        off = token_logprobs(model, ids, attn, chunk_tokens=7)[0]
        assert_exact(off, token_logprobs(model, ids, attn)[0])
    assert (off - plain[0]).abs().max() > 1e-3  # the adapters changed the log-probs


def test_bf16_autocast_upcasts_each_chunk():
    model = _model()
    ids, attn = _rows()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = token_logprobs(model, ids, attn, 1.0, True, entropy_grad=True, chunk_tokens=7)
        ref_logp, ref_ent = token_logprobs(model, ids, attn, 1.0, True, entropy_grad=True)
    assert logp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, atol=2e-2, rtol=0)  # the same bf16 head, rounded alike
    torch.testing.assert_close(ent, ref_ent, atol=2e-2, rtol=0)
    (logp.sum() + ent.sum()).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_empty_input_and_bad_chunk():
    head = torch.nn.Linear(4, 9)
    logp, ent = chunked_token_logprobs(torch.zeros(2, 0, 4), head, torch.zeros(2, 0, dtype=torch.long), entropy=True)
    assert logp.shape == ent.shape == (2, 0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_logprobs(torch.zeros(2, 4), head, torch.zeros(2, dtype=torch.long), chunk_tokens=0)


def test_models_that_change_their_logits_after_the_head_are_refused():
    with pytest.raises(ConfigError, match="train.logprob_chunk_tokens.*final_logit_softcapping"):
        check_plain_head(types.SimpleNamespace(config=Gemma2Config(final_logit_softcapping=30.0)))
    with pytest.raises(ConfigError, match="logits_scaling"):
        check_plain_head(types.SimpleNamespace(config=GraniteConfig(logits_scaling=8.0)))
    check_plain_head(types.SimpleNamespace(config=GraniteConfig(logits_scaling=1.0)))  # a scale of 1 changes nothing
    check_plain_head(_model())


def test_config_option(tmp_path):
    assert load_config(None, [f"output_dir={tmp_path}"]).train.logprob_chunk_tokens == 0  # the plain path
    assert load_config(None, [f"output_dir={tmp_path}", "train.logprob_chunk_tokens=512"]).train.logprob_chunk_tokens == 512
    with pytest.raises(ConfigError, match="train.logprob_chunk_tokens"):
        load_config(None, [f"output_dir={tmp_path}", "train.logprob_chunk_tokens=-1"])
    with pytest.raises(ConfigError, match="train.logprob_chunk_tokens.*train.parallel=fsdp"):
        load_config(None, [f"output_dir={tmp_path}", "train.logprob_chunk_tokens=64", "train.parallel=fsdp"])


class LargestAllocation(TorchDispatchMode):
    """The largest tensor any op allocates (views excluded), in bytes: overall, and among tensors whose
    last dimension is the vocabulary (logits, log-softmax, their gradients). Deterministic, unlike RSS."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.any, self.rows = vocab, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t._is_view():
                size = t.numel() * t.element_size()
                self.any = max(self.any, size)
                if t.dim() >= 2 and t.shape[-1] == self.vocab:
                    self.rows = max(self.rows, size)
        return out


def test_the_largest_logits_allocation_is_one_chunk():
    """Forward and backward (the recomputed chunks included): the plain path allocates the float32
    logits of every position, N x T x V x 4 bytes; the chunked one chunk_tokens x V x 4, shrinking with it.
    (Hidden size 8 < every chunk: the head's weight gradient, H x V, is then never the largest.)"""
    vocab, n, width = 1000, 4, 17
    model = _model(vocab=vocab, hidden=8)
    ids, attn = _rows(n, width, vocab)
    peaks, calls = {}, []
    model.get_output_embeddings().register_forward_pre_hook(lambda *_: calls.append(1))
    for chunk in (0, 32, 16, 9):
        model.zero_grad()
        calls.clear()
        with LargestAllocation(vocab) as seen:
            logp, ent = token_logprobs(model, ids, attn, 0.8, True, entropy_grad=True, chunk_tokens=chunk)
            (logp.sum() + ent.sum()).backward()
        peaks[chunk] = (seen.rows, seen.any)
        positions = n * (width - 1)
        assert len(calls) == (1 if chunk == 0 else 2 * -(-positions // chunk))  # each chunk again in the backward
    assert peaks[0] == (n * width * vocab * 4,) * 2  # HF's logits [N, T, V] in float32: the largest of all
    for chunk in (32, 16, 9):
        assert peaks[chunk] == (chunk * vocab * 4,) * 2  # one chunk's logits, still the largest of all


@pytest.mark.numerics
@pytest.mark.parametrize("forward", [["train.shared_prefix=false"], ["train.shared_prefix=true"], ["train.packing=true"],
                                     ["train.shared_prefix=false", "train.gradient_checkpointing=true"]],
                         ids=["plain", "shared_prefix", "packed", "plain_layer_checkpointing"])
def test_a_learner_update_is_the_same(tmp_path, forward):
    """Gradients at the optimizer step of a whole update (policy and KL reference passes, micro-batches,
    entropy metric) equal the plain head's, in float64."""
    calls = {0: 0, 7: 0}

    def count_head_calls(chunk):
        def spy(c):
            c.learner.model.lm_head.register_forward_pre_hook(lambda *_: calls.__setitem__(chunk, calls[chunk] + 1))
        return spy

    g0, m0, batch, c0 = _update(tmp_path, *forward, spy=count_head_calls(0), exact=True)
    g1, m1, _, c1 = _update(tmp_path, *forward, "train.logprob_chunk_tokens=7", batch=batch,
                            spy=count_head_calls(7), exact=True)
    assert c1.learner.forward.chunk_tokens == 7 and c0.learner.forward.chunk_tokens == 0
    assert calls[7] > 2 * calls[0] > 0  # the head ran per chunk, and again in the backward
    assert type(c1.learner.forward) is type(c0.learner.forward)
    assert sum(float(x.norm()) for x in g0) > 1e-3
    assert_all_exact(g1, g0)
    assert m1["kl_ref"] == exact_approx(m0["kl_ref"])
    assert m1["entropy"] == exact_approx(m0["entropy"])


@pytest.mark.numerics
def test_a_learner_update_gives_the_same_parameters(tmp_path):
    """The optimizer step included (AdamW, gradient clipping): the updated parameters are the same."""
    _, _, batch, _ = _update(tmp_path, exact=True)
    plain = _params_after_update(tmp_path, batch)
    chunked = _params_after_update(tmp_path, batch, "train.logprob_chunk_tokens=9")
    start = [p.detach().double() for p in load_model("tiny-base").parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(plain, start, strict=True)) > 1e-6  # the step moved them
    assert_all_exact(chunked, plain)


def _params_after_update(tmp_path, batch, *overrides) -> list[torch.Tensor]:
    """The float64 policy's parameters after one real ``Learner.update`` on ``batch`` (test_memory_features'
    recipe)."""
    from test_memory_features import BASE

    from reinforge.orchestrate.components import build_components

    c = build_components(load_config(None, [f"output_dir={tmp_path}", *BASE, *overrides, "model.dtype=float64"]))
    float64_model(c.learner.model)
    float64_model(c.learner.ref_model)
    c.learner.update(batch.select(list(range(len(batch)))))
    return [p.detach().clone() for p in c.learner.model.parameters()]
