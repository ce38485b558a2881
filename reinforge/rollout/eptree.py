"""TreeRL's entropy-guided tree search, EPTree (Hou et al. 2025, "TreeRL: LLM Reinforcement Learning
with On-Policy Tree Search", arXiv:2506.11902).

A prompt's group of G completions is grown as M trees. Each tree starts as one complete chain sampled
from the prompt. Then, L times: in every tree, the N tokens with the highest entropy among all the
tree's completions so far are chosen as fork points, and from each fork point T new completions are
sampled (each re-samples the forking token and decodes to the end). A tree so holds 1 + L N T
completions, and the group M (1 + L N T): M = G / (1 + L N T) must be a whole number (``forks`` N,
``branches`` T, ``iterations`` L are the settings; the paper's M=6, N=2, L=1, T=2 gives 30 leaves).

A token's entropy is, as in the authors' code, the negative log-probability of the sampled token,
-log pi(y_t | x, y_<t) (the engine's sampling log-prob). A completion's first token is never a fork
point when it is itself a branch (forking there would duplicate its parent's fork), and a position
already forked is chosen again only when a tree has fewer than N other candidates (a tree with fewer
candidates than N cycles through them, as the authors' code does).

Every completion is a leaf. Its tokens fall into tree nodes (segments): the stretch of tokens between
two consecutive fork points of the completion they were decoded in. ``extra['tree_spans']`` lists, for
each leaf, ``[start, node]`` (the position in its completion where each node starts, and the node's
name, unique within the prompt's group), which ``orchestrate.batch_fields`` turns into the ``tree_nodes``
field read by TreeRL's advantage (``treerl``, algo/treerl.py). ``extra['subgroups']`` lists the nodes
above the leaf shared with other leaves (TreePO's subgroups, so the ``treepo`` advantage also runs on
these trees). A branch decodes its continuation in one engine call per round with the largest room
left, each cut to its own room (``rollout.max_new_tokens`` minus its prefix); the tokens decoded past a
completion's own room are dropped and counted apart (``eptree/tokens_past_room``; the sampler's own
``tokens_generated`` counter includes them, the step's ``rollout/tokens_generated`` does not). The chains are samples of the
policy; a branch is not (its prefix was chosen for its fork point's entropy): the leaves of a tree
are TreeRL's, not independent draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from reinforge.errors import ConfigError
from reinforge.registry import Settings
from reinforge.rollout.continuation import cut_at_stop
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams


class EPTreeSettings(Settings):
    forks: int = Field(1, ge=1, description="N: fork points per tree per iteration (its highest-entropy tokens)")
    branches: int = Field(1, ge=1, description="T: completions sampled from each fork point")
    iterations: int = Field(1, ge=0, description="L: forking rounds; the group size must be a multiple of "
                            "1 + L N T (M = group_size / (1 + L N T) trees per prompt)")


@dataclass
class EPNode:
    """One decoded completion of a tree: its tokens after ``prefix`` (the ancestors' tokens before its
    fork point ``at`` in ``parent``), and the positions of its own tokens children forked at."""

    request: int
    key: str
    prefix: list[int]
    prefix_logps: list[float]
    tokens: list[int]
    logps: list[float]
    finish: str
    parent: EPNode | None = None
    at: int = 0
    forks: set[int] = field(default_factory=set)


def trees_per_prompt(group_size: int, cfg: EPTreeSettings) -> int:
    """M = G / (1 + L N T), refusing a group size that is not a multiple of 1 + L N T."""
    per_tree = 1 + cfg.iterations * cfg.forks * cfg.branches
    if group_size % per_tree:
        raise ConfigError(f"rollout.group_size={group_size} must be a multiple of 1 + iterations * forks * branches "
                          f"= {per_tree} (rollout.group_sampler: eptree)")
    return group_size // per_tree


def fork_points(tree: Sequence[EPNode], n: int) -> list[tuple[EPNode, int]]:
    """The tree's ``n`` fork points: its tokens by entropy -log p, highest first (ties: earlier node, then
    earlier position), a branch's first token never; positions already forked only after all others;
    fewer candidates than ``n`` are cycled through."""
    fresh, used = [], []
    for order, node in enumerate(tree):
        for pos, logp in enumerate(node.logps):
            if pos == 0 and node.parent is not None:
                continue
            (used if pos in node.forks else fresh).append((-logp, order, pos, node))
    ranked = sorted(fresh, key=lambda c: (-c[0], c[1], c[2])) + sorted(used, key=lambda c: (-c[0], c[1], c[2]))
    if not ranked:  # a root chain of no tokens: sample afresh from the prompt
        ranked = [(0.0, 0, 0, tree[0])]
    return [(ranked[k % len(ranked)][3], ranked[k % len(ranked)][2]) for k in range(n)]


def leaf_spans(node: EPNode) -> list[tuple[int, str]]:
    """``(start, name)`` of every tree node (segment) the completion ``node`` passes through, in order:
    each completion on its chain from the tree's root is cut at its fork points before the point where
    the chain leaves it."""
    chain: list[EPNode] = []
    walk: EPNode | None = node
    while walk is not None:
        chain.append(walk)
        walk = walk.parent
    chain.reverse()
    out = []
    for a, nxt in zip(chain, [*chain[1:], None], strict=True):
        end = nxt.at if nxt is not None else len(a.tokens)
        for c in [0, *sorted(p for p in a.forks if 0 < p < end)]:
            if c < end:
                out.append((len(a.prefix) + c, f"{a.key}@{c}"))
    return out


@GROUP_SAMPLERS.register(
    "eptree",
    formula="M = G / (1 + L N T) chains per prompt; L rounds: fork each tree at its N tokens of highest "
            "-log pi(y_t), T completions from each; every completion a leaf, its tree nodes recorded",
    paper="Hou et al. 2025, TreeRL (arXiv:2506.11902)",
    settings=EPTreeSettings,
)
class EPTreeSampler:
    """TreeRL's EPTree (module docstring)."""

    def __init__(self, cfg: EPTreeSettings | None = None) -> None:
        self.cfg = cfg or EPTreeSettings()
        self._counters: dict[str, float] = {}

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        m = trees_per_prompt(params.n, self.cfg)
        gens = engine.generate(list(requests), dataclasses.replace(params, n=m))
        decoded = sum(len(g.token_ids) for g in gens)
        trees = [[EPNode(k, str(j), [], [], list(g.token_ids), list(g.logprobs), g.finish_reason)]
                 for k in range(len(requests)) for j, g in enumerate(gens[k * m: (k + 1) * m])]
        for _ in range(self.cfg.iterations):
            decoded += self._fork(engine, requests, trees, params)
        out = self._leaves(engine, requests, trees, params)
        total, reused = sum(len(g.token_ids) for g in out), sum(g.extra["tokens_reused"] for g in out)
        self._counters = {"tokens_generated": float(decoded), "tokens_reused": float(reused),
                          "eptree/tokens_past_room": float(decoded - (total - reused)),
                          "eptree/nodes": float(len({(g.request_id, n) for g in out for _, n in g.extra["tree_spans"]}))}
        return out

    def _fork(self, engine: Any, requests: Sequence[GenerationRequest], trees: list[list[EPNode]],
              params: SamplingParams) -> int:
        """One round: every tree's N fork points, T completions each, in one engine call; returns the
        tokens decoded."""
        tasks = [(tree, node, pos) for tree in trees for node, pos in fork_points(tree, self.cfg.forks)]
        rooms = [params.max_new_tokens - len(node.prefix) - pos for _, node, pos in tasks]
        reqs = [dataclasses.replace(requests[node.request], prompt_ids=list(requests[node.request].prompt_ids) + node.prefix
                                    + node.tokens[:pos]) for _, node, pos in tasks]
        t = self.cfg.branches
        gens = engine.generate(reqs, dataclasses.replace(params, n=t, max_new_tokens=max(rooms)))
        decoded = 0
        for i, (tree, node, pos) in enumerate(tasks):
            node.forks.add(pos)
            for g in gens[i * t: (i + 1) * t]:
                decoded += len(g.token_ids)
                seg = list(g.token_ids[: rooms[i]])
                finish = g.finish_reason if len(seg) == len(g.token_ids) else "length"
                tree.append(EPNode(node.request, f"{node.key}.{len(tree)}", node.prefix + node.tokens[:pos],
                                   node.prefix_logps + node.logps[:pos], seg, list(g.logprobs[: len(seg)]),
                                   finish, node, pos))
        return decoded

    def _leaves(self, engine: Any, requests: Sequence[GenerationRequest], trees: list[list[EPNode]],
                params: SamplingParams) -> list[Generation]:
        """Every completion of every tree, prompt by prompt (trees in order, completions in the order
        they were decoded)."""
        out: list[Generation] = []
        for k, req in enumerate(requests):
            nodes = [nd for tree in trees if tree[0].request == k for nd in tree]
            for i, nd in enumerate(nodes):
                tokens, logps, finish = nd.prefix + nd.tokens, nd.prefix_logps + nd.logps, nd.finish
                end = cut_at_stop(engine.tokenizer, tokens, params.stop, max(len(nd.prefix), 1)) if params.stop else None
                if end is not None and end < len(tokens):  # a stop string across the fork point
                    tokens, logps, finish = tokens[:end], logps[:end], "stop"
                spans = [[s, name] for s, name in leaf_spans(nd) if s < len(tokens)]
                out.append(Generation(req.request_id, list(req.prompt_ids), tokens, logps,
                                      finish, engine.version, engine.tokenizer.decode(tokens, skip_special_tokens=True),  # type: ignore[arg-type]
                                      i, extra={"tree_spans": spans, "subgroups": [name for _, name in spans[:-1]],
                                                "tree_node": nd.key, "tokens_reused": len(nd.prefix)}))
        return out

    def counters(self) -> dict[str, float]:
        return dict(self._counters)
