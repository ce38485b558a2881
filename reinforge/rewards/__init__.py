"""Rewards: verifiers that score a completion for a task. Importing this package registers them all."""

from reinforge.rewards import code as _code  # noqa: F401  (code_tests)
from reinforge.rewards import composite as _composite  # noqa: F401  (length_penalty)
from reinforge.rewards import format as _format  # noqa: F401  (think_answer_format)
from reinforge.rewards import grounding as _grounding  # noqa: F401  (box_iou, box_iou_threshold, box_hit)
from reinforge.rewards import label_free as _label_free  # noqa: F401  (majority_vote, restrain_vote, truthrl_ternary, ...)
from reinforge.rewards import math as _math  # noqa: F401  (math_verify, regex, multiple_choice)
from reinforge.rewards import patch_similarity as _patch_similarity  # noqa: F401  (patch_similarity: SWE-RL)
from reinforge.rewards import reasoning_gym as _reasoning_gym  # noqa: F401  (reasoning_gym)
from reinforge.rewards import reference_prob as _reference_prob  # noqa: F401  (rlpr, dro_r3)
from reinforge.rewards import tool_call_match as _tool_call_match  # noqa: F401  (tool_call_match: ToolRL)
from reinforge.rewards.verifiers import VERIFIERS, RewardResult

__all__ = ["VERIFIERS", "RewardResult"]
