"""Demonstrations in a step (docs/sft.md): ``DemonstrationBatches``, the batch source of a run that
trains on demonstrations alone, and the stages that add them to a rollout batch.

Each step takes the next ``demonstrations.per_step`` rows of a seeded shuffle of the demonstrations
(a new shuffle every epoch). With ``demonstrations.mix: false`` they are the whole batch (SFT,
``DemonstrationBatches``); with ``mix: true`` the ``DemonstrationStage`` adds them to the batch of the
run's rollout source (synchronous or asynchronous), after the other stages. Each demonstration row is a group of its own (group id < 0): advantage estimators leave it out,
only the terms that need demonstrations (``nll``) train on it. The order depends only on the seed
and the step, so a resumed run draws exactly what the interrupted one would have.

With ``demonstrations.placement: in_group`` (LUFFY's off-policy guidance; the ``GuidanceStage``) the
demonstrations are not drawn by ``per_step``: every rollout group whose prompt has a demonstration (the same prompt tokens)
gains it as one more member, with that group's id and the reward the run's verifier gives its
completion, so the group's advantages are computed over the sampled completions and the expert's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from reinforge.algo.objective import required_inputs
from reinforge.config import RunConfig
from reinforge.data.demonstrations import rows_to_demonstrations, task_demonstrations
from reinforge.data.preferences import rows_to_pairs, task_pairs
from reinforge.data.prompt_stats import is_correct
from reinforge.data.tabular import table_rows
from reinforge.errors import ConfigError, DataError
from reinforge.orchestrate.guidance_rules import GUIDANCE_RULES
from reinforge.orchestrate.rollouts import Rollout, StatelessStage
from reinforge.types import Task, Trajectory

SEED_OFFSET = 4_243  # the demonstrations' shuffle is apart from the run's other random streams


def prompt_key(trajectory: Trajectory) -> tuple[int, ...]:
    """The prompt's tokens: everything before the first trained token."""
    mask = trajectory.loss_mask
    return tuple(trajectory.token_ids[: mask.index(1) if 1 in mask else len(mask)])


class GroupGuidance:
    """Rollout groups' demonstrations as members of the groups (``placement: in_group``). ``score(tasks,
    completions)`` is the run's verifier (the rewards of the demonstrations' answers); ``rule`` (a
    ``demonstrations.guidance`` part, orchestrate/guidance_rules.py, as ``rule(rewards, correct, reference)``)
    decides per group whether its prompt's demonstration is added, replaces the group's last sample, or
    is left out (default: added to every group); ``with_reference``: the rows' baselines are the prompts'
    reference values V_ref, handed to the rule."""

    def __init__(self, demos: list[Trajectory], tasks: list[Task],
                 score: Callable[[list[Task], list[str]], list[float]],
                 rule: Callable[[list[float], list[bool], float | None], str] | None = None,
                 with_reference: bool = False) -> None:
        unscorable = next((d.task_id for d in demos if not d.completion_text), None)
        if unscorable is not None:
            raise DataError(f"{unscorable}: demonstrations.placement=in_group scores each demonstration's answer; "
                            "give prompt/completion rows (a chat row has no single answer)")
        self.by_prompt = {prompt_key(d): d for d in demos}
        self.tasks, self.score = {t.id: t for t in tasks}, score
        self.rule = rule or (lambda rewards, correct, reference: "add")
        self.with_reference = with_reference

    def _plans(self, kept: list[Trajectory], baseline: list[float] | None) -> list[tuple[Trajectory, str, list[int]]]:
        """(demonstration, action, the group's row indices) of every group the rule gives its demonstration."""
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(kept):
            if not t.demonstration and t.group_id >= 0:
                groups.setdefault(t.group_id, []).append(i)
        plans = []
        for idx in groups.values():
            demo = self.by_prompt.get(prompt_key(kept[idx[0]]))
            if demo is None:
                continue
            reference = baseline[idx[0]] if self.with_reference and baseline is not None else None
            action = self.rule([kept[i].reward for i in idx], [is_correct(kept[i]) for i in idx], reference)
            if action != "skip":
                plans.append((demo, action, idx))
        return plans

    def apply(self, kept: list[Trajectory], baseline: list[float] | None
              ) -> tuple[list[Trajectory], list[float] | None, dict[str, float]]:
        """``kept`` with the groups' demonstrations (scored, with the group's id, task and baseline): a
        replacing one in place of its group's last sample, an added one after the rows; the baselines
        alike; and the metrics ``demonstrations/rows``, ``/replaced``, ``/reward``."""
        plans = self._plans(kept, baseline)
        metrics = {"demonstrations/rows": float(len(plans)),
                   "demonstrations/replaced": float(sum(a == "replace" for _, a, _ in plans))}
        if not plans:
            return kept, baseline, metrics
        rewards = self.score([self.tasks[kept[idx[0]].task_id] for _, _, idx in plans],
                             [d.completion_text for d, _, _ in plans])
        out, base = list(kept), (list(baseline) if baseline is not None else None)
        added, added_base = [], []
        for (demo, action, idx), r in zip(plans, rewards, strict=True):
            first = kept[idx[0]]
            row = dataclasses.replace(demo, group_id=first.group_id, task_id=first.task_id, reward=float(r))
            if action == "replace":
                out[idx[-1]] = row
            else:
                added.append(row)
                added_base.append(base[idx[0]] if base is not None else 0.0)
        metrics["demonstrations/reward"] = sum(float(r) for r in rewards) / len(rewards)
        return out + added, (base + added_base if base is not None else None), metrics


