"""TreePO's tree sampling (bookkeeping on a scripted engine, the distribution of its leaves against
exact sampling) and its tree-based advantage against hand-computed values."""

from __future__ import annotations

import random

import pytest
import torch

from reinforge.algo.advantage_estimators import ADVANTAGES, GroupNormSettings
from reinforge.algo.context import Context
from reinforge.errors import ConfigError
from reinforge.orchestrate.batch_fields import SUBGROUPS_PER_GROUP, subgroup_tensor
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.tree_sampler import TreeSettings, branch_plan, split_leaves
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.types import Trajectory
from tests.sampler_fixtures import chi_square_pvalue, exact_completion_probs, random_policy

EOS = 2


class ScriptedEngine:
    """Child c of a node writes token 10 + c for the whole segment; a child whose prefix would reach
    ``eos_at`` tokens (for child 1 only) ends with EOS there. Records every call."""

    version = 3

    def __init__(self, tokenizer, prompt_len: int, eos_at: int | None = None) -> None:
        self.tokenizer, self.prompt_len, self.eos_at, self.calls = tokenizer, prompt_len, eos_at, []

    def generate(self, requests, params):
        self.calls.append((len(requests), params.n, params.max_new_tokens))
        out = []
        for r in requests:
            done = len(r.prompt_ids) - self.prompt_len
            for c in range(params.n):
                toks = [10 + c] * params.max_new_tokens
                finish = "length"
                if self.eos_at is not None and c == 1 and done < self.eos_at <= done + params.max_new_tokens:
                    toks = toks[: self.eos_at - done - 1] + [EOS]
                    finish = "stop"
                out.append(Generation(r.request_id, r.prompt_ids, toks, [-0.5] * len(toks), finish, self.version,
                                      sample_index=c))
        return out


def _tree(engine, n=4, max_new=4, **settings):
    sampler = build_group_sampler("treepo", TreeSettings(**settings))
    gens = sampler.sample(engine, [GenerationRequest([1, 5, 6], "x")], SamplingParams(max_new_tokens=max_new, n=n))
    return gens, sampler.counters()


def test_prefixes_are_decoded_once_and_shared(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, prompt_len=3)
    gens, counters = _tree(engine, segment_len=2, branching=[2, 2])
    assert [g.token_ids for g in gens] == [[10, 10, 10, 10], [10, 10, 11, 11], [11, 11, 10, 10], [11, 11, 11, 11]]
    assert engine.calls == [(1, 2, 2), (2, 2, 2)]  # the root's 2 children, then 2 nodes x 2 children, 2 tokens each
    assert counters["tokens_generated"] == 2 * 2 + 4 * 2 and counters["tokens_reused"] == 16 - 12
    # per sample (what the step's rollout/tokens_reused sums): the prefix shared with the completion before it
    assert [g.extra["tokens_reused"] for g in gens] == [0, 2, 0, 2]
    assert [g.extra["subgroups"] for g in gens] == [["0"], ["0"], ["1"], ["1"]]
    assert [g.sample_index for g in gens] == [0, 1, 2, 3] and all(g.version == 3 for g in gens)
    assert all(len(g.logprobs) == len(g.token_ids) for g in gens)


def test_a_branch_that_ends_keeps_its_leaves_as_copies(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, prompt_len=3, eos_at=2)  # child 1 of the root ends at its 2nd token
    gens, counters = _tree(engine, segment_len=2, branching=[2, 2])
    assert [g.token_ids for g in gens] == [[10, 10, 10, 10], [10, 10, 11, 11], [11, EOS], [11, EOS]]
    assert [g.finish_reason for g in gens] == ["length", "length", "stop", "stop"]
    assert engine.calls == [(1, 2, 2), (1, 2, 2)]  # only the unfinished node grows
    assert counters["tokens_generated"] == 4 + 4 and counters["tree/branches"] == 3
    assert [g.extra["tokens_reused"] for g in gens] == [0, 2, 0, 2]  # the ended branch's second leaf is a copy
    assert sum(g.extra["tokens_reused"] for g in gens) == counters["tokens_reused"]


def test_fallback_gives_the_leaves_of_an_ended_branch_to_its_peers(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, prompt_len=3, eos_at=2)
    gens, _ = _tree(engine, segment_len=2, branching=[2, 2], fallback=True)
    assert [g.token_ids for g in gens] == [[10, 10, 10, 10], [10, 10, 10, 10], [10, 10, 11, 11], [11, EOS]]


