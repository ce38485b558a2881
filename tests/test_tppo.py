"""T-PPO (arXiv:2506.15050): EGAE against hand-computed values, the critic's mask, the truncated rollouts'
carry-over and version tags, their distribution against plain sampling, their state round trip, the
successive batches of the batch source, and the config's refusals."""

from __future__ import annotations

import json

import pytest
import torch

from reinforge.algo.advantage_estimators import ADVANTAGES, GAESettings, egae_advantage
from reinforge.errors import ConfigError
from reinforge.learn.critic import value_mask
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.tppo import TPPOSettings
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.types import Batch, Trajectory
from tests.sampler_fixtures import chi_square_pvalue, exact_completion_probs, random_policy

PROMPT = [1, 5, 6]
V = [[0.5, 0.4, 0.2], [0.5, 0.4, 0.2]]


def _egae(gamma: float, lam: float, continues):
    cfg = GAESettings(gamma=gamma, lam=lam, scale_by_std=False)
    return egae_advantage(torch.tensor([1.0, 1.0]), torch.ones(2, 3), torch.tensor(V), cfg,
                                  continues=continues)


def test_egae_hand_values():
    # row 0 ends (reward 1 on its last token); row 1 continues: no reward, V(s_l) = V(s_{l-1}) = 0.2
    # gamma 1, lam 0.5: row 0: delta = (-0.1, -0.2, 0.8), A = (0, 0.2, 0.8); row 1: delta = (-0.1, -0.2, 0),
    # A = (-0.2, -0.2, 0)
    adv = _egae(1.0, 0.5, torch.tensor([False, True]))
    assert adv.flatten().tolist() == pytest.approx([0.0, 0.2, 0.8, -0.2, -0.2, 0.0], abs=1e-6)
    # gamma 0.9, lam 1, row 1: delta = (0.9*0.4-0.5, 0.9*0.2-0.4, 0.9*0.2-0.2) = (-0.14, -0.22, -0.02)
    adv = _egae(0.9, 1.0, torch.tensor([False, True]))
    assert adv[1].tolist() == pytest.approx([-0.3542, -0.238, -0.02], abs=1e-6)


def test_egae_without_continuing_rows_is_gae():
    cfg = GAESettings(gamma=1.0, lam=0.5, scale_by_std=False)
    gae = ADVANTAGES.get("gae")(torch.tensor([1.0, 0.0]), torch.ones(2, 3), torch.tensor(V), cfg)
    egae = egae_advantage(torch.tensor([1.0, 0.0]), torch.ones(2, 3), torch.tensor(V), cfg)
    assert torch.equal(gae, egae)


def test_the_critic_takes_no_target_from_a_continuing_row():
    trajs = [Trajectory([1, 2, 3], [0, 1, 1], [0.0] * 3, 0, 0, "a"),
             Trajectory([1, 2, 3], [0, 1, 1], [0.0] * 3, 0, 1, "b", continues=True)]
    batch = Batch.from_trajectories(trajs, pad_id=0)
    assert batch.continues.tolist() == [False, True]
    assert value_mask(batch).tolist() == [[0, 1, 1], [0, 0, 0]]
    assert Batch.from_trajectories(trajs[:1], pad_id=0).continues is None


def _engine():
    model, tok = random_policy(seed=1)
    return TorchRolloutEngine(model, tok, seed=0), model


def test_windows_carry_over_with_their_versions():
    engine, model = _engine()
    sampler = build_group_sampler("tppo", TPPOSettings(window=2))
    params = SamplingParams(max_new_tokens=5, n=2, ignore_eos=True)
    req = [GenerationRequest(PROMPT, "p0")]
    first = sampler.sample(engine, req, params)
    assert [len(g.token_ids) for g in first] == [2, 2] and all(g.extra["continues"] for g in first)
    assert sampler.held() == {"p0": 2}
    engine.update_weights(model, 1)
    second = sampler.sample(engine, req, params)
    for a, b in zip(first, second, strict=True):  # the earlier window is context, not trained again
        assert b.prompt_ids == PROMPT + a.token_ids and b.token_versions == [1, 1] and b.extra["continues"]
    engine.update_weights(model, 2)
    third = sampler.sample(engine, req, params)  # 1 token left of the 5
    assert [len(g.token_ids) for g in third] == [1, 1]
    assert all(not g.extra["continues"] and g.finish_reason == "length" for g in third)
    assert sampler.held() == {} and third[0].token_versions == [2]
    whole = first[0].token_ids + second[0].token_ids + third[0].token_ids
    assert third[0].text == engine.tokenizer.decode(whole, skip_special_tokens=True)
    assert sampler.counters()["tppo/resumed"] == 2 and sampler.counters()["tppo/ended"] == 2


def test_the_carried_state_records_every_tokens_version():
    engine, model = _engine()
    sampler = build_group_sampler("tppo", TPPOSettings(window=2))
    params = SamplingParams(max_new_tokens=6, n=1, ignore_eos=True)
    req = [GenerationRequest(PROMPT, "p0")]
    sampler.sample(engine, req, params)
    engine.update_weights(model, 3)
    sampler.sample(engine, req, params)
    carried = sampler.state_dict()["carried"]["p0"]["samples"][0]
    assert carried["versions"] == [0, 0, 3, 3] and carried["windows"] == 2 and len(carried["tokens"]) == 4


