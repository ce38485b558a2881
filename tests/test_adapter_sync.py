"""Adapter-only sync (model.lora.sync=adapter, docs/lora.md): the torch engine applies unmerged LoRA
adapters at decode time, several at once, chosen per request; a LoRA GRPO run with it matches one
with merged weights."""

import copy

import pytest
import torch

from reinforge.config import LoraConfig, load_config
from reinforge.errors import ConfigError, ReinforgeError
from reinforge.learn.lora import adapter_weights, merged_weights, wrap_lora
from reinforge.models.loading import load_model
from reinforge.orchestrate.components import build_engine
from reinforge.orchestrate.run import train
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.track.jsonl import read_jsonl

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[1, 5, 6, 7], [1, 8, 9], [1, 4, 12, 13, 6], [1, 10]]


def _policy(base, seed, targets=ALL, std=0.3):
    """A LoRA policy over a copy of ``base`` whose B is far from 0 (so the adapter changes what is sampled)."""
    policy = wrap_lora(copy.deepcopy(base), LoraConfig(enabled=True, r=4, alpha=8, target_modules=targets), seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return policy


def _generate(engine, adapters, continuous, n=2):
    engine.continuous = continuous
    requests = [GenerationRequest(p, str(i), adapter=a) for i, (p, a) in enumerate(zip(PROMPTS, adapters, strict=True))]
    return engine.generate(requests, SamplingParams(max_new_tokens=10, greedy=True, n=n))


def _same(gens, other, atol=1e-4):
    assert [g.token_ids for g in gens] == [g.token_ids for g in other]
    for g, h in zip(gens, other, strict=True):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(h.logprobs), atol=atol)


@pytest.fixture(scope="module")
def base():
    return load_model("tiny-base")


@pytest.mark.parametrize("continuous", [True, False])
def test_unmerged_adapter_decodes_like_merged_weights(base, tiny_tokenizer, continuous):
    policy = _policy(base, seed=1)
    merged = TorchRolloutEngine(copy.deepcopy(base), tiny_tokenizer)
    merged.update_weights(merged_weights(policy), 1)
    unmerged = TorchRolloutEngine(copy.deepcopy(base), tiny_tokenizer)
    unmerged.update_adapter("p", adapter_weights(policy), 1)
    with_adapter = _generate(unmerged, ["p"] * 4, continuous)
    _same(with_adapter, _generate(merged, [None] * 4, continuous))
    assert all(g.version == 1 for g in with_adapter)
    base_only = _generate(unmerged, [None] * 4, continuous)  # no adapter named, no default: the base
    assert [g.token_ids for g in base_only] != [g.token_ids for g in with_adapter]
    _same(base_only, _generate(TorchRolloutEngine(copy.deepcopy(base), tiny_tokenizer), [None] * 4, continuous))


@pytest.mark.parametrize("continuous", [True, False])
def test_a_mixed_batch_of_two_adapters_equals_each_alone(base, tiny_tokenizer, continuous):
    engine = TorchRolloutEngine(copy.deepcopy(base), tiny_tokenizer, max_batch_sequences=4)  # slots get reused
    engine.update_adapter("x", adapter_weights(_policy(base, seed=1, targets=["q_proj", "v_proj", "down_proj"])))
    engine.update_adapter("y", adapter_weights(_policy(base, seed=2, targets=["k_proj", "o_proj", "up_proj"])))
    names = ["x", "y", None, "x"]
    mixed = _generate(engine, names, continuous)
    alone = {name: _generate(engine, [name] * 4, continuous) for name in ("x", "y", None)}
    for i, g in enumerate(mixed):  # row i: request int(g.request_id), sampled under its adapter
        _same([g], [alone[names[int(g.request_id)]][i]])
    assert [g.token_ids for g in alone["x"]] != [g.token_ids for g in alone["y"]]
    engine.remove_adapter("x")
    with pytest.raises(ReinforgeError, match=r"adapters \['x'\]"):
        _generate(engine, ["x", "y", None, "x"], continuous)


def test_adapter_weights_are_a_fraction_of_the_merged_bytes(base):
    policy = _policy(base, seed=1, targets=["q_proj", "v_proj"])
    sent = adapter_weights(policy)
    merged = sum(t.numel() * t.element_size() for t in merged_weights(policy).values())
    assert len(sent.modules) == 2 * base.config.num_hidden_layers
    assert sent.nbytes() == 2 * 3 * (4 * 256 + 256 * 4) * 4  # 2 modules x 3 layers x (A + B) x fp32
    assert sent.nbytes() < merged / 50


def _cfg(tmp_path, name, *overrides):
    return load_config(None, [
        f"output_dir={tmp_path}", f"name={name}", "model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=8", "train.time_limit_s=0",
        "train.steps=3", "train.lr=5e-3", "algo.skip_equal_reward_groups=false", "eval.final_samples=0", "eval.every=0", "log.report=false", "seed=3",
        *overrides,
    ])


