"""From tasks to scored trajectories, and from trajectories to a training batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from reinforge.algo.advantages import ADVANTAGES, turn_returns
from reinforge.algo.shaping import soft_overlong_penalty
from reinforge.config import AlgoConfig, GroupSamplerConfig
from reinforge.data.base import Task
from reinforge.envs.base import Environment
from reinforge.envs.single_turn import verifier_step_result
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes
from reinforge.rewards.pool import VerifierPool
from reinforge.rollout.group_samplers import sample_groups
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.types import Batch, Trajectory


def generate_single_turn(
    tasks: Sequence[Task], engine, make_env: Callable[[], Environment], params: SamplingParams, seed: int,
    group_sampler: GroupSamplerConfig | None = None,
) -> tuple[list[Environment], list[Generation]]:
    """Reset one environment per task and sample ``params.n`` completions for each prompt (by the
    registered ``group_sampler``; independently from the prompt when None)."""
    envs = [make_env() for _ in tasks]
    prompts = [env.reset(task, seed) for env, task in zip(envs, tasks, strict=True)]
    requests = [
        GenerationRequest(encode_prompt(engine.tokenizer, p), t.id) for p, t in zip(prompts, tasks, strict=True)
    ]
    if group_sampler is None:
        return envs, engine.generate(requests, params)
    return envs, sample_groups(group_sampler.name, engine, requests, params, group_sampler.settings())


def score_single_turn(
    tasks: Sequence[Task], generations: list[Generation], group_size: int, pool: VerifierPool,
    group_offset: int = 0,
) -> list[Trajectory]:
    """Score every completion in ``pool`` (in parallel, each call with its timeout; a failed call
    raises or scores 0 by the pool's policy); one trajectory per completion, group id =
    ``group_offset`` + task index. A failed call is marked ``metadata['reward_status']``."""
    call_tasks = [tasks[i // group_size] for i in range(len(generations))]
    outcomes = pool.score(call_tasks, [g.text for g in generations])
    trajectories = []
    for i, (gen, outcome) in enumerate(zip(generations, outcomes, strict=True)):
        group = i // group_size
        info = verifier_step_result(outcome.result).info if outcome.result is not None else {}
        n_prompt = len(gen.prompt_ids)
        trajectories.append(
            Trajectory(
                token_ids=gen.prompt_ids + gen.token_ids,
                loss_mask=[0] * n_prompt + [1] * len(gen.token_ids),
                logprobs=[0.0] * n_prompt + gen.logprobs,
                version=gen.version,
                token_versions=[-1] * n_prompt + gen.token_versions,
                group_id=group_offset + group,
                task_id=tasks[group].id,
                reward=outcome.reward,
                finish_reason=gen.finish_reason,
                completion_text=gen.text,
                metadata={"correct": bool(info.get("correct", False)), "reward_status": outcome.status,
                          **({"reward_error": outcome.error} if outcome.error else {}),
                          **{k: info[k] for k in ("reward_terms", "reward_term_errors") if k in info}},
            )
        )
    return trajectories


def greedy_baseline_rewards(
    tasks: Sequence[Task], engine, make_env: Callable[[], Environment], params: SamplingParams, seed: int,
    pool: VerifierPool, limits: EpisodeLimits | None = None,
) -> list[float]:
    """ReMax's baseline: the reward of one greedy completion per task (with ``limits``: of one greedy
    multi-turn episode). The same in the synchronous loop and the asynchronous rollout workers."""
    greedy = dataclasses.replace(params, greedy=True, n=1)
    if limits is not None:
        return [t.reward for t in run_episodes(tasks, engine, make_env, greedy, limits, seed)]
    _, generations = generate_single_turn(tasks, engine, make_env, greedy, seed)
    return [t.reward for t in score_single_turn(tasks, generations, 1, pool)]


def shape_overlong(trajs: list[Trajectory], algo: AlgoConfig, max_new_tokens: int) -> None:
    """DAPO's data-side length handling, in place: the soft overlong penalty is added to the reward
    (``metadata['overlong_penalty']``) and, with overlong filtering, truncated responses get no loss."""
    if algo.overlong_buffer > 0:
        buffer = max(1, round(algo.overlong_buffer * max_new_tokens))
        lengths = torch.tensor([t.num_generated for t in trajs])
        penalty = soft_overlong_penalty(lengths, max_new_tokens, buffer, algo.overlong_penalty).tolist()
        for t, p in zip(trajs, penalty, strict=True):
            t.reward += p
            t.metadata["overlong_penalty"] = p
    if algo.overlong_filter:
        for t in trajs:
            t.trainable = not t.truncated


@dataclass
class BatchStats:
    groups: int
    groups_kept: int
    sequences_kept: int


def groups_with_spread(trajs: list[Trajectory]) -> set[int]:
    """Group ids whose rewards are not all equal (the others have zero group-relative advantage)."""
    seen: dict[int, set[float]] = {}
    for t in trajs:
        seen.setdefault(t.group_id, set()).add(t.reward)
    return {g for g, rewards in seen.items() if len(rewards) > 1}


def build_batch(
    trajs: list[Trajectory], algo: AlgoConfig, pad_id: int, baseline: list[float] | None = None
) -> tuple[Batch | None, BatchStats]:
    """Padded tensors, rewards and (ReMax) baselines; the learner computes the advantages.

    With ``algo.skip_equal_reward_groups`` the groups whose rewards are all equal (zero
    advantage under group baselines) are dropped; ``None`` when nothing is left to train on.
    """
    n_groups = len({t.group_id for t in trajs})
    keep = [True] * len(trajs)
    if algo.skip_equal_reward_groups:
        spread = groups_with_spread(trajs)
        keep = [t.group_id in spread for t in trajs]
    kept = [t for t, k in zip(trajs, keep, strict=True) if k]
    stats = BatchStats(groups=n_groups, groups_kept=len({t.group_id for t in kept}), sequences_kept=len(kept))
    if not kept:
        return None, stats
    base = None
    if baseline is not None:
        base = torch.tensor([b for b, k in zip(baseline, keep, strict=True) if k], dtype=torch.float32)
    batch = Batch.from_trajectories(kept, pad_id, base)
    if "turn_returns" in ADVANTAGES.needs(algo.advantage):
        batch.turn_returns = turn_return_tensor(kept, batch.input_ids.shape[1], algo.discount.gamma)
    return batch, stats


def turn_return_tensor(trajs: list[Trajectory], width: int, gamma: float) -> torch.Tensor:
    """[N, width]: at each model token, the discounted return from its turn on (``turn_returns``);
    a trajectory without turns (single-turn) has its reward on every token."""
    out = torch.zeros((len(trajs), width))
    for i, t in enumerate(trajs):
        if not t.turn_spans:
            out[i, : len(t.token_ids)] = t.reward
            continue
        for (start, end), g in zip(t.turn_spans, turn_returns(t.turn_rewards, gamma), strict=True):
            out[i, start:end] = g
    return out
