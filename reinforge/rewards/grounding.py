"""Grounding rewards: the intersection over union of a predicted box with the true box.

A box is four numbers ``x1,y1,x2,y2``: the top-left and bottom-right pixels it covers, both included (the
``shapes`` task's ``question: box`` answers so, docs/vision.md). The completion's box is its last four
numbers (integers or decimals, any separators, e.g. ``[3, 4, 12, 15]``); a completion with fewer, or
with x2 < x1 or y2 < y1, scores 0. With inclusive pixel corners a box covers (x2 - x1 + 1)(y2 - y1 + 1)
pixels (the convention of VLM-R1's released IoU), so a one-pixel box has area 1, not 0.

    IoU(b, b*) = area(b n b*) / (area(b) + area(b*) - area(b n b*))

``box_iou`` (VLM-R1, Shen et al. 2025, arXiv:2504.07615: the accuracy reward of referring expression
comprehension is the predicted box's IoU with the true one) rewards the IoU itself. ``box_iou_threshold``
is Vision-R1's criterion-driven precision reward for one object (Zhan et al. 2025, arXiv:2503.18013): a
box counts only when its IoU reaches the criterion xi, r = IoU * 1[IoU >= xi]; the paper's progressive rule
refinement raises xi over training (0.5, then 0.75), here a task metadata entry ``iou_threshold`` (default
0.5) a recipe sets per stage. ``box_hit`` is the binary baseline the two are measured against: r = 1 when
the IoU reaches 0.5, else 0 (Acc@0.5 as the reward; no paper's method). ``correct`` is IoU >= 0.5 for all
three (Acc@0.5, REC's accuracy).
"""

from __future__ import annotations

import re

from reinforge.rewards.verifiers import VERIFIERS, RewardResult
from reinforge.types import Task

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
Box = tuple[float, float, float, float]
CORRECT_IOU = 0.5


def parse_box(text: str) -> Box | None:
    """The last four numbers of ``text`` as a box (x1, y1, x2, y2); None when fewer or not ordered."""
    found = _NUMBER.findall(text)
    if len(found) < 4:
        return None
    x1, y1, x2, y2 = (float(v) for v in found[-4:])
    return (x1, y1, x2, y2) if x2 >= x1 and y2 >= y1 else None


def box_area(box: Box) -> float:
    """Pixels covered by an inclusive box: (x2 - x1 + 1)(y2 - y1 + 1)."""
    return (box[2] - box[0] + 1) * (box[3] - box[1] + 1)


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two inclusive boxes."""
    w = min(a[2], b[2]) - max(a[0], b[0]) + 1
    h = min(a[3], b[3]) - max(a[1], b[1]) + 1
    inter = max(w, 0.0) * max(h, 0.0)
    return inter / (box_area(a) + box_area(b) - inter)


def _scored(task: Task, completion: str) -> tuple[float, str | None]:
    true = parse_box(task.answer)
    if true is None:
        raise ValueError(f"task {task.id!r}: the answer {task.answer!r} is no box x1,y1,x2,y2")
    predicted = parse_box(completion)
    if predicted is None:
        return 0.0, None
    return iou(predicted, true), ",".join(f"{v:g}" for v in predicted)


@VERIFIERS.register(
    "box_iou",
    formula="r = IoU(b, b*) = area(b n b*) / area(b u b*) (b: the completion's last four numbers x1,y1,x2,y2, inclusive "
            "pixel corners; 0 without a box)",
    paper="Shen et al. 2025, VLM-R1: A Stable and Generalizable R1-style Large Vision-Language Model "
          "(arXiv:2504.07615), the IoU reward of referring expression comprehension",
)
def box_iou(task: Task, completion: str) -> RewardResult:
    """The predicted box's IoU with the task's answer box; correct at IoU >= 0.5 (module docstring)."""
    value, answer = _scored(task, completion)
    return RewardResult(value, value >= CORRECT_IOU, answer)


@VERIFIERS.register(
    "box_iou_threshold",
    formula="r = IoU(b, b*) * 1[IoU(b, b*) >= xi], xi = task.metadata['iou_threshold'] (default 0.5; the paper's "
            "second stage 0.75)",
    paper="Zhan et al. 2025, Vision-R1: Evolving Human-Free Alignment in Large Vision-Language Models via "
          "Vision-Guided Reinforcement Learning (arXiv:2503.18013), criterion-driven precision reward",
)
def box_iou_threshold(task: Task, completion: str) -> RewardResult:
    """The IoU when it meets the criterion xi, else 0 (module docstring)."""
    value, answer = _scored(task, completion)
    xi = float(task.metadata.get("iou_threshold", CORRECT_IOU))
    return RewardResult(value if value >= xi else 0.0, value >= CORRECT_IOU, answer)


@VERIFIERS.register(
    "box_hit",
    formula="r = 1[IoU(b, b*) >= 0.5] (Acc@0.5 as a binary reward; 0 without a box)",
    paper="the binary baseline for box_iou and box_iou_threshold: REC's Acc@0.5 criterion as the reward "
          "(Shen et al. 2025, VLM-R1, arXiv:2504.07615, report Acc@0.5)",
)
def box_hit(task: Task, completion: str) -> RewardResult:
    """1 when the predicted box's IoU with the answer box reaches 0.5, else 0 (module docstring)."""
    value, answer = _scored(task, completion)
    hit = value >= CORRECT_IOU
    return RewardResult(1.0 if hit else 0.0, hit, answer)