class DemonstrationBatches:
    """The batch source of a run on demonstrations alone: each step's ``rows`` (see the module
    docstring). ``of_groups``: items of several rows that form a group (preference pairs), drawn alike."""

    def __init__(self, demos: list[Trajectory], per_step: int, seed: int) -> None:
        self.items, self.per_step, self.seed = [[d] for d in demos], per_step, seed
        self.grouped = False

    @classmethod
    def of_groups(cls, items: list[list[Trajectory]], per_step: int, seed: int) -> DemonstrationBatches:
        """Items of given rows that each form one group (ids 0, 1, ... within a step): e.g. the chosen
        and rejected rows of a preference pair."""
        source = cls([], per_step, seed)
        source.items, source.grouped = items, True
        return source

    def rows(self, step: int) -> list[Trajectory]:
        """Step ``step``'s rows (1-based): ``per_step`` items of a seeded shuffle (a new one every
        epoch), each demonstration a group of its own (ids -1, -2, ...) or each item one group."""
        n, out = len(self.items), []
        for j, k in enumerate(range((step - 1) * self.per_step, step * self.per_step)):
            epoch, i = divmod(k, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + SEED_OFFSET + epoch))
            item = self.items[int(order[i])]
            out += [dataclasses.replace(t, group_id=j if self.grouped else -(j + 1)) for t in item]
        return out

    def collect(self, step: int) -> Rollout:
        rows = self.rows(step)
        return Rollout(kept=rows, metrics={"demonstrations/rows": float(len(rows))})

    def published(self, model: torch.nn.Module, version: int) -> None:
        pass  # nothing samples from the policy

    def state(self) -> dict[str, Any]:
        return {}  # the draw depends on the seed and the step only

    def close(self) -> None:
        pass


class DemonstrationStage(StatelessStage):
    """``demonstrations.mix: true``: each step's ``per_step`` demonstrations (``draws.rows(step)``) join
    the kept rows, with baseline 0; nothing kept across steps (the draw depends on the step only)."""

    name = "demonstrations"
    reads, writes = ("kept", "baseline"), ("kept", "baseline")

    def __init__(self, draws: DemonstrationBatches) -> None:
        self.draws = draws

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        demos = self.draws.rows(step)
        rollout.kept = [*rollout.kept, *demos]
        if rollout.baseline is not None:
            rollout.baseline = [*rollout.baseline, *([0.0] * len(demos))]
        return {"demonstrations/rows": float(len(demos))}


class GuidanceStage(StatelessStage):
    """``demonstrations.placement: in_group``: the rollout groups gain their prompts' demonstrations
    (``GroupGuidance.apply``); nothing kept across steps."""

    name = "guidance"
    reads, writes = ("kept", "baseline"), ("kept", "baseline")

    def __init__(self, guidance: GroupGuidance) -> None:
        self.guidance = guidance

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        rollout.kept, rollout.baseline, metrics = self.guidance.apply(rollout.kept, rollout.baseline)
        return metrics


def preference_batches(c: Any, collector: Any) -> DemonstrationBatches:
    """The loop's source factory for a run with ``preferences.path``: pairs only (offline DPO)."""
    cfg, p = c.cfg, c.cfg.preferences
    if p.path == "task":
        env = c.make_env()
        pairs = task_pairs(list(c.splits.train), c.tokenizer, lambda task: env.reset(task, cfg.seed))
    else:
        pairs = rows_to_pairs(table_rows(p.path, p.split), c.tokenizer, p.columns)
    return DemonstrationBatches.of_groups(pairs, p.per_step, cfg.seed)


def load_demonstrations(cfg: RunConfig, tokenizer: Any, train_tasks: list, prompt_of: Callable[[Any], Any]
                        ) -> list[Trajectory]:
    """The run's demonstrations: a table (``demonstrations.path``) or the training tasks' answers ('task')."""
    d = cfg.demonstrations
    if d.path == "task":
        return task_demonstrations(train_tasks, tokenizer, prompt_of)
    return rows_to_demonstrations(table_rows(d.path, d.split), tokenizer, d.columns)


def demonstration_batches(c: Any, collector: Any) -> DemonstrationBatches:
    """The loop's source factory for a run on demonstrations alone (``demonstrations.mix: false``)."""
    return DemonstrationBatches(_run_demonstrations(c), c.cfg.demonstrations.per_step, c.cfg.seed)


def demonstration_stage(c: Any, collector: Any) -> DemonstrationStage | GuidanceStage | None:
    """The stage that adds demonstrations to every rollout batch (``demonstrations.mix: true``), or None;
    ``collector`` is this process's (its reward pool scores in-group demonstrations)."""
    cfg = c.cfg
    if cfg.demonstrations.path is None or not cfg.demonstrations.mix:
        return None
    demos = _run_demonstrations(c)
    if cfg.demonstrations.placement != "in_group":
        return DemonstrationStage(DemonstrationBatches(demos, cfg.demonstrations.per_step, cfg.seed))
    pool = getattr(collector, "pool", None)
    if pool is None:
        raise ConfigError("demonstrations.placement=in_group: the demonstrations are scored by the run's "
                          "verifier, which needs a single-turn environment")
    rule = cfg.demonstrations.guidance
    return GuidanceStage(GroupGuidance(
        demos, list(c.splits.train), lambda tasks, texts: [o.reward for o in pool.score(tasks, texts)],
        lambda rewards, correct, reference: GUIDANCE_RULES.entry(rule).fn(rewards, correct, reference, rule.settings),
        with_reference="reference_value" in required_inputs(cfg.algo)))


def _run_demonstrations(c: Any) -> list[Trajectory]:
    env = c.make_env()
    return load_demonstrations(c.cfg, c.tokenizer, list(c.splits.train), lambda task: env.reset(task, c.cfg.seed))
