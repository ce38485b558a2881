"""TreeRL: EPTree's entropy-guided forking (bookkeeping on a scripted engine, the law of its leaves) and
the tree's process supervision against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.context import Context
from reinforge.algo.treerl import TreeRLSettings
from reinforge.errors import ConfigError
from reinforge.orchestrate.batch_fields import SUBGROUPS_PER_GROUP, tree_node_tensor
from reinforge.rollout.eptree import EPTreeSettings, trees_per_prompt
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.types import Trajectory
from tests.sampler_fixtures import chi_square_pvalue, exact_completion_probs, random_policy

CHAIN_LOGPS = [-0.1, -2.0, -0.5, -1.0]  # a chain's token k: entropy -log p highest at k = 1, then k = 3


class ScriptedEngine:
    """From the prompt, sample c writes 10 + c, 11 + c, ... with CHAIN_LOGPS; a continuation (a longer
    prompt) writes 30 + c, 31 + c, ... with log-probs -3 (its first token), then -0.3."""

    version = 2

    def __init__(self, tokenizer, prompt_len: int) -> None:
        self.tokenizer, self.prompt_len, self.calls = tokenizer, prompt_len, []

    def generate(self, requests, params):
        self.calls.append((len(requests), params.n, params.max_new_tokens))
        out = []
        for r in requests:
            fresh = len(r.prompt_ids) == self.prompt_len
            for c in range(params.n):
                base = 10 if fresh else 30
                toks = [base + c + k for k in range(params.max_new_tokens)]
                logps = CHAIN_LOGPS[: len(toks)] if fresh else [-3.0] + [-0.3] * (len(toks) - 1)
                out.append(Generation(r.request_id, r.prompt_ids, toks, logps[: len(toks)], "length", self.version,
                                      sample_index=c))
        return out


def _sample(engine, n, **settings):
    sampler = build_group_sampler("eptree", EPTreeSettings(**settings))
    gens = sampler.sample(engine, [GenerationRequest([1, 5, 6], "x")], SamplingParams(max_new_tokens=4, n=n))
    return gens, sampler.counters()


def test_forks_at_the_highest_entropy_token_of_each_tree(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, prompt_len=3)
    gens, counters = _sample(engine, n=4)  # M = 4 / (1 + 1*1*1) = 2 trees
    # each chain forks at its token 1 (-log p = 2); the branch re-samples from there (room 4 - 1 = 3)
    assert [g.token_ids for g in gens] == [[10, 11, 12, 13], [10, 30, 31, 32], [11, 12, 13, 14], [11, 30, 31, 32]]
    assert engine.calls == [(1, 2, 4), (2, 1, 3)]
    assert [g.logprobs for g in gens][1] == [-0.1, -3.0, -0.3, -0.3]
    assert [g.extra["tree_spans"] for g in gens][:2] == [[[0, "0@0"], [1, "0@1"]], [[0, "0@0"], [1, "0.1@0"]]]
    assert [g.extra["subgroups"] for g in gens] == [["0@0"], ["0@0"], ["1@0"], ["1@0"]]
    assert [g.extra["tokens_reused"] for g in gens] == [0, 1, 0, 1]
    assert counters["tokens_generated"] == 8 + 6 and counters["tokens_reused"] == 2
    assert counters["eptree/tokens_past_room"] == 0 and counters["eptree/nodes"] == 6
    assert [g.sample_index for g in gens] == [0, 1, 2, 3] and all(g.version == 2 for g in gens)


def test_nodes_are_counted_per_prompt(tiny_tokenizer):
    sampler = build_group_sampler("eptree", EPTreeSettings())
    reqs = [GenerationRequest([1, 5, 6], "x"), GenerationRequest([1, 5, 7], "y")]
    sampler.sample(ScriptedEngine(tiny_tokenizer, prompt_len=3), reqs, SamplingParams(max_new_tokens=4, n=4))
    assert sampler.counters()["eptree/nodes"] == 2 * 6  # the same names in both prompts' trees


def test_a_second_round_skips_forked_and_first_tokens(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, prompt_len=3)
    gens, _ = _sample(engine, n=3, iterations=2)  # M = 3 / (1 + 2) = 1 tree
    # round 2: the chain's token 1 is forked and the branch's token 0 is its first: the chain's token 3
    # (-log p = 1) beats the branch's tokens 1, 2 (0.3); room 4 - 3 = 1
    assert [g.token_ids for g in gens] == [[10, 11, 12, 13], [10, 30, 31, 32], [10, 11, 12, 30]]
    assert engine.calls == [(1, 1, 4), (1, 1, 3), (1, 1, 1)]
    assert [g.extra["tree_spans"] for g in gens] == [
        [[0, "0@0"], [1, "0@1"], [3, "0@3"]], [[0, "0@0"], [1, "0.1@0"]], [[0, "0@0"], [1, "0@1"], [3, "0.2@0"]]]


def test_group_size_must_fit_the_trees():
    assert trees_per_prompt(30, EPTreeSettings(forks=2, branches=2, iterations=1)) == 6  # the paper's M=6, N=2, T=2
    with pytest.raises(ConfigError, match="multiple"):
        trees_per_prompt(8, EPTreeSettings(forks=2, branches=1))


def test_each_tree_starts_from_a_sample_of_the_policy():
    """The chain a tree grows from (leaf 0) follows the policy's law exactly (chi-square over 3-token
    completions); the branches reuse its prefix."""
    model, tok = random_policy(seed=5)
    engine = TorchRolloutEngine(model, tok, seed=0)
    params = SamplingParams(max_new_tokens=3, top_k=3, n=2)
    sampler = build_group_sampler("eptree", EPTreeSettings())
    counts: dict = {}
    reqs = [GenerationRequest([1, 5, 6], f"p{k}") for k in range(300)]
    for _ in range(2):
        gens = sampler.sample(engine, reqs, params)
        for k in range(len(reqs)):
            chain = gens[k * params.n]
            counts[tuple(chain.token_ids)] = counts.get(tuple(chain.token_ids), 0) + 1
    assert sampler.counters()["tokens_reused"] > 0
    assert chi_square_pvalue(counts, exact_completion_probs(model, [1, 5, 6], params, eos=2)) > 1e-3


def _treerl(rewards, nodes, groups=None, sqrt=True, mask=None):
    nodes = torch.tensor(nodes)
    ctx = Context(mask=torch.ones(nodes.shape) if mask is None else torch.tensor(mask, dtype=torch.float32),
                  rewards=torch.tensor(rewards), group_index=torch.tensor(groups or [0] * len(rewards)),
                  extra={"tree_nodes": nodes})
    return ADVANTAGES.call("treerl", ctx, TreeRLSettings(sqrt_leaves=sqrt))


def test_treerl_advantage_hand_values():
    # Two trees of one prompt, 4 positions each. Tree A: chain a forks at token 2 into a'; nodes
    # 1 = a[0:2] (leaves a, a'), 2 = a[2:4] (leaf a), 3 = a'[2:4] (leaf a'). Tree B: chain b forked at
    # token 0 into b' (a fresh sample): nodes 4 = b, 5 = b', each a child of the root.
    nodes = [[1, 1, 2, 2], [1, 1, 3, 3], [4, 4, 4, 4], [5, 5, 5, 5]]
    adv = _treerl([1.0, 0.0, 1.0, 1.0], nodes)
    # V(root) = 0.75. Node 1: V = 0.5, parent the root: (0.5 - 0.75 + 0.5 - 0.75) / sqrt 2 = -0.5 / sqrt 2
    # node 2: V = 1, parent node 1: (1 - 0.75) + (1 - 0.5) = 0.75; node 3: V = 0: -0.75 - 0.5 = -1.25
    # nodes 4, 5: V = 1, parent the root: 0.25 + 0.25 = 0.5
    a1 = -0.5 / math.sqrt(2)
    want = [[a1, a1, 0.75, 0.75], [a1, a1, -1.25, -1.25], [0.5] * 4, [0.5] * 4]
    assert torch.allclose(adv, torch.tensor(want), atol=1e-6)
    plain = _treerl([1.0, 0.0, 1.0, 1.0], nodes, sqrt=False)
    assert plain[0, 0].item() == pytest.approx(-0.5) and plain[0, 2].item() == pytest.approx(0.75)


def test_treerl_without_a_tree_is_twice_the_centred_reward_and_zero_off_the_mask():
    # no node ids: each row its own node under the root, A = 2 (r - mean_g r); two groups
    adv = _treerl([1.0, 0.0, 0.0, 0.0], [[0, 0]] * 4, groups=[0, 0, 1, 1], mask=[[1, 0], [1, 1], [1, 1], [0, 0]])
    assert torch.allclose(adv, torch.tensor([[1.0, 0.0], [-1.0, -1.0], [0.0, 0.0], [0.0, 0.0]]))


def test_tree_node_tensor_from_spans():
    spans = [[[0, "0@0"], [1, "0@1"]], [[0, "0@0"], [1, "0.1@0"]]]
    trajs = [Trajectory([1, 5, 6, 10, 11, 12], [0, 0, 0, 1, 1, 1], [0.0] * 6, 0, 3, "t", metadata={"tree_spans": s})
             for s in spans] + [Trajectory([1, 5, 6, 7], [0, 0, 0, 1], [0.0] * 4, 0, 4, "u")]
    out = tree_node_tensor(trajs, 7)
    g = 3 * SUBGROUPS_PER_GROUP
    # the prompt (3 tokens) untouched; node "0@0" on the first generated token, then each row's own node
    assert out.tolist() == [[0, 0, 0, g + 1, g + 2, g + 2, 0], [0, 0, 0, g + 1, g + 3, g + 3, 0], [0] * 7]
