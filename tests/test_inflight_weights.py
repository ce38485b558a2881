"""In-flight weight updates: the engine takes new weights between decode steps without dropping the
sequences it is generating; tokens sampled after the switch carry the new policy version."""

from __future__ import annotations

import copy

import torch
from chat_fixtures import two_policies_and_requests

from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import SamplingParams

PARAMS = SamplingParams(max_new_tokens=12, greedy=True, n=2, ignore_eos=True)


def test_staged_weights_switch_mid_generation_and_tag_tokens():
    tok, old, new, requests = two_policies_and_requests()
    engine = TorchRolloutEngine(copy.deepcopy(old), tok, seed=0)
    steps = []

    def on_step(rows, logits, tokens, logprobs):
        steps.append(1)
        if len(steps) == 4:  # after the 4th sampled token of every row
            engine.stage_weights(new, 7)

    gens = engine.generate(requests, PARAMS, on_step=on_step)
    assert engine.version == 7
    assert len(gens) == 4 and all(len(g.token_ids) == 12 for g in gens), "a sequence was dropped or cut"
    for g in gens:
        assert g.token_versions == [0] * 4 + [7] * 8 and g.version == 0
    # greedy tokens: the first 4 are the old model's, the rest follow the new weights
    only_old = TorchRolloutEngine(copy.deepcopy(old), tok, seed=0).generate(requests, PARAMS)
    assert all(g.token_ids[:4] == o.token_ids[:4] for g, o in zip(gens, only_old, strict=True))
    assert any(g.token_ids[4:] != o.token_ids[4:] for g, o in zip(gens, only_old, strict=True))
    # the engine now holds the new weights exactly
    for (name, p), q in zip(engine.model.named_parameters(), new.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


def test_weight_poll_hook_and_update_between_calls():
    tok, old, new, requests = two_policies_and_requests()
    engine = TorchRolloutEngine(copy.deepcopy(old), tok, seed=0)
    pending = [(new.state_dict(), 3)]
    engine.weight_poll = lambda: pending.pop() if pending else None
    gens = engine.generate(requests, PARAMS)
    assert engine.version == 3 and gens[0].token_versions == [3] * 12  # polled before the first token
    engine.weight_poll = None
    engine.update_weights(old, 4)  # the simple mode: between generate calls
    assert all(g.token_versions == [4] * 12 for g in engine.generate(requests, PARAMS))
