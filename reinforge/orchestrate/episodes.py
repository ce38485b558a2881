"""From tasks to scored trajectories, and from trajectories to a training batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from reinforge.algo import ADVANTAGES
from reinforge.config import AlgoConfig
from reinforge.data.base import Task
from reinforge.envs.base import Environment
from reinforge.errors import ReinforgeError
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.types import Batch, Trajectory


def generate_single_turn(
    tasks: Sequence[Task], engine, make_env: Callable[[], Environment], params: SamplingParams, seed: int
) -> tuple[list[Environment], list[Generation]]:
    """Reset one environment per task and sample ``params.n`` completions for each prompt."""
    envs = [make_env() for _ in tasks]
    prompts = [env.reset(task, seed) for env, task in zip(envs, tasks, strict=True)]
    requests = [
        GenerationRequest(encode_prompt(engine.tokenizer, p), t.id) for p, t in zip(prompts, tasks, strict=True)
    ]
    return envs, engine.generate(requests, params)


def score_single_turn(
    tasks: Sequence[Task], envs: list[Environment], generations: list[Generation], group_size: int
) -> list[Trajectory]:
    """Step each environment with its completions; one trajectory per completion, group id = task index."""
    trajectories = []
    for i, gen in enumerate(generations):
        group = i // group_size
        try:
            result = envs[group].step({"role": "assistant", "content": gen.text})
        except Exception as e:  # a broken reward function must fail loudly, not train on zeros
            raise ReinforgeError(
                f"the reward function raised {type(e).__name__}: {e} on task {tasks[group].id!r} "
                f"with completion {gen.text!r}"
            ) from e
        n_prompt = len(gen.prompt_ids)
        trajectories.append(
            Trajectory(
                token_ids=gen.prompt_ids + gen.token_ids,
                loss_mask=[0] * n_prompt + [1] * len(gen.token_ids),
                logprobs=[0.0] * n_prompt + gen.logprobs,
                version=gen.version,
                group_id=group,
                task_id=tasks[group].id,
                reward=result.reward,
                finish_reason=gen.finish_reason,
                completion_text=gen.text,
                metadata={"correct": bool(result.info.get("correct", False))},
            )
        )
    return trajectories


@dataclass
class BatchStats:
    groups: int
    groups_kept: int
    sequences_kept: int


def build_batch(trajs: list[Trajectory], algo: AlgoConfig, pad_id: int) -> tuple[Batch | None, BatchStats]:
    """Advantages by the configured estimator, then padded tensors.

    With ``algo.skip_equal_reward_groups`` the groups whose rewards are all equal (zero
    advantage under group baselines) are dropped; ``None`` when nothing is left to train on.
    """
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
    groups = torch.tensor([t.group_id for t in trajs], dtype=torch.long)
    n_groups = int(groups.max()) + 1
    keep = torch.ones(len(trajs), dtype=torch.bool)
    if algo.skip_equal_reward_groups:
        g_max = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, groups, rewards, "amax")
        g_min = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, groups, rewards, "amin")
        keep = (g_max > g_min)[groups]
    kept = [t for t, k in zip(trajs, keep.tolist(), strict=True) if k]
    stats = BatchStats(groups=n_groups, groups_kept=len({t.group_id for t in kept}), sequences_kept=len(kept))
    if not kept:
        return None, stats
    batch = Batch.from_trajectories(kept, torch.zeros(len(kept), 1), pad_id)
    _, dense_groups = torch.unique(groups[keep], return_inverse=True)
    batch.advantages = ADVANTAGES.get(algo.advantage)(rewards[keep], dense_groups, batch.loss_mask, None, algo)
    return batch, stats
