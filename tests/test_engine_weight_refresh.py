"""Every way new weights reach a torch engine refreshes its prepacked (oneDNN) copies: after the
update the engine computes exactly what a fresh engine built on those weights computes (the lean
forward reads only the packed copies, never the HF parameters, so a path that copied the
parameters without ``LeanLlama.sync`` would keep sampling the old policy)."""

from __future__ import annotations

import copy

import torch
from chat_fixtures import two_policies_and_requests

from reinforge.config import LoraConfig
from reinforge.learn.lora import wrap_lora
from reinforge.orchestrate.components import LoraTorchRolloutEngine
from reinforge.orchestrate.shared_weights import SharedWeights
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import SamplingParams
from reinforge.serve.worker import EngineWorker

PARAMS = SamplingParams(max_new_tokens=4, n=2, ignore_eos=True)


def _sampled(engine, requests, seed=5):
    """Token ids and sampling log-probs, from the continuous-batching lean path (packed weights)."""
    gens = engine.generate(requests, PARAMS, generator=torch.Generator().manual_seed(seed))
    return [g.token_ids for g in gens], torch.tensor([g.logprobs for g in gens])


def _assert_engine_runs(engine, reference_model, tok, requests):
    """``engine`` samples exactly as a fresh engine on ``reference_model``; returns its samples."""
    fresh = TorchRolloutEngine(copy.deepcopy(reference_model), tok)
    assert engine.lean is not None and engine.lean.head.packed == fresh.lean.head.packed
    ids, lps = _sampled(engine, requests)
    fresh_ids, fresh_lps = _sampled(fresh, requests)
    assert ids == fresh_ids
    assert torch.equal(lps, fresh_lps)
    return ids, lps


def test_update_weights_stage_and_poll_refresh_the_packed_weights():
    tok, old, new, requests = two_policies_and_requests()
    engine = TorchRolloutEngine(copy.deepcopy(old), tok)
    before = _sampled(engine, requests)
    engine.update_weights(new, 1)  # the sync loop, resume, the Ray actor between requests
    after = _assert_engine_runs(engine, new, tok, requests)
    assert not torch.equal(after[1], before[1])  # the update is visible at all
    engine.stage_weights(old.state_dict(), 2)  # in flight (the Ray actor's inflight mode)
    ids, lps = _sampled(engine, requests)
    assert ids == before[0] and torch.equal(lps, before[1])
    pending = [(new.state_dict(), 3)]
    engine.weight_poll = lambda: pending.pop() if pending else None  # polled hooks
    ids, lps = _sampled(engine, requests)
    assert ids == after[0] and torch.equal(lps, after[1]) and engine.version == 3


def test_shared_memory_weights_of_async_workers_refresh_the_packed_weights():
    tok, old, new, requests = two_policies_and_requests()
    shared = SharedWeights(old)
    worker_engine = TorchRolloutEngine(copy.deepcopy(old), tok)  # a worker's engine, over its own model
    worker_engine.version = -1
    assert shared.sync_engine(worker_engine)
    shared.publish(new, 1)  # the learner's next version
    assert shared.sync_engine(worker_engine) and worker_engine.version == 1
    _assert_engine_runs(worker_engine, new, tok, requests)


def test_lora_runs_hand_merged_adapters_to_the_packed_weights():
    tok, old, _, requests = two_policies_and_requests()
    policy = wrap_lora(copy.deepcopy(old), LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.3)
    engine = LoraTorchRolloutEngine(copy.deepcopy(old), tok)
    engine.update_weights(policy, 1)
    _assert_engine_runs(engine, copy.deepcopy(policy).merge_and_unload(), tok, requests)


def test_the_server_worker_weight_updates_refresh_the_packed_weights():
    tok, old, new, requests = two_policies_and_requests()
    engine = TorchRolloutEngine(copy.deepcopy(old), tok)
    worker = EngineWorker(engine)
    try:
        worker.update_weights(new.state_dict(), 4).result(timeout=30)  # `POST /reinforge/weights`
    finally:
        worker.close()
    _assert_engine_runs(engine, new, tok, requests)


def test_the_packed_weights_are_rebuilt_once_when_the_engine_next_runs(monkeypatch):
    """Updates without a generation in between (the loop's own engine in asynchronous RL, which only
    evaluates) copy the parameters but rebuild the packed copies once, at the next generation, from the
    newest weights."""
    tok, old, new, requests = two_policies_and_requests()
    engine = TorchRolloutEngine(copy.deepcopy(old), tok)
    syncs = []
    real_sync = type(engine.lean).sync
    monkeypatch.setattr(type(engine.lean), "sync", lambda self: syncs.append(1) or real_sync(self))
    for version in range(1, 4):
        engine.update_weights(old if version < 3 else new, version)
    assert syncs == [] and engine.version == 3
    _assert_engine_runs(engine, new, tok, requests)  # the fresh engine's constructor syncs once too
    assert len(syncs) == 2
    _sampled(engine, requests)
    assert len(syncs) == 2  # nothing changed since: no rebuild
