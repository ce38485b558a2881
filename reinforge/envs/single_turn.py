"""Single-turn environment: one completion, scored by a verifier, then done."""

from __future__ import annotations

from reinforge.envs.base import Message, StepResult
from reinforge.rewards.verifiers import RewardResult, Verifier
from reinforge.rollout.prompts import prompt_messages
from reinforge.types import Task


class SingleTurnEnv:
    """reset -> the task's prompt (with the optional system prompt); step -> verifier reward, done."""

    def __init__(self, verifier: Verifier, system_prompt: str | None = None) -> None:
        self.verifier = verifier
        self.system_prompt = system_prompt
        self.task: Task | None = None

    def reset(self, task: Task, seed: int = 0) -> list[Message] | str:
        self.task = task
        return prompt_messages(task.prompt, self.system_prompt)

    def step(self, assistant: Message) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        return verifier_step_result(self.verifier(self.task, assistant["content"]))


def verifier_step_result(result: RewardResult) -> StepResult:
    """The final step of a verifier-scored episode: its reward, ``correct``, and a composite reward's
    named terms (``reward_terms``), failed terms (``reward_term_errors``) and terms' counters
    (``reward_term_stats``), logged per step."""
    info: dict = {"correct": result.correct}
    terms = getattr(result, "terms", None)
    if terms:
        info["reward_terms"] = dict(terms)
    errors = getattr(result, "errors", None)
    if errors:
        info["reward_term_errors"] = dict(errors)
    stats = getattr(result, "stats", None)
    if stats and terms:  # a composite term's counters (a pairwise judge's pairs and agreed ones)
        info["reward_term_stats"] = {name: dict(counters) for name, counters in stats.items()}
    if getattr(result, "status", "ok") != "ok":  # a failed call the reward pool scored 0 (rewards/pool.py)
        info["reward_status"], info["reward_error"] = result.status, result.error
    return StepResult(observation=[], reward=result.reward, done=True, info=info)