def test_repeating_segment_ends_the_branch(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, prompt_len=3)
    gens, _ = _tree(engine, n=2, max_new=8, segment_len=2, branching=[1, 2], stop_on_repeat=True)
    # child 0 repeats its parent's segment at once; child 1 writes 11 11, then 10 10 twice
    assert [g.token_ids for g in gens] == [[10, 10, 10, 10], [10, 10, 11, 11, 10, 10, 10, 10]]
    assert all(g.finish_reason == "length" for g in gens)


def test_branch_plan_and_leaf_shares():
    assert branch_plan(8, []) == [2, 2, 2] and branch_plan(12, []) == [2, 2, 3] and branch_plan(6, [3, 2]) == [3, 2]
    with pytest.raises(ConfigError, match="branching"):
        branch_plan(8, [3, 3])
    assert split_leaves(5, 2) == [3, 2] and split_leaves(4, 4) == [1, 1, 1, 1]


def test_tree_leaves_are_distributed_as_independent_samples():
    """One leaf per tree (picked at random): its completion's law is the policy's (chi-square, 3 tokens)."""
    model, tok = random_policy(seed=3)
    engine = TorchRolloutEngine(model, tok, seed=0)
    params = SamplingParams(max_new_tokens=3, top_k=3, n=4)
    sampler = build_group_sampler("treepo", TreeSettings(segment_len=1, branching=[2, 2]))
    pick, counts = random.Random(0), {}
    reqs = [GenerationRequest([1, 5, 6], f"p{k}") for k in range(200)]
    for _ in range(3):
        gens = sampler.sample(engine, reqs, params)
        for k in range(len(reqs)):
            leaf = gens[k * params.n + pick.randrange(params.n)]
            counts[tuple(leaf.token_ids)] = counts.get(tuple(leaf.token_ids), 0) + 1
    assert sampler.counters()["tokens_reused"] > 0
    assert chi_square_pvalue(counts, exact_completion_probs(model, [1, 5, 6], params, eos=EOS)) > 1e-3


def _treepo(rewards, groups, subgroups, scale=True):
    ctx = Context(mask=torch.ones(len(rewards), 2), rewards=torch.tensor(rewards), group_index=torch.tensor(groups),
                  subgroups=None if subgroups is None else torch.tensor(subgroups))
    return ADVANTAGES.call("treepo", ctx, GroupNormSettings(scale_by_std=scale, adv_eps=1e-12))[:, 0]


def test_treepo_advantage_hand_values():
    # leaves 0,1 under node a, leaves 2,3 under node b; rewards 1,0,1,1
    adv = _treepo([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0], [[0], [0], [1], [1]], scale=False)
    # group mean 0.75; node a mean 0.5; node b mean 1
    assert adv.tolist() == pytest.approx([(0.25 + 0.5) / 2, (-0.75 - 0.5) / 2, (0.25 + 0) / 2, (0.25 + 0) / 2])
    std_g, std_a = torch.tensor([1.0, 0.0, 1.0, 1.0]).std().item(), torch.tensor([1.0, 0.0]).std().item()
    adv = _treepo([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0], [[0], [0], [1], [1]])
    assert adv[0].item() == pytest.approx((0.25 / std_g + 0.5 / std_a) / 2)
    assert adv[2].item() == pytest.approx((0.25 / std_g + 0.0) / 2)


def test_treepo_without_subtrees_is_grpo_and_singletons_do_not_count():
    rewards, groups = [1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1]
    grpo = ADVANTAGES.call("grpo", Context(mask=torch.ones(4, 2), rewards=torch.tensor(rewards),
                                           group_index=torch.tensor(groups)), GroupNormSettings(adv_eps=1e-12))[:, 0]
    assert _treepo(rewards, groups, None).tolist() == pytest.approx(grpo.tolist())
    assert _treepo(rewards, groups, [[0], [1], [2], [3]]).tolist() == pytest.approx(grpo.tolist())


def test_subgroup_ids_are_unique_per_group():
    def traj(group, subgroups):
        return Trajectory([1, 2], [0, 1], [0.0, 0.0], 0, group, "t", metadata={"subgroups": subgroups})

    out = subgroup_tensor([traj(0, ["0"]), traj(0, ["1", "1.0"]), traj(1, ["0"]), traj(1, [])])
    base = SUBGROUPS_PER_GROUP
    assert out.tolist() == [[0, -1], [1, 2], [base, -1], [-1, -1]]
