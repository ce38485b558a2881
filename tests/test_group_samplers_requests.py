"""Every group sampler that rebuilds its requests (a longer prompt, a part of a group, a branch of a tree)
keeps what else each request carries: its LoRA adapter (``GenerationRequest.adapter``) and its model inputs
(pictures, ``model_inputs``)."""

from __future__ import annotations

import pytest
import torch
from sampler_fixtures import random_policy

from reinforge.config import load_config
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams


class Recording(TorchRolloutEngine):
    """Records each request's adapter and model inputs, then samples its tokens with the plain model."""

    def generate(self, requests, params, generator=None, on_step=None):
        self.seen = [*getattr(self, "seen", []), *((r.adapter, r.model_inputs) for r in requests)]
        plain = [GenerationRequest(list(r.prompt_ids), r.request_id) for r in requests]
        return super().generate(plain, params, generator, on_step)


@pytest.mark.parametrize("spec", [
    "{name: micro_groups, micro_group: 2}", "{name: autothink_ellipsis, suffix: '='}", "{name: thinkfree, suffix: ' '}",
    "hbpo_budgets", "{name: tppo, window: 2}", "{name: treepo, segment_len: 2, branching: [2, 2]}",
    "{name: eptree, forks: 1, branches: 3, iterations: 1}",
])
def test_a_group_sampler_keeps_each_requests_adapter_and_model_inputs(spec):
    model, tok = random_policy(0)
    engine = Recording(model, tok, "cpu", seed=0)
    name = spec.split(",")[0].removeprefix("{name: ").strip()
    extra = ["algo.advantage=egae", "preset=ppo"] if name == "tppo" else []  # T-PPO's windows are bootstrapped
    cfg = load_config(None, [f"rollout.group_sampler={spec}", *extra])
    sampler = build_group_sampler(name, cfg.rollout.group_sampler.settings())
    inputs = [{"pixel_values": torch.full((1, 1), float(k))} for k in range(2)]
    requests = [GenerationRequest([6, 14], "a", inputs[0], adapter="math"), GenerationRequest([8], "b", inputs[1], adapter="code")]
    params = SamplingParams(max_new_tokens=6, n=4)
    out = sampler.sample(engine, requests, params)
    assert len(out) == 8 and engine.seen
    sampler.sample(engine, requests, params)  # a second step: T-PPO goes on with the windows it carried
    by_adapter = {"math": inputs[0], "code": inputs[1]}
    for adapter, model_inputs in engine.seen:
        assert adapter in by_adapter and model_inputs is by_adapter[adapter]
    assert {a for a, _ in engine.seen} == {"math", "code"}
