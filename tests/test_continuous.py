"""Continuous batching in the rollout engine: slots freed by finished sequences are refilled at the
next step, results equal the static batch (and HF), and the cache shrinks at the tail."""

import copy

import pytest
import torch
from numerics import assert_exact, exact_approx, float64_model

from reinforge.learn.logprobs import token_logprobs
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams
from tests.test_engine import _requests


class Spy:
    """Records the batch size of every prefill and decode call of a LeanLlama."""

    def __init__(self, lean):
        self.calls: list[tuple[str, int]] = []
        prefill, decode = lean.prefill_slots, lean.decode_slots
        lean.prefill_slots = lambda ids, *a: (self.calls.append(("prefill", ids.shape[0])), prefill(ids, *a))[1]
        lean.decode_slots = lambda ids, *a: (self.calls.append(("decode", ids.shape[0])), decode(ids, *a))[1]


@pytest.mark.numerics
@pytest.mark.parametrize("slots", [2, 5, 512])
def test_greedy_equals_static_batch_for_any_slot_count(tiny_model, tiny_tokenizer, slots):
    """The same arithmetic in other batches: compared in float64 (tests/numerics.py)."""
    model = float64_model(copy.deepcopy(tiny_model))
    reqs = _requests(tiny_tokenizer, 12)
    params = SamplingParams(max_new_tokens=7, greedy=True, n=2)
    static = TorchRolloutEngine(copy.deepcopy(model), tiny_tokenizer, continuous=False).generate(reqs, params)
    engine = TorchRolloutEngine(copy.deepcopy(model), tiny_tokenizer, max_batch_sequences=slots)
    cont = engine.generate(reqs, params)
    assert [(g.request_id, g.sample_index) for g in cont] == [(g.request_id, g.sample_index) for g in static]
    for a, b in zip(cont, static, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason and a.text == b.text
        assert a.logprobs == [exact_approx(x) for x in b.logprobs]


@pytest.mark.numerics
def test_sampled_logprobs_match_learner_with_few_slots(tiny_model, tiny_tokenizer):
    """The engine's sampling log-probs are the learner's, in float64 (tests/numerics.py)."""
    tiny_model = float64_model(copy.deepcopy(tiny_model))
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, seed=3, max_batch_sequences=6)
    gens = engine.generate(_requests(tiny_tokenizer, 10), SamplingParams(max_new_tokens=6, n=3, temperature=0.8))
    for g in gens:
        ids = torch.tensor([g.prompt_ids + g.token_ids])
        with torch.no_grad():
            logp, _ = token_logprobs(tiny_model, ids, torch.ones_like(ids), 0.8)
        assert_exact(logp[0, len(g.prompt_ids):], torch.tensor(g.logprobs, dtype=torch.float64))


def test_freed_slots_are_refilled_and_the_tail_is_compacted(tiny_model, tiny_tokenizer):
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, seed=0, max_batch_sequences=8)
    spy = Spy(engine.lean)
    reqs = _requests(tiny_tokenizer, 12)
    gens = engine.generate(reqs, SamplingParams(max_new_tokens=8, n=2, temperature=2.5))  # hot: varied lengths
    assert len(gens) == 24
    kinds = [k for k, _ in spy.calls]
    first_decode = kinds.index("decode")
    assert "prefill" in kinds[first_decode:], "no request was admitted while others were decoding"
    assert sum(size for k, size in spy.calls if k == "prefill") == 12  # every prompt prefilled exactly once
    decode_sizes = [size for k, size in spy.calls if k == "decode"]
    # fewer decode steps than running the 24 rows as 3 static batches of 8 to their longest member
    static_steps = sum(max(len(g.token_ids) for g in gens[i : i + 8]) for i in range(0, 24, 8))
    assert len(decode_sizes) < static_steps
    # the tail: nothing waits, and once at most half of the slots are busy the cache is compacted
    tail = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, seed=0, max_batch_sequences=16)
    spy = Spy(tail.lean)
    gens = tail.generate(reqs[:2], SamplingParams(max_new_tokens=8, n=8, temperature=2.5))
    lengths = sorted(len(g.token_ids) for g in gens)
    assert lengths[7] < lengths[-1], "the sample needs a long tail"
    decode_sizes = [size for k, size in spy.calls if k == "decode"]
    assert decode_sizes[0] == 16 and decode_sizes[-1] <= 8
    assert decode_sizes == sorted(decode_sizes, reverse=True)


def test_stop_strings_and_callbacks_in_continuous_mode(tiny_model, tiny_tokenizer):
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, max_batch_sequences=4)
    seen: dict[int, list[int]] = {}

    def on_step(rows, logits, tokens, logprobs):
        assert logits.shape[0] == rows.shape[0] == tokens.shape[0]
        for r, t in zip(rows.tolist(), tokens.tolist(), strict=True):
            seen.setdefault(r, []).append(t)

    gens = engine.generate(_requests(tiny_tokenizer, 6), SamplingParams(max_new_tokens=6, greedy=True, stop=("1",)),
                           on_step=on_step)
    assert [seen[i] for i in range(len(gens))] == [g.token_ids for g in gens]
    for g in gens:
        if "1" in g.text:
            assert g.text.endswith("1") and g.finish_reason == "stop"


def test_n_larger_than_slots_is_refused(tiny_model, tiny_tokenizer):
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, max_batch_sequences=2)
    with pytest.raises(ValueError, match="exceed max_batch_sequences"):
        engine.generate([GenerationRequest([1, 5])], SamplingParams(n=3))


@pytest.mark.parametrize("continuous", [True, False])
def test_ignore_eos_and_per_token_versions(tiny_model, tiny_tokenizer, continuous):
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, continuous=continuous)
    engine.update_weights(tiny_model, version=3)
    gens = engine.generate(_requests(tiny_tokenizer, 4), SamplingParams(max_new_tokens=9, n=2, ignore_eos=True))
    assert all(len(g.token_ids) == 9 and g.finish_reason == "length" for g in gens)
    assert all(g.token_versions == [3] * 9 for g in gens)
