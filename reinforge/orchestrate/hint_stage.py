"""The hint stage after collection (``rollout.hints``; the parts and the rule are in orchestrate/hints.py):
the kept groups that all failed sampled again with hints through the collector's engine and reward
pool, stage by stage, in place; and the batch field ``hinted`` the ``guide`` policy loss reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from reinforge.algo.objective import read_fields
from reinforge.config import AlgoConfig
from reinforge.data.prompt_stats import is_correct
from reinforge.errors import ConfigError
from reinforge.orchestrate.batch_fields import produces
from reinforge.orchestrate.demo_batches import prompt_key
from reinforge.orchestrate.episodes import score_single_turn, shape_rewards
from reinforge.orchestrate.hints import HINTS, HintPlan, failed_groups, hint_source, hint_text, with_hint
from reinforge.orchestrate.rollouts import Rollout, StatelessStage
from reinforge.rollout.continuation import continue_budgeted
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory


def unguided_row(row: Trajectory, prompt: list[int], hint_ids: list[int]) -> Trajectory:
    """A hinted row put back on ``prompt`` (the unguided prompt's tokens): the hint's tokens (``hint_ids``,
    a response hint; none for a prompt hint) become answer tokens with sampling log-prob 0, the
    completion keeps its own; ``metadata['hinted']`` marks it for the ``guide`` loss."""
    start = len(prompt_key(row))
    gen = len(row.token_ids) - start
    versions = row.token_versions[start:] if row.token_versions else []
    return dataclasses.replace(
        row, token_ids=prompt + hint_ids + row.token_ids[start:],
        loss_mask=[0] * len(prompt) + [1] * len(hint_ids) + row.loss_mask[start:],
        logprobs=[0.0] * (len(prompt) + len(hint_ids)) + row.logprobs[start:],
        token_versions=[-1] * (len(prompt) + len(hint_ids)) + versions if versions else [],
        metadata={**row.metadata, "hinted": True, "hint_tokens": len(hint_ids), "completion_tokens": gen})


class HintStage(StatelessStage):
    """The hint stage after collection (module docstring): the failed kept groups sampled again with
    hints, stage by stage, in place; nothing kept across steps."""

    name = "hints"
    reads, writes = ("kept",), ("kept",)

    def __init__(self, plan: HintPlan, collector: Any, params: SamplingParams,
                 shape: Callable[[list[Trajectory]], None] = lambda rows: None) -> None:
        self.plan, self.collector, self.params, self.shape = plan, collector, params, shape

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        kept = list(rollout.kept)
        todo = failed_groups(kept)
        hinted: dict[int, float] = {}
        resampled = 0  # the rows generated again with a hint, over every stage (the hints' extra samples)
        for fraction in self.plan.fractions:
            if not todo:
                break
            resampled += sum(len(idx) for idx in todo.values())
            for g, rows in zip(todo, self._resample(kept, todo, fraction, tasks, step), strict=True):
                for i, row in zip(todo[g], rows, strict=True):
                    kept[i] = row
                hinted[g] = fraction
            todo = {g: idx for g, idx in todo.items() if not any(is_correct(kept[i]) for i in idx)}
        rollout.kept = kept
        return {**self._metrics(kept, hinted), "hints/samples": float(resampled)}

    def _resample(self, kept: list[Trajectory], groups: dict[int, list[int]], fraction: float,
                  tasks: Mapping[str, Task], step: int) -> list[list[Trajectory]]:
        """Each group's new rows (as many as it has), sampled with the hint of ``fraction``."""
        out = []
        for idx in groups.values():
            first = kept[idx[0]]
            task, prompt = tasks[first.task_id], list(prompt_key(first))
            text = hint_text(hint_source(task, self.plan.source), fraction)
            params = dataclasses.replace(self.params, n=len(idx))
            if self.plan.placement == "prompt":
                rows = self.collector.collect([with_hint(task, self.plan.template.format(hint=text))], params,
                                              step, independent=True).trajectories
                hint_ids: list[int] = []
            else:
                hint_ids = list(self.collector.engine.tokenizer(text, add_special_tokens=False)["input_ids"])
                gens, _ = continue_budgeted(self.collector.engine, [prompt], [hint_ids], params)
                gens = [dataclasses.replace(g, prompt_ids=prompt + hint_ids) for g in gens]
                rows = score_single_turn([task], gens, len(idx), self.collector.pool)
            rows = [dataclasses.replace(r, group_id=first.group_id, task_id=first.task_id,
                                        metadata={**r.metadata, "hint_fraction": fraction}) for r in rows]
            if self.plan.unguided:
                rows = [unguided_row(r, prompt, hint_ids) for r in rows]
            self.shape(rows)
            out.append(rows)
        return out

    @staticmethod
    def _metrics(kept: list[Trajectory], hinted: dict[int, float]) -> dict[str, float]:
        metrics = {"hints/groups": float(len(hinted))}
        if hinted:
            rows = [t for t in kept if t.group_id in hinted and not t.demonstration]
            solved = {t.group_id for t in rows if is_correct(t)}
            metrics |= {"hints/fraction": sum(hinted.values()) / len(hinted),
                        "hints/solved_groups": float(len(solved)),
                        "hints/reward": sum(t.reward for t in rows) / len(rows)}
        return metrics


@produces("hinted")
def _hinted(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    """[N] bool: the rows sampled with a hint and trained without it (``metadata['hinted']``)."""
    return (torch.tensor([bool(t.metadata.get("hinted", False)) for t in kept], dtype=torch.bool),)


def hint_stage(c: Any, collector: Any) -> HintStage | None:
    """The run's hint stage over ``collector`` (``rollout.hints``), or None. ``ConfigError`` without a
    single-turn collector, with ``algo.dynamic_sampling``, or when the part puts its rows back in the
    unguided context and no part of ``algo`` reads ``hinted`` (their importance correction)."""
    cfg = c.cfg
    if cfg.rollout.hints is None:
        return None
    part = cfg.rollout.hints
    plan: HintPlan = HINTS.entry(part.name).fn(part.settings())
    if getattr(collector, "pool", None) is None or getattr(collector, "engine", None) is None:
        raise ConfigError("rollout.hints samples failed groups again and scores them with the run's verifier: it "
                          "needs a single-turn environment")
    if cfg.algo.dynamic_sampling:
        raise ConfigError("rollout.hints acts on the groups that all failed; algo.dynamic_sampling sets them aside "
                          "before it: use algo.skip_equal_reward_groups to drop the groups still without spread")
    if plan.unguided and "hinted" not in read_fields(cfg.algo):
        raise ConfigError(f"rollout.hints={part.name} trains hinted samples without their hint: set a policy loss "
                          "that reads `hinted` for their importance correction (algo.policy_loss: guide)")
    shapers, max_new = cfg.algo.reward_shapers, cfg.rollout.max_new_tokens
    return HintStage(plan, collector, c.sampling_params(), lambda rows: shape_rewards(rows, shapers, max_new))
