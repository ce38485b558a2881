"""From tasks to scored trajectories, and from trajectories to a training batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from reinforge.algo.shaping import REWARD_SHAPERS, ShapeInputs
from reinforge.config import AlgoConfig, RewardShaperConfig
from reinforge.envs.base import Environment
from reinforge.envs.single_turn import verifier_step_result
from reinforge.learn.faults import check_rewards
from reinforge.orchestrate.batch_fields import produce_fields
from reinforge.rewards.pool import VerifierOutcome, VerifierPool
from reinforge.rollout.group_samplers import GroupSampler
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.rollout.vision import vision_request
from reinforge.types import Batch, Task, Trajectory, declares_stage


def generate_single_turn(
    tasks: Sequence[Task], engine, make_env: Callable[[], Environment], params: SamplingParams, seed: int,
    group_sampler: GroupSampler | None = None,
) -> tuple[list[Environment], list[Generation]]:
    """Reset one environment per task and sample ``params.n`` completions for each prompt (by the
    ``group_sampler``, ``group_samplers.build_group_sampler``; independently from the prompt when None)."""
    envs = [make_env() for _ in tasks]
    prompts = [env.reset(task, seed) for env, task in zip(envs, tasks, strict=True)]
    requests = [prompt_request(engine, p, t) for p, t in zip(prompts, tasks, strict=True)]
    gens = (engine.generate(requests, params) if group_sampler is None
            else group_sampler.sample(engine, requests, params))
    if any(r.model_inputs for r in requests):  # each sample carries its prompt's pictures to its trajectory
        pictures = {r.request_id: r.model_inputs for r in requests}
        for g in gens:
            g.model_inputs = g.model_inputs or pictures[g.request_id]
    return envs, gens


def prompt_request(engine, prompt, task: Task) -> GenerationRequest:
    """The engine's request for ``task``'s ``prompt``: its token ids, and with pictures (``Task.images``) the
    ids the model's processor expands and its ``pixel_values`` (rollout/vision.py)."""
    if not task.images:
        return GenerationRequest(encode_prompt(engine.tokenizer, prompt), task.id)
    return vision_request(getattr(engine, "processor", None), prompt, task.images, task.id, f"task {task.id!r}")


def score_single_turn(
    tasks: Sequence[Task], generations: list[Generation], group_size: int, pool: VerifierPool,
    group_offset: int = 0,
) -> list[Trajectory]:
    """Score every completion in ``pool`` (in parallel, each call with its timeout; a failed call
    raises or scores 0 by the pool's policy); one trajectory per completion, group id =
    ``group_offset`` + task index. A failed call is marked ``metadata['reward_status']``. A generation that
    continues in a later step (``extra['continues']``, T-PPO's windows) is not scored: reward 0, status
    ``continues``, ``Trajectory.continues``."""
    scored = [i for i, g in enumerate(generations) if not g.extra.get("continues")]
    outcomes = [VerifierOutcome(0.0, "continues")] * len(generations)
    if scored:
        for i, outcome in zip(scored, pool.score([tasks[i // group_size] for i in scored],
                                                 [generations[i].text for i in scored]), strict=True):
            outcomes[i] = outcome
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
                continues=bool(gen.extra.get("continues", False)),
                model_inputs=gen.model_inputs,
                metadata={"correct": bool(info.get("correct", False)), "reward_status": outcome.status,
                          "answer": outcome.result.answer if outcome.result is not None else None,
                          **({"reward_error": outcome.error} if outcome.error else {}),
                          **{k: info[k] for k in ("reward_terms", "reward_term_errors", "reward_term_stats") if k in info},
                          **gen.extra},  # a group sampler's per-sample record (e.g. its tree's subgroups)
            )
        )
    return trajectories


def shape_rewards(trajs: list[Trajectory], shapers: Sequence[RewardShaperConfig], max_new_tokens: int) -> None:
    """The run's reward shapers (``REWARD_SHAPERS``), in order and in place: each adds its term to the
    rewards (kept in ``metadata[<shaper name>]``) and may take sequences out of the loss (``trainable``)."""
    if not shapers or not trajs:
        return
    for shaper in shapers:
        inputs = ShapeInputs(
            rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float64),
            lengths=torch.tensor([t.num_generated for t in trajs]),
            truncated=torch.tensor([t.truncated for t in trajs]),
            group_index=torch.tensor([t.group_id for t in trajs]),
            max_new_tokens=max_new_tokens,
            correct=torch.tensor([bool(t.metadata.get("correct", t.reward > 0)) for t in trajs]),
            tool_calls=torch.tensor([int(t.metadata.get("tool_calls", 0)) for t in trajs]),
            texts=tuple(t.completion_text or "" for t in trajs),
        )
        shaping = REWARD_SHAPERS.call(shaper.name, inputs, shaper.settings())
        if shaping.reward is not None:
            for t, r in zip(trajs, shaping.reward.tolist(), strict=True):
                t.reward += r
                t.metadata[shaper.name] = r
        if shaping.trainable is not None:
            for t, ok in zip(trajs, shaping.trainable.tolist(), strict=True):
                t.trainable = t.trainable and bool(ok)


# The batch record's fields every batch has (``Batch.from_trajectories``); the producers of
# orchestrate/batch_fields.py add the optional ones a part of the run reads.
BUILD_WRITES = ("input_ids", "attention_mask", "loss_mask", "sampling_logprobs", "prefix_len", "group_index",
                "rewards", "baseline", "token_rewards", "demo", "continues", "model_inputs")


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


@declares_stage("build", reads=("kept", "baseline"), writes=BUILD_WRITES)
def build_batch(
    trajs: list[Trajectory], algo: AlgoConfig, pad_id: int, baseline: list[float] | None = None
) -> tuple[Batch | None, BatchStats]:
    """Padded tensors, rewards and (ReMax) baselines; the learner computes the advantages.

    With ``algo.skip_equal_reward_groups`` the groups whose rewards are all equal (zero
    advantage under group baselines) are dropped; ``None`` when nothing is left to train on.
    """
    check_rewards(trajs)  # a NaN/inf reward stops the step here, naming its tasks
    n_groups = len({t.group_id for t in trajs if not t.demonstration})
    keep = [True] * len(trajs)
    if algo.skip_equal_reward_groups:  # demonstrations are kept: they are trained on by their own terms
        spread = groups_with_spread(trajs)
        keep = [t.group_id in spread or t.demonstration for t in trajs]
    kept = [t for t, k in zip(trajs, keep, strict=True) if k]
    stats = BatchStats(groups=n_groups, groups_kept=len({t.group_id for t in kept if not t.demonstration}),
                       sequences_kept=len(kept))
    if not kept:
        return None, stats
    base = None
    if baseline is not None:
        base = torch.tensor([b for b, k in zip(baseline, keep, strict=True) if k], dtype=torch.float32)
    batch = Batch.from_trajectories(kept, pad_id, base)
    produce_fields(batch, kept, algo)
    return batch, stats