def test_truncated_rollouts_sample_as_plain_sampling():
    """With fixed weights a completion decoded one window a step has the law of one decoded at once."""
    engine, model = _engine()
    params = SamplingParams(max_new_tokens=3, top_k=3, n=8)
    sampler = build_group_sampler("tppo", TPPOSettings(window=1))
    counts: dict[tuple[int, ...], int] = {}
    reqs = [GenerationRequest(PROMPT, f"p{k}") for k in range(60)]
    while reqs:
        held = sampler.held()
        by_n: dict[int, list[GenerationRequest]] = {}
        for r in reqs:
            by_n.setdefault(held.get(r.request_id, params.n), []).append(r)
        for n, group in by_n.items():
            for g in sampler.sample(engine, group, SamplingParams(max_new_tokens=3, top_k=3, n=n)):
                if not g.extra["continues"]:
                    done = tuple(g.prompt_ids[len(PROMPT):] + g.token_ids)
                    counts[done] = counts.get(done, 0) + 1
        reqs = [GenerationRequest(PROMPT, rid) for rid in sampler.held()]
    assert sum(counts.values()) == 60 * 8
    assert chi_square_pvalue(counts, exact_completion_probs(model, PROMPT, params, eos=2)) > 1e-3


def test_carried_state_round_trips_through_json_and_resumes_identically():
    engine, _ = _engine()
    params = SamplingParams(max_new_tokens=6, n=2, ignore_eos=True)
    reqs = [GenerationRequest(PROMPT, "p0"), GenerationRequest([1, 7], "p1")]
    a = build_group_sampler("tppo", TPPOSettings(window=2))
    a.sample(engine, reqs, params)
    state = json.loads(json.dumps(a.state_dict()))
    rng = engine.generator.get_state()
    first = [(g.prompt_ids, g.token_ids, g.logprobs) for g in a.sample(engine, reqs, params)]
    b = build_group_sampler("tppo", TPPOSettings(window=2))
    b.load_state_dict(state)
    engine.generator.set_state(rng)
    assert [(g.prompt_ids, g.token_ids, g.logprobs) for g in b.sample(engine, reqs, params)] == first
    assert b.state_dict() == a.state_dict()


class _Sampler:
    def __init__(self, tasks):
        self.tasks, self.asked = tasks, []

    def next_batch(self, n):
        self.asked.append(n)
        return self.tasks[:n]


def test_the_batch_source_puts_held_generations_first(tmp_path):
    """Successive batching: held tasks first with their counts, the rest from the task sampler; the
    collector's held tasks survive its state round trip."""
    from reinforge.config import load_config
    from reinforge.orchestrate.batch_sources import LocalBatches
    from reinforge.orchestrate.collectors import SingleTurn
    from reinforge.rollout.types import SamplingParams as SP
    from reinforge.types import Task

    cfg = load_config(None, ["rollout.group_sampler={name: tppo, window: 2}", "algo.advantage=egae",
                             "algo.skip_equal_reward_groups=false", "rollout.prompts_per_step=2",
                             "rollout.group_size=2", "rollout.max_new_tokens=6"])
    engine, _ = _engine()
    tasks = [Task("t0", "1+1=", "2"), Task("t1", "2+2=", "4")]

    class Pool:
        steps = None  # no step verifier

        def score(self, ts, texts):
            from reinforge.rewards.pool import VerifierOutcome
            return [VerifierOutcome(1.0, "ok") for _ in ts]

        def observe(self, ts, texts):  # a VerifierPool's: nothing learns from the batch here
            return {}

    from reinforge.envs.single_turn import SingleTurnEnv
    collector = SingleTurn(engine, lambda: SingleTurnEnv(None), Pool(), cfg.rollout.group_sampler)
    params = SP(max_new_tokens=6, n=2, ignore_eos=True)
    sampler = _Sampler(tasks)
    source = LocalBatches(cfg.algo, cfg.rollout, 0, sampler, collector, params, engine.generator)
    out = source.collect(0)
    assert sampler.asked == [2] and all(t.continues and t.reward == 0.0 for t in out.sampled)
    state = json.loads(json.dumps(collector.state_dict()))
    assert [d["id"] for d in state["held_tasks"]] == ["t0", "t1"]
    fresh = SingleTurn(engine, lambda: SingleTurnEnv(None), Pool(), cfg.rollout.group_sampler)
    fresh.load_state_dict(state)
    assert [(t.id, n) for t, n in fresh.held()] == [("t0", 2), ("t1", 2)]
    source.collect(1)
    assert sampler.asked == [2, 0]  # both prompts still in flight: no new task drawn
    last = source.collect(2)
    assert sampler.asked == [2, 0, 0] and not any(t.continues for t in last.sampled)
    assert all(t.reward == 1.0 and len(t.token_ids) == len(t.token_ids) for t in last.sampled)
    source.collect(3)
    assert sampler.asked == [2, 0, 0, 2]


@pytest.mark.parametrize("override, field", [
    ("algo.advantage=gae", "algo.advantage"),
    ("orchestrate.mode=async", "orchestrate.mode"),
    ("rollout.replay={name: recent}", "rollout.replay"),
    ("algo.dynamic_sampling=true", "dynamic_sampling"),
])
def test_the_config_refuses_what_carried_generations_do_not_support(override, field):
    from reinforge.config import load_config

    base = ["rollout.group_sampler={name: tppo}", "algo.advantage=egae", "algo.skip_equal_reward_groups=false"]
    with pytest.raises(ConfigError, match=field):
        load_config(None, [*base, override])
    load_config(None, base)  # the supported combination
