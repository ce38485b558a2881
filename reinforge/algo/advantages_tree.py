"""TreePO's segment-level (tree-based) advantage (Li et al. 2025, arXiv:2508.17445).

A tree sampler (rollout/tree_sampler.py) records, for every completion, the branch points above it;
the learner gives them as ``subgroups`` [N, K] (long; the ids of the subtrees each sequence belongs
to besides its whole group, -1 padding; ids are unique across the batch). Each subtree S_j above
leaf i (the prompt's whole group S_0 included) is a sub-group with its own group-relative advantage,
and the leaf's advantage is their plain average:

    A_i = (1 / |J_i|) sum_{j in J_i} (r_i - mean_{S_j} r) / (std_{S_j} r + eps)

J_i: the whole group and every subtree above i with at least two leaves (std: unbiased; without
``scale_by_std`` only the mean is subtracted). Without subtrees this is GRPO.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reinforge.algo.advantages import ADVANTAGES, GroupNormSettings, _per_token, group_mean_std


@ADVANTAGES.register(
    "treepo",
    formula="A_i = mean_{j in J_i} (r_i - mean_{S_j}(r)) / (std_{S_j}(r) + eps), S_j = the prompt's group and each "
            "subtree above leaf i with >= 2 leaves  [std scaling optional]",
    paper="Li et al. 2025, TreePO (arXiv:2508.17445)",
    needs=("subgroups",),
    settings=GroupNormSettings,
)
def treepo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: GroupNormSettings,
                     subgroups: Tensor | None = None, token_rewards: Tensor | None = None) -> Tensor:
    """TreePO's tree-based advantage (module docstring), broadcast to every token of the sequence."""
    r = rewards.to(torch.float64)
    total = _subgroup_advantage(r, group_index, cfg)
    count = torch.ones_like(r)
    if subgroups is not None and subgroups.numel():
        for column in subgroups.T:
            member = column >= 0
            if not bool(member.any()):
                continue
            _, compact = torch.unique(column[member], return_inverse=True)
            _, _, size = group_mean_std(r[member], compact)
            adv = _subgroup_advantage(r[member], compact, cfg)
            counted = size >= 2
            idx = member.nonzero().squeeze(-1)[counted]
            total[idx] += adv[counted]
            count[idx] += 1
    return _per_token(total / count, mask, token_rewards, cfg)


def _subgroup_advantage(r: Tensor, index: Tensor, cfg: GroupNormSettings) -> Tensor:
    mean, std, _ = group_mean_std(r, index)
    adv = r - mean
    return adv / (std + cfg.adv_eps) if cfg.scale_by_std else adv
