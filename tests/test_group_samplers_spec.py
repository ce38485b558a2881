"""SPEC-RL's speculative rollouts: acceptance against hand-computed values, the cache as checkpointed
state, and the distribution of its samples against exact sampling from the current policy."""

from __future__ import annotations

import json

import pytest
import torch

from reinforge.errors import ConfigError
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.spec_rl import SpecRLSettings
from reinforge.rollout.speculative import acceptance_probability, first_rejection, residual_distribution
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams
from tests.sampler_fixtures import chi_square_pvalue, exact_completion_probs, random_policy

ALPHA = 1e-3  # significance level of the distribution tests (fixed seeds: each outcome is deterministic)


def test_acceptance_probability_hand_values():
    p = torch.tensor([0.5, 0.1, 0.3])
    q = torch.tensor([0.25, 0.4, 0.3])
    assert acceptance_probability(p, q).tolist() == pytest.approx([1.0, 0.25, 1.0])
    assert acceptance_probability(p, q, lenience=2.0).tolist() == pytest.approx([1.0, 0.5, 1.0])


def test_first_rejection_stops_at_the_first_u_above_the_acceptance():
    p, q = torch.tensor([0.5, 0.1, 0.3]), torch.tensor([0.25, 0.4, 0.3])  # a = 1, 0.25, 1
    assert first_rejection(p, q, torch.tensor([0.99, 0.2, 0.5])) == 3  # 0.2 < 0.25: all kept
    assert first_rejection(p, q, torch.tensor([0.99, 0.3, 0.5])) == 1  # 0.3 >= 0.25
    assert first_rejection(p, q, torch.tensor([0.99, 0.3, 0.5]), lenience=2.0) == 3  # a_1 = 0.5
    batch = first_rejection(p.expand(3, 3), q.expand(3, 3), torch.tensor([[0.99, 0.3, 0.5], [0.99, 0.3, 0.5],
                                                                          [0.0, 0.0, 0.0]]), lengths=torch.tensor([3, 1, 2]))
    assert batch.tolist() == [1, 1, 2]  # the 2nd draft ends before its rejection; the 3rd keeps all


