"""TreeRL's process supervision from the tree of rollouts (Hou et al. 2025, "TreeRL: LLM Reinforcement
Learning with On-Policy Tree Search", arXiv:2506.11902).

A tree sampler (EPTree, rollout/eptree.py) grows each prompt's group as trees; every leaf is a
completion, and a tree node s_n (a segment of tokens between two fork points) is shared by the leaves
L(s_n) below it. Its value is the mean outcome of those leaves, the root's the mean of the group:

    V(s_n) = (1 / |L(s_n)|) sum_{l in L(s_n)} r_l,        V(root) = mean_g r
    GA(s_n) = V(s_n) - V(root)                              (global advantage)
    LA(s_n) = V(s_n) - V(p(s_n))                            (local advantage; p: the parent node)
    R(s_n)  = (GA(s_n) + LA(s_n)) / sqrt(|L(s_n)|)

and every token of s_n, in every leaf that holds it, gets A_t = R(s_n). The 1 / sqrt(|L(s_n)|)
re-weighting (``sqrt_leaves``) keeps a node shared by many leaves, which is trained once per leaf,
from dominating. The first node of a tree has the root as its parent (GA = LA).

The tree comes as the context field ``tree_nodes`` [N, T] (long: the id, >= 1, of the node each token
belongs to; unique across the batch; 0 where none), made by ``orchestrate.batch_fields`` from the
sampler's ``extra['tree_spans']``. A row without node ids (another sampler) is one node of one leaf whose
parent is the root: A = 2 (r - mean_g r). A node's parent is the node of the token just before it (the
root at the first trained token, or after an untrained gap).

Departures from the authors' code (github.com/THUDM/TreeRL, tree_node.py / parallel_mcts.py): the
paper's formula is used as written. The code first centres each leaf's reward leave-one-out (RLOO,
which scales every difference above by G / (G - 1)) and divides each value by sqrt of its own leaf
count before taking differences, so its local term is V(s_n) / sqrt|L(s_n)| - V(p) / sqrt|L(p)|
(the paper's divides both by sqrt|L(s_n)|); it also copies the previous node's local advantage onto a
node whose local advantage is exactly 0, and subsamples the leaves to a fixed count; none of these here.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, DiscountSettings, group_mean_std
from reinforge.algo.context import EXTRA_FIELDS, register_field
from reinforge.algo.returns import _gamma, returns_to_go

FIELD = "tree_nodes"
if FIELD not in EXTRA_FIELDS:
    register_field(FIELD)  # [N, T] long, produced by orchestrate/batch_fields.py from a tree sampler's spans


class TreeRLSettings(DiscountSettings):
    """The leaf-count re-weighting."""

    sqrt_leaves: bool = Field(True, description="divide each node's advantage by sqrt of its leaf count (the "
                              "paper's); false: the plain GA + LA")


def node_keys(mask: Tensor, tree_nodes: Tensor | None) -> Tensor:
    """[N, T] long: the node of every trained token (the given id, or -(row + 1) for a row's tokens
    without one: the row's own node), 0 off the mask."""
    live = mask != 0
    n, width = mask.shape
    own = -(torch.arange(n, device=mask.device, dtype=torch.long) + 1)[:, None].expand(n, width)
    given = tree_nodes.to(torch.long) if tree_nodes is not None else torch.zeros_like(own)
    return torch.where(live, torch.where(given > 0, given, own), torch.zeros_like(own))


def tree_values(rewards: Tensor, group_index: Tensor, mask: Tensor, keys: Tensor
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """([N, T] V(s_n), [N, T] V(p(s_n)), [N, T] |L(s_n)| of each token's node, [N] V(root)), float64."""
    live = mask != 0
    r = rewards.to(torch.float64)
    n = r.shape[0]
    root = group_mean_std(r, group_index)[0]
    uniq, inv = torch.unique(keys[live], return_inverse=True)
    rows = torch.arange(n, device=mask.device)[:, None].expand_as(keys)[live]
    member = torch.zeros(uniq.numel(), n, dtype=torch.float64, device=mask.device)
    member[inv, rows] = 1.0
    leaves = member.sum(1)
    value = (member @ r) / leaves
    node = torch.full(keys.shape, -1, dtype=torch.long, device=mask.device)
    node[live] = inv
    v_tok = torch.zeros(keys.shape, dtype=torch.float64, device=mask.device)
    v_tok[live] = value[inv]
    prev_live = torch.cat([torch.zeros_like(live[:, :1]), live[:, :-1]], dim=1)
    prev_node = torch.cat([torch.full_like(node[:, :1], -1), node[:, :-1]], dim=1)
    prev_value = torch.cat([torch.zeros_like(v_tok[:, :1]), v_tok[:, :-1]], dim=1)
    start = live & (~prev_live | (prev_node != node))
    parent_at_start = torch.where(prev_live, prev_value, root[:, None].expand_as(v_tok))
    parent = torch.zeros(uniq.numel(), dtype=torch.float64, device=mask.device)
    parent[node[start]] = parent_at_start[start]
    p_tok = torch.zeros_like(v_tok)
    p_tok[live] = parent[inv]
    l_tok = torch.ones_like(v_tok)
    l_tok[live] = leaves[inv]
    return v_tok, p_tok, l_tok, root


@ADVANTAGES.register(
    "treerl",
    formula="A_t = (GA(s_n) + LA(s_n)) / sqrt(L(s_n)) for every token t of tree node s_n, GA = V(s_n) - V(root), "
            "LA = V(s_n) - V(parent(s_n)), V(s) = mean outcome of the leaves below s, L(s) their count "
            "[sqrt re-weighting optional]",
    paper="Hou et al. 2025, TreeRL (arXiv:2506.11902)",
    settings=TreeRLSettings,
)
def treerl_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: TreeRLSettings,
                     tree_nodes: Tensor | None = None, token_rewards: Tensor | None = None) -> Tensor:
    """TreeRL's process supervision from the tree's node values (module docstring), per token."""
    live = mask != 0
    if not bool(live.any()):
        return torch.zeros_like(mask)
    v, p, leaves, root = tree_values(rewards, group_index, mask, node_keys(mask, tree_nodes))
    adv = 2.0 * v - root[:, None] - p
    if cfg.sqrt_leaves:
        adv = adv / leaves.sqrt()
    if token_rewards is not None:
        adv = adv + returns_to_go(token_rewards.to(torch.float64), mask, _gamma(cfg))
    return torch.where(live, adv, 0.0).to(mask.dtype)
