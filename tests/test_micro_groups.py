"""Infinite Sampling's micro sampling groups: samples distributed as plain sampling, requests and order
bookkeeping, the slot cap (KV-cache slots) and its restoration, the length memory's state round trip."""

from __future__ import annotations

import json

import pytest

from reinforge.errors import ReinforgeError
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.micro_groups import MicroGroupSettings
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from tests.sampler_fixtures import chi_square_pvalue, exact_completion_probs, random_policy

PROMPT = [1, 5, 6]


class _Engine:
    """Records each call's queue, n and slot limit; completion of request ``r`` is LENGTHS[r] tokens."""

    LENGTHS = {"a": 5, "b": 1, "c": 3}

    def __init__(self):
        self.max_batch_sequences, self.calls = 512, []

    def generate(self, requests, params):
        self.calls.append(([r.request_id for r in requests], params.n, self.max_batch_sequences))
        return [Generation(r.request_id, r.prompt_ids, [7] * self.LENGTHS[r.request_id], [0.0] * self.LENGTHS[r.request_id],
                           "stop", 0, extra={"call_index": k}) for k, r in enumerate(requests) for _ in range(params.n)]


def test_micro_groups_are_queued_shortest_first_and_returned_in_request_order():
    engine = _Engine()
    sampler = build_group_sampler("micro_groups", MicroGroupSettings(micro_group=2, max_slots=4))
    reqs = [GenerationRequest([1], rid) for rid in "abc"]
    params = SamplingParams(max_new_tokens=8, n=4)
    first = sampler.sample(engine, reqs, params)  # nothing known yet: request order
    assert engine.calls[0] == (["a", "a", "b", "b", "c", "c"], 2, 4)
    assert engine.max_batch_sequences == 512  # the cap is set for the call only
    assert [(g.request_id, g.sample_index) for g in first] == [(r, i) for r in "abc" for i in range(4)]
    second = sampler.sample(engine, reqs, params)
    assert engine.calls[1][0] == ["b", "b", "c", "c", "a", "a"]  # predicted 1, 3, 5 tokens
    assert [g.request_id for g in second] == [r for r in "abc" for _ in range(4)]
    assert sampler.counters()["micro_groups/slots"] == 4 and sampler.counters()["micro_groups/slots_whole_groups"] == 12
    assert sampler.state_dict() == {"lengths": {"a": 5.0, "b": 1.0, "c": 3.0}}


def test_length_memory_round_trips_and_keeps_the_newest_prompts():
    engine = _Engine()
    a = build_group_sampler("micro_groups", MicroGroupSettings(micro_group=1, max_prompts=2))
    a.sample(engine, [GenerationRequest([1], r) for r in "abc"], SamplingParams(max_new_tokens=8, n=2))
    state = json.loads(json.dumps(a.state_dict()))
    assert list(state["lengths"]) == ["b", "c"]
    b = build_group_sampler("micro_groups", MicroGroupSettings(micro_group=1, max_prompts=2))
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()


def test_a_micro_group_must_divide_the_group():
    with pytest.raises(ReinforgeError, match="micro_group=3"):
        build_group_sampler("micro_groups", MicroGroupSettings(micro_group=3)).sample(
            _Engine(), [GenerationRequest([1], "a")], SamplingParams(n=8))


def _engine():
    model, tok = random_policy(seed=1)
    return TorchRolloutEngine(model, tok, seed=0), model


def test_the_kv_cache_holds_max_slots_sequences():
    engine, _ = _engine()
    sizes = []
    new_cache = engine.lean.new_slot_cache
    engine.lean.new_slot_cache = lambda slots, max_len: sizes.append(slots) or new_cache(slots, max_len)
    reqs = [GenerationRequest(PROMPT, f"p{k}") for k in range(4)]
    params = SamplingParams(max_new_tokens=4, n=8)
    engine.generate(reqs, params)
    build_group_sampler("micro_groups", MicroGroupSettings(micro_group=2, max_slots=4)).sample(engine, reqs, params)
    assert sizes == [32, 4]  # whole groups: 4 prompts x 8; micro-groups: at most 4 slots at once


def test_micro_groups_sample_as_plain_sampling():
    engine, model = _engine()
    params = SamplingParams(max_new_tokens=3, top_k=3, n=4)
    sampler = build_group_sampler("micro_groups", MicroGroupSettings(micro_group=2, max_slots=16))
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(2):  # the second round is scheduled by the first round's lengths
        for g in sampler.sample(engine, [GenerationRequest(PROMPT, f"p{k}") for k in range(16)], params):
            counts[tuple(g.token_ids)] = counts.get(tuple(g.token_ids), 0) + 1
    assert sum(counts.values()) == 2 * 16 * 4
    assert chi_square_pvalue(counts, exact_completion_probs(model, PROMPT, params, eos=2)) > 1e-3