def test_residual_is_the_normalised_positive_part():
    p, q = torch.tensor([0.5, 0.2, 0.3]), torch.tensor([0.2, 0.5, 0.3])
    assert residual_distribution(p, q).tolist() == pytest.approx([1.0, 0.0, 0.0])
    p, q = torch.tensor([0.4, 0.4, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    assert residual_distribution(p, q).tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert residual_distribution(p, p).tolist() == pytest.approx(p.tolist())  # no mass: p itself


def test_one_step_speculative_sampling_is_exact_on_a_toy_distribution():
    """Accept x ~ q w.p. min(1, p/q), else draw from the residual: P(y) = q(y) a(y) + (1 - sum q a) r(y) = p(y)."""
    p, q = torch.tensor([0.5, 0.1, 0.3, 0.1]), torch.tensor([0.1, 0.6, 0.2, 0.1])
    a = acceptance_probability(p, q)
    law = q * a + (1 - (q * a).sum()) * residual_distribution(p, q)
    assert law.tolist() == pytest.approx(p.tolist())


def test_lenience_needs_the_lenient_variant():
    with pytest.raises(ValueError, match="lenience"):
        SpecRLSettings(variant="exact", lenience=1.5)
    with pytest.raises(ConfigError, match="lenience"):
        from reinforge.config import load_config

        load_config(None, ["rollout.group_sampler={name: spec_rl, lenience: 0.5}"])


PARAMS = SamplingParams(max_new_tokens=2, top_k=3, n=8)
PROMPT = [1, 5, 6]


def _engine_pair():
    draft_model, tok = random_policy(seed=1)
    current, _ = random_policy(seed=2)
    engine = TorchRolloutEngine(draft_model, tok, seed=0)
    return engine, draft_model, current


def _spec_samples(variant: str, lenience: float, rounds: int, prompts: int = 50):
    """Completions of the sampler under the ``current`` policy, each from a fresh draft of the draft policy."""
    engine, draft_model, current = _engine_pair()
    draft_state = {k: v.clone() for k, v in draft_model.state_dict().items()}
    current_state = dict(current.state_dict())
    sampler = build_group_sampler("spec_rl", SpecRLSettings(variant=variant, lenience=lenience))
    reqs = [GenerationRequest(PROMPT, f"p{k}") for k in range(prompts)]
    counts: dict[tuple[int, ...], int] = {}
    reused = 0.0
    for r in range(rounds):
        engine.update_weights(draft_state, 2 * r)
        sampler.sample(engine, reqs, PARAMS)  # drafts from the draft policy
        engine.update_weights(current_state, 2 * r + 1)
        for g in sampler.sample(engine, reqs, PARAMS):
            counts[tuple(g.token_ids)] = counts.get(tuple(g.token_ids), 0) + 1
        reused += sampler.counters()["tokens_reused"]
    return counts, current, engine, reused


def test_spec_rl_samples_exactly_from_the_current_policy():
    counts, current, engine, reused = _spec_samples("exact", 1.0, rounds=3)
    exact = exact_completion_probs(current, PROMPT, PARAMS, eos=2)
    assert reused > 0  # drafts were verified and partly kept
    assert chi_square_pvalue(counts, exact) > ALPHA


def test_the_distribution_test_detects_the_papers_lenient_rule():
    """The same test rejects the paper's rule even at l = 1 (position t* resampled from pi instead of the
    residual): the test has power against a wrong acceptance (also checked once by inverting the ratio
    to min(1, q/p): p-value 0)."""
    counts, current, _, _ = _spec_samples("lenient", 1.0, rounds=3)
    assert chi_square_pvalue(counts, exact_completion_probs(current, PROMPT, PARAMS, eos=2)) < ALPHA


def test_returned_logprobs_are_the_current_policys():
    engine, draft_model, current = _engine_pair()
    sampler = build_group_sampler("spec_rl")
    reqs = [GenerationRequest(PROMPT, f"p{k}") for k in range(4)]
    sampler.sample(engine, reqs, PARAMS)
    engine.update_weights(current, 1)
    gens = sampler.sample(engine, reqs, PARAMS)
    assert sampler.counters()["tokens_reused"] > 0
    # per sample (what the step's rollout/tokens_reused sums): its accepted draft tokens
    assert sum(g.extra.get("tokens_reused", 0) for g in gens) == sampler.counters()["tokens_reused"]
    with torch.no_grad():
        for g in gens:
            logits = current(input_ids=torch.tensor([PROMPT + g.token_ids])).logits[0].float()
            logp = torch.log_softmax(logits[len(PROMPT) - 1 : -1], -1)
            want = logp[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)]
            assert g.logprobs == pytest.approx(want.tolist(), abs=1e-5)
            assert g.version == 1


def test_cache_state_round_trips_through_json_and_resumes_identically():
    engine, _, current = _engine_pair()
    reqs = [GenerationRequest(PROMPT, f"p{k}") for k in range(3)]
    a = build_group_sampler("spec_rl")
    a.sample(engine, reqs, PARAMS)
    engine.update_weights(current, 1)
    state = json.loads(json.dumps(a.state_dict()))
    rng = engine.generator.get_state()
    first = [g.token_ids for g in a.sample(engine, reqs, PARAMS)]
    b = build_group_sampler("spec_rl")
    b.load_state_dict(state)
    engine.generator.set_state(rng)
    assert [g.token_ids for g in b.sample(engine, reqs, PARAMS)] == first
    assert len(state["cache"]) == 3 and len(state["cache"]["p0"]["samples"]) == PARAMS.n


def test_cache_keeps_the_newest_prompts_only():
    engine, _, _ = _engine_pair()
    sampler = build_group_sampler("spec_rl", SpecRLSettings(max_cached_prompts=2))
    for k in range(3):
        sampler.sample(engine, [GenerationRequest(PROMPT, f"p{k}")], PARAMS)
    assert list(sampler.state_dict()["cache"]) == ["p1", "p2"]
