"""TreePO's segment-wise tree sampling (Li et al. 2025, arXiv:2508.17445).

A prompt's group of G completions is grown as a tree of segments: the prompt branches into b_0
children, each decodes one segment of ``segment_len`` tokens; every unfinished child then branches
into b_1 children that decode the next segment, and so on (``branching`` = [b_0, b_1, ...]); after the
last branching, each branch decodes the rest of its completion in one go (in segments with
``stop_on_repeat``). A shared prefix is decoded
once (each engine call prefills it once and copies it into its children's slots), so G leaves cost
fewer decoded tokens than G independent samples.

A branch ends when its segment ends (EOS, a stop string, the token limit): its leaves all hold that
completion (copies: each leaf is still a sample of pi, so the group's completions are distributed
exactly as independent ones, only correlated through their shared prefixes). TreePO's *fallback*
(``fallback: true``) instead gives the leaves of a branch that ended early to the unfinished branches
of the same depth (more distinct completions per budget, but the leaves then over-represent long
completions). ``stop_on_repeat`` is TreePO's early stop of a hopeless branch, in this reading: a
branch whose new segment repeats its previous one token for token is ended there (``length``, a
truncated response), which also changes the distribution.

Each completion's ``extra['subgroups']`` lists the branch points above it (nodes with at least two
children): the tree-structured subgroups of TreePO's segment-level advantage (``treepo`` in
algo/advantage_estimators.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from reinforge.errors import ConfigError
from reinforge.registry import Settings
from reinforge.rollout.continuation import cut_at_stop
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams


class TreeSettings(Settings):
    segment_len: int = Field(4, ge=1, description="tokens per segment (between two branchings)")
    branching: list[int] = Field(default_factory=list, description="children per node at each depth; the "
                                 "product must be the group size ([] = the group size's prime factors, smallest first)")
    fallback: bool = Field(False, description="give the leaves of a branch that ended early to its unfinished "
                           "peers (TreePO's fallback; biases the leaves towards long completions)")
    stop_on_repeat: bool = Field(False, description="end a branch whose new segment repeats its previous one")


@dataclass
class Node:
    request: int
    node_id: str
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    leaves: int = 0
    finish: str | None = None
    last_segment: list[int] = field(default_factory=list)
    branch_points: list[str] = field(default_factory=list)  # ancestors with >= 2 children


def branch_plan(group_size: int, branching: Sequence[int]) -> list[int]:
    """The children per node at each depth (``branching``, or the group size's prime factors)."""
    plan = list(branching) if branching else _prime_factors(group_size)
    product = 1
    for b in plan:
        product *= b
    if any(b < 1 for b in plan) or product != group_size:
        raise ConfigError(f"rollout.group_sampler.branching: {list(branching)} must multiply to "
                          f"rollout.group_size={group_size}")
    return plan


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    return len(os.path.commonprefix([list(a), list(b)]))


def _prime_factors(n: int) -> list[int]:
    out, f = [], 2
    while n > 1:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return out or [1]


def split_leaves(leaves: int, children: int) -> list[int]:
    """``leaves`` shared as evenly as possible among ``children`` (the first ones get the remainder)."""
    return [leaves // children + (1 if j < leaves % children else 0) for j in range(children)]


@GROUP_SAMPLERS.register(
    "treepo",
    formula="tree of segments: node -> b_d children, each decodes segment_len tokens from the shared prefix; "
            "G leaves = completions; branch points recorded as subgroups",
    paper="Li et al. 2025, TreePO (arXiv:2508.17445)",
    settings=TreeSettings,
)
class TreeSampler:
    """TreePO's tree sampling (module docstring)."""

    def __init__(self, cfg: TreeSettings | None = None) -> None:
        self.cfg = cfg or TreeSettings()
        self._counters: dict[str, float] = {}

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        plan = branch_plan(params.n, self.cfg.branching)
        frontier = [Node(k, "", leaves=params.n) for k in range(len(requests))]
        done: list[Node] = []
        decoded, depth = 0, 0
        while frontier:
            b = plan[depth] if depth < len(plan) else 1
            last = depth >= len(plan) - 1 and not self.cfg.stop_on_repeat  # the rest in one go, unless checked
            children, n_decoded = self._grow(engine, requests, frontier, b, last, params)
            decoded += n_decoded
            done += [c for c in children if c.finish is not None]
            frontier = [c for c in children if c.finish is None]
            if self.cfg.fallback:
                self._fall_back(children, frontier)
            depth += 1
        out = self._leaves(engine, requests, done, params)
        total = sum(len(g.token_ids) for g in out)
        self._counters = {"tokens_generated": float(decoded), "tokens_reused": float(max(total - decoded, 0)),
                          "tree/branches": float(len(done))}
        return out

    def _grow(self, engine: Any, requests: Sequence[GenerationRequest], frontier: list[Node], b: int, last: bool,
              params: SamplingParams) -> tuple[list[Node], int]:
        """Every frontier node's children (one engine call per child count): each decodes one segment
        (or, at the last branching, the rest of its completion)."""
        children: list[Node] = []
        decoded = 0
        by_count: dict[int, list[Node]] = {}
        for node in frontier:
            by_count.setdefault(min(b, node.leaves), []).append(node)
        for count, nodes in by_count.items():
            room = [params.max_new_tokens - len(nd.tokens) for nd in nodes]
            budget = max(room) if last else min(self.cfg.segment_len, max(room))
            reqs = [dataclasses.replace(requests[nd.request], prompt_ids=list(requests[nd.request].prompt_ids) + nd.tokens)
                    for nd in nodes]
            gens = engine.generate(reqs, dataclasses.replace(params, n=count, max_new_tokens=budget))
            for j, nd in enumerate(nodes):
                shares = split_leaves(nd.leaves, count)
                points = nd.branch_points + ([nd.node_id] if count > 1 and nd.node_id else [])  # the root: the whole group
                for c in range(count):
                    g = gens[j * count + c]
                    seg = g.token_ids[: room[j]]
                    decoded += len(g.token_ids)
                    children.append(self._child(nd, c, seg, g.logprobs[: len(seg)], shares[c], points,
                                                g.finish_reason == "stop" and len(seg) == len(g.token_ids), params))
        return children, decoded

    def _child(self, parent: Node, c: int, seg: list[int], logps: list[float], leaves: int, points: list[str],
               stopped: bool, params: SamplingParams) -> Node:
        node = Node(parent.request, f"{parent.node_id}.{c}" if parent.node_id else str(c), parent.tokens + seg,
                    parent.logps + logps, leaves, last_segment=seg, branch_points=points)
        if stopped:
            node.finish = "stop"
        elif len(node.tokens) >= params.max_new_tokens:
            node.finish = "length"
        elif self.cfg.stop_on_repeat and seg and seg == parent.last_segment:
            node.finish = "length"
        return node

    def _fall_back(self, children: list[Node], frontier: list[Node]) -> None:
        """TreePO's fallback: the extra leaves of each branch that ended go to the unfinished branches
        of the same prompt at this depth, in turn (a branch that ended keeps one leaf)."""
        for node in children:
            if node.finish is None or node.leaves <= 1:
                continue
            peers = [f for f in frontier if f.request == node.request]
            for k in range(node.leaves - 1 if peers else 0):
                peers[k % len(peers)].leaves += 1
            if peers:
                node.leaves = 1

    def _leaves(self, engine: Any, requests: Sequence[GenerationRequest], done: list[Node],
                params: SamplingParams) -> list[Generation]:
        """The G completions of every prompt, in tree order: a finished node gives one per leaf."""
        out: list[Generation] = []
        for k, req in enumerate(requests):
            nodes = sorted((nd for nd in done if nd.request == k), key=lambda nd: [int(x) for x in nd.node_id.split(".")])
            i, previous = 0, []
            for nd in nodes:
                tokens, logps, finish = nd.tokens, nd.logps, nd.finish or "length"
                end = cut_at_stop(engine.tokenizer, tokens, params.stop, 1) if params.stop else None
                if end is not None:  # a stop string across two segments
                    tokens, logps, finish = tokens[:end], logps[:end], "stop"
                text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
                shared = _common_prefix(previous, tokens)  # decoded once, for a completion before it
                for leaf in range(nd.leaves):
                    out.append(Generation(req.request_id, list(req.prompt_ids), list(tokens), list(logps),
                                          finish, engine.version, text, i,  # type: ignore[arg-type]
                                          extra={"subgroups": list(nd.branch_points), "tree_node": nd.node_id,
                                                 "tokens_reused": shared if leaf == 0 else len(tokens)}))
                    i += 1
                previous = tokens
        return out

    def counters(self) -> dict[str, float]:
        return dict(self._counters)
