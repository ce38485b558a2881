"""Numerical faults: which input of a step is non-finite, so a diverged run says where it broke.

A non-finite reward stops the step before any update (``check_rewards``, naming the tasks); a
non-finite loss or gradient norm stops it in the learner, whose message names the batch's
non-finite tensors (``nonfinite_inputs``); the loop adds the last good checkpoint to resume from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from reinforge.errors import TrainingDiverged
from reinforge.types import Batch, Trajectory

BATCH_TENSORS = ("rewards", "baseline", "sampling_logprobs", "old_logprobs", "ref_logprobs", "values",
                 "token_rewards", "returns", "advantages", "teacher_logprobs", "old_vocab_mean",
                 "old_topk_logp")


def check_rewards(trajs: Sequence[Trajectory]) -> None:
    """Raise ``TrainingDiverged`` naming the tasks whose reward is NaN or infinite."""
    bad = [t for t in trajs if not math.isfinite(t.reward)]
    if not bad:
        return
    named = ", ".join(f"{t.task_id} ({t.reward})" for t in bad[:5]) + (" ..." if len(bad) > 5 else "")
    finite = [t.reward for t in trajs if math.isfinite(t.reward)]
    stats = (f"the other {len(finite)} rewards: min {min(finite):.3g}, max {max(finite):.3g}, "
             f"mean {sum(finite) / len(finite):.3g}") if finite else "no finite reward at all"
    raise TrainingDiverged(
        f"{len(bad)} of {len(trajs)} trajectories have a non-finite reward: {named}; {stats}. "
        "Hint: the reward function returned NaN/inf; check it on these tasks (reward terms must be finite).")


def nonfinite_inputs(batch: Batch) -> str:
    """Which of the batch's tensors hold NaN/inf on trained positions (or per sequence), as a sentence."""
    bad = []
    mask = batch.loss_mask > 0
    for name in BATCH_TENSORS:
        value = getattr(batch, name, None)
        if value is None:
            continue
        values = value[mask] if value.dim() >= 2 else value  # [N, L] (or [N, L, V]) on the trained positions
        n = int((~torch.isfinite(values)).sum())
        if n:
            bad.append(f"{name} ({n} non-finite)")
    if bad:
        return "non-finite inputs: " + ", ".join(bad) + "."
    return ("every input of the batch is finite, so the policy's forward (its logits or weights) or the "
            "loss itself produced the NaN/inf.")
