"""Per-prompt values a part declares it needs, estimated by the loop and handed to the part in the
context's ``baseline`` field, from samples of the reference policy: ``optimal_value``, A*-PO's V*(x)
(a soft maximum of the samples' rewards), or ``reference_value``, PVPO's static V(x) (their mean).

A part that declares one of them (``registry.Entry.needs``: an advantage estimator or a policy loss)
reads the value per sequence in ``baseline``; its settings give ``value_samples`` (N), ``beta1`` (for
``optimal_value``), ``skip_unsolved`` and ``skip_solved``. The estimate
is the paper's stage 1 done lazily: the first time a prompt is drawn, N completions are sampled
from the *reference* policy (a rollout engine over the frozen reference model, never updated, so
the estimate is the one an offline pass before training would make) and
V*(x) = beta1 log mean_i exp(r(x, y_i) / beta1) (``algo.regression.soft_optimal_value``), or
V(x) = mean_i r(x, y_i), is cached by task id; a prompt drawn again reuses it. The cache is saved in checkpoints (``state.json``,
key ``optimal_values``) and restored on resume. Only the prompts a run draws are estimated, so a
large or unbounded prompt set costs N reference samples per new prompt and no pass up front.

With ``skip_unsolved`` the trajectories of a prompt none of whose reference samples has a positive
reward are kept out of the loss (``Trajectory.trainable``), A*-PO's filter of all-incorrect prompts;
with ``skip_solved`` those of a prompt all of whose reference samples reached ``solved_reward`` (PVPO's
filter of trivial prompts). The sampling is the run's (``rollout.temperature``, ``max_new_tokens``), its own seeded
stream. Single-turn and multi-turn collectors alike; in the learner's process after collection, in
synchronous and asynchronous runs alike (orchestrate/stages.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from reinforge.algo.objective import required_inputs
from reinforge.algo.regression import soft_optimal_value
from reinforge.errors import ConfigError
from reinforge.orchestrate.collectors import Collector
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory

if TYPE_CHECKING:
    from reinforge.orchestrate.components import Components

NEED = "optimal_value"
NEEDS = frozenset({NEED, "reference_value"})  # the soft maximum (A*-PO) or the mean (PVPO)
STATE_KEY = "optimal_values"
SEED_OFFSET = 104_729  # the reference engine's stream: apart from the training rollout's


@dataclasses.dataclass(frozen=True)
class ValueSettings:
    """N reference samples per prompt; the temperature beta1 of V* (None: the mean reward); the filters."""

    samples: int
    beta: float | None
    skip_unsolved: bool = True
    skip_solved: bool = False
    solved_reward: float = 1.0


class OptimalValues:
    """V*(x) per task id, estimated on first use from ``collector`` (over the reference policy) and cached.

    ``__call__(tasks, trajectories, params, step)`` is a prompt-baseline provider
    (the prompt-values stage, orchestrate/stages.py): V* of each task, in task order."""

    def __init__(self, collector: Collector, settings: ValueSettings, generator: torch.Generator | None = None,
                 seed: int = 0, cache: dict[str, list[float]] | None = None) -> None:
        self.collector, self.settings, self.generator, self.seed = collector, settings, generator, seed
        self.cache: dict[str, list[float]] = dict(cache or {})  # task id -> [V, best, worst reference reward]
        self.samples_drawn = 0

    def __call__(self, tasks: Sequence[Task], trajectories: list[Trajectory], params: SamplingParams,
                 step: int) -> list[float]:
        new = list({t.id: t for t in tasks if t.id not in self.cache}.values())
        if new:
            self._estimate(new, params, step)
        s = self.settings
        skipped = {t.id for t in tasks if s.skip_unsolved and self.cache[t.id][1] <= 0}
        skipped |= {t.id for t in tasks if s.skip_solved and self.cache[t.id][-1] >= s.solved_reward}
        for traj in trajectories:
            if traj.task_id in skipped:
                traj.trainable = False
        return [self.cache[t.id][0] for t in tasks]

    def _estimate(self, tasks: list[Task], params: SamplingParams, step: int) -> None:
        n = self.settings.samples
        if self.generator is not None:
            self.generator.manual_seed(self.seed * SEED_OFFSET + step)
        sampled = dataclasses.replace(params, n=n, greedy=False)
        trajs = self.collector.collect(tasks, sampled, step, independent=True).trajectories
        rewards = torch.zeros(len(tasks), n, dtype=torch.float64)
        seen = [0] * len(tasks)
        for t in trajs:  # one trajectory per sample (group id = task index); extra segments ignored
            g = t.group_id
            if seen[g] < n:
                rewards[g, seen[g]] = t.reward
                seen[g] += 1
        if min(seen) < n:
            raise RuntimeError(f"stage 1 of {NEED}: expected {n} reference samples per prompt, got {min(seen)}")
        beta = self.settings.beta
        values = rewards.mean(-1) if beta is None else soft_optimal_value(rewards, beta)
        best, worst = rewards.max(-1).values.tolist(), rewards.min(-1).values.tolist()
        for task, v, hi, lo in zip(tasks, values.tolist(), best, worst, strict=True):
            self.cache[task.id] = [v, hi, lo]
        self.samples_drawn += n * len(tasks)

    def state(self) -> dict[str, Any]:
        return {STATE_KEY: self.cache}

    def metrics(self) -> dict[str, float]:
        """Prompts estimated so far, those of them none of whose reference samples scored (unsolved),
        and the reference samples drawn by this process."""
        return {"value_estimates/prompts": float(len(self.cache)),
                "value_estimates/unsolved_prompts": float(sum(v[1] <= 0 for v in self.cache.values())),
                "value_estimates/reference_samples": float(self.samples_drawn)}


def needs_optimal_value(algo: Any) -> bool:
    """Does a part of the run declare ``optimal_value`` or ``reference_value`` (``Entry.needs``)?"""
    return bool(NEEDS & required_inputs(algo))


def value_settings(algo: Any) -> ValueSettings:
    """The estimate's options, from the settings of the estimator or policy loss that declares the need."""
    from reinforge.algo.advantage_estimators import ADVANTAGES
    from reinforge.algo.policy_losses import POLICY_LOSSES

    for field, registry in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES)):
        part = getattr(algo, field)
        needs = registry.needs(part)
        if not NEEDS & needs:
            continue
        s = part.settings
        try:
            beta = float(s.beta1) if NEED in needs else None
            return ValueSettings(int(s.value_samples), beta, bool(getattr(s, "skip_unsolved", True)),
                                 bool(getattr(s, "skip_solved", False)), float(getattr(s, "solved_reward", 1.0)))
        except AttributeError:
            raise ConfigError(f"algo.{field}={part} declares {', '.join(sorted(NEEDS & needs))} but its settings "
                              "give no value_samples (and beta1 for optimal_value)") from None
    raise ConfigError("algo: no part declares optimal_value or reference_value")


def prompt_values(c: Components) -> OptimalValues | None:
    """The run's prompt-value provider: ``OptimalValues`` over a rollout engine of the frozen reference
    model when a part needs ``optimal_value`` (None otherwise); the prompt-values stage
    (orchestrate/stages.py) restores its cache when a run resumes."""
    cfg = c.cfg
    if not needs_optimal_value(cfg.algo):
        return None
    ref = c.learner.ref_model
    if ref is None:
        raise ConfigError("a value per prompt (optimal_value, reference_value) samples the reference policy: it needs "
                          "a reference model (not with model.lora)")
    from reinforge.orchestrate.collectors import build_collector
    from reinforge.rollout.engines import build_engine

    # the torch engine over the frozen reference, whatever engine the policy samples with
    engine = build_engine(cfg.rollout.model_copy(update={"engine": "torch"}), ref, c.tokenizer, cfg.model.device,
                          cfg.seed, cfg.model.path)
    collector = build_collector(cfg.env, cfg.rollout, engine, c.make_env, c.reward_pool, c.model_context)
    return OptimalValues(collector, value_settings(cfg.algo), engine.generator, cfg.seed)