@pytest.mark.slow
def test_lora_grpo_with_adapter_sync_matches_merged_sync(tmp_path, monkeypatch):
    runs, calls = {}, []  # calls: (what the engine received, its bytes)
    adapter, weights = TorchRolloutEngine.update_adapter, TorchRolloutEngine.update_weights
    monkeypatch.setattr(TorchRolloutEngine, "update_adapter", lambda self, name, w, version=None: (
        calls.append(("adapter", w.nbytes())), adapter(self, name, w, version))[1])
    monkeypatch.setattr(TorchRolloutEngine, "update_weights", lambda self, state, version: (
        calls.append(("full", 0)), weights(self, state, version))[1])
    received = {}
    for sync in ("merged", "adapter"):
        calls.clear()
        result = train(_cfg(tmp_path, sync, f"model.lora.sync={sync}",
                            "model.lora.target_modules=[q_proj,v_proj,up_proj]"))
        runs[sync] = [r for r in read_jsonl(result.run_dir / "metrics.jsonl") if "train/loss" in r]
        received[sync] = list(calls)
    assert len(runs["merged"]) == len(runs["adapter"]) == 3
    for m, a in zip(runs["merged"], runs["adapter"], strict=True):
        assert m["reward/mean"] == a["reward/mean"]  # the same completions sampled
        assert a["train/loss"] == pytest.approx(m["train/loss"], abs=1e-5)
        assert a["train/logprob_mismatch"] < 1e-4  # the engine's unmerged adapter is the learner's policy
    assert runs["adapter"][-1]["train/loss"] != runs["adapter"][0]["train/loss"]
    assert {kind for kind, _ in received["merged"]} == {"full"}
    pushed = [n for kind, n in received["adapter"] if kind == "adapter" and n > 0]
    assert {kind for kind, _ in received["adapter"]} == {"adapter"} and len(pushed) >= 3  # after every update


def test_adapter_sync_is_refused_where_it_cannot_work(tmp_path, tiny_tokenizer):
    with pytest.raises(ConfigError, match="bias=all"):
        _cfg(tmp_path, "x", "model.lora.sync=adapter", "model.lora.bias=all")
    with pytest.raises(ConfigError, match="orchestrate.mode=sync"):
        _cfg(tmp_path, "x", "model.lora.sync=adapter", "orchestrate.mode=async")
    with pytest.raises(ConfigError, match="rollout.engine=openai does not apply unmerged adapters"):
        build_engine(_cfg(tmp_path, "x", "model.lora.sync=adapter", "rollout.engine=openai",
                          "rollout.server_url=http://127.0.0.1:9/v1"), load_model("tiny-base"), tiny_tokenizer)
    cfg = _cfg(tmp_path, "x", "model.lora.sync=adapter")
    engine = build_engine(cfg, load_model("tiny-base"), tiny_tokenizer)
    assert engine.default_adapter == "default" and engine.adapters == ["default"]
    engine.lean = None  # an architecture without the lean forward
    with pytest.raises(ReinforgeError, match="model.lora.sync=merged"):
        engine.update_adapter("default", adapter_weights(_policy(load_model("tiny-base"), seed=0)))



def _tiny64(kind):
    """A float64 Llama or Qwen2 (GQA; Qwen2 with q/k/v biases, made non-zero)."""
    from numerics import float64_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = (LlamaForCausalLM(LlamaConfig(**common)) if kind == "llama"
             else Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))).eval()
    if kind == "qwen2":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.bias.normal_()
                layer.self_attn.k_proj.bias.normal_()
    return float64_model(model)


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_forward_with_unmerged_adapters_equals_peft(kind):
    """Prefill, cached decode and slot decode of the lean forward, rows under two adapters and the
    base in one batch, equal the peft model's HF forward with that row's adapter (float64)."""
    from numerics import assert_exact, float64_model

    from reinforge.models.lean_llama import LeanLlama

    model = _tiny64(kind)
    lean = LeanLlama(copy.deepcopy(model))
    policies = [float64_model(_policy(model, seed=s, targets=t)) for s, t in ((1, ALL), (2, ["k_proj", "down_proj"]))]
    for name, policy in zip(("x", "y"), policies, strict=True):
        lean.adapters.set(name, adapter_weights(policy))
    ids = torch.randint(1, 40, (3, 6), generator=torch.Generator().manual_seed(0))
    nxt = torch.randint(1, 40, (3, 1), generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([0, 1, -1])
    with torch.no_grad():
        full = torch.cat([ids, nxt], dim=1)
        expected = torch.stack([m(input_ids=full[i : i + 1]).logits[0, -2:] for i, m in enumerate([*policies, model])])
    want_prefill, want_step = expected[:, 0], expected[:, 1]  # row i: policy x, policy y, the base
    cache, key = lean.new_cache(3, 8), torch.ones(3, 7, dtype=torch.bool)
    pos = torch.arange(7).expand(3, 7)
    assert_exact(lean.forward(ids, pos[:, :6], key, cache, rows), want_prefill, "prefill")
    assert_exact(lean.forward(nxt, pos[:, 6:], key, cache, rows), want_step, "cached decode")
    slots = lean.new_slot_cache(3, 8)
    lengths, index = torch.full((3,), 6), torch.arange(3)
    assert_exact(lean.prefill_slots(ids, lengths, slots, index, index, rows), want_prefill, "slot prefill")
    assert_exact(lean.decode_slots(nxt[:, 0], lengths, slots, adapters=rows), want_step, "slot decode")
