"""The reference-rewards stage: the value of a reward term whose verifier declares ``reference_logp`` (RLPR's
probability reward, DRO's R3; rewards/reference_prob.py), from the policy, after rollout.

For every kept row (replayed ones included; not demonstrations), a single-turn episode: its reasoning (the
completion's text before its answer, ``reasoning_of``) is tokenised and put after the row's prompt tokens,
then the task's reference answer (``task.answer``, tokenised alone: ``answer_pieces``); the prompt followed
directly by the reference is the no-reasoning baseline, once per task. One teacher-forced pass of the rollout
engine's copy of the policy in the learner's process (``engine.model``: in synchronous RL the weights that
sampled the step, in asynchronous RL the latest published ones; without gradient, at the sampling
temperature; ``TeacherForcing``, shared with IGPO's answer probabilities) gives the log-probability
(and, for DRO's difficulty filter, the rank) of every reference token; distinct sequences are scored once.
Each term's value replaces the pool's placeholder (0) in ``metadata['reward_terms']`` and, times the term's
weight, in the row's ``reward`` (a replayed row's earlier value is replaced, not added to). The terms' group
filters (RLPR's std filter, DRO's difficulty and low-variation filters) then drop whole groups from ``kept``.

Why a stage and not the reward pool: a verifier scores text in CPU workers, without the policy. Why the
first stage after collection: the same trajectories are the step's ``sampled`` ones, so the budget, the
replay buffer, the task sampler and the step's metrics see the values set here. What reads rewards before
this stage (dynamic sampling, hints, greedy or reference-sample baselines, Monte Carlo state values,
in-group demonstrations) is refused with these terms (config/strategy_checks.py). State across steps:
RLPR's EMA of the group std, per term (``state.json`` key ``reference_rewards``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reinforge.orchestrate.answer_probs import TeacherForcing, needs_model, turn_starts
from reinforge.orchestrate.rollouts import Rollout
from reinforge.rewards.reference_prob import (
    R3Settings,
    RLPRSettings,
    StdThreshold,
    dro_drops,
    hardest_rank,
    mean_prob,
    r3_rewards,
    reasoning_of,
    reference_terms,
    rlpr_reward,
)
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory

PREFIX = "rollout/reference"


@dataclass
class Scored:
    """One row's teacher-forced reference: log-probs and ranks after its reasoning, and without it."""

    logp: list[float]
    ranks: list[int]
    base: list[float]
    reasoning_chars: int


class ReferenceRewardStage:
    """The values of the run's reference-probability terms (``reference_terms``) on the kept rows, and their
    group filters; RLPR's std EMA kept across steps."""

    name, key = "reference_rewards", "reference_rewards"
    reads = ("kept", "baseline")
    writes = ("kept", "baseline", "kept.reward", "kept.metadata.reward_terms")

    def __init__(self, engine: Any, terms: Sequence[Any], params: SamplingParams) -> None:
        needs_model(engine, f"reward: a term ({', '.join(t.verifier for t in terms)}) is the policy's likelihood of "
                            "the reference")
        self.engine, self.terms, self.params = engine, list(terms), params
        self.thresholds = {t.name: StdThreshold(t.settings.std_filter_beta, t.settings.std_ema_decay,
                                                t.settings.std_filter_warmup)
                           for t in self.terms if isinstance(t.settings, RLPRSettings) and t.settings.std_filter}
        self.ranks = any(isinstance(t.settings, R3Settings) and t.settings.difficulty_top_k for t in self.terms)

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        kept, baseline = rollout.kept, rollout.baseline
        rows = [t for t in kept if not t.demonstration]
        by_group: dict[int, list[int]] = {}
        for i, t in enumerate(rows):
            by_group.setdefault(t.group_id, []).append(i)
        groups = list(by_group.values())
        scored = self.score(rows, tasks)
        drops: dict[str, list[bool]] = {}
        for term in self.terms:
            values, drops[term.name] = self.term_values(term, scored, groups)
            for t, v in zip(rows, values, strict=True):
                terms = dict(t.metadata.get("reward_terms", {}))
                t.reward += term.weight * (v - terms.get(term.name, 0.0))
                t.metadata["reward_terms"] = {**terms, term.name: v}
        metrics: dict[str, float] = {}
        for name, threshold in self.thresholds.items():  # on the rows' whole rewards, every term in
            metrics[f"{PREFIX}/{name}/std_threshold"] = threshold.threshold() or 0.0
            drops[name] = threshold.drop([[rows[i].reward for i in g] for g in groups])
        dropped = set()
        for name, drop in drops.items():
            metrics[f"{PREFIX}/{name}/groups_dropped"] = float(sum(drop))
            dropped |= {rows[g[0]].group_id for g, d in zip(groups, drop, strict=True) if d}
        keep = [t.demonstration or t.group_id not in dropped for t in kept]
        rollout.kept = [t for t, k in zip(kept, keep, strict=True) if k]
        rollout.baseline = [b for b, k in zip(baseline, keep, strict=True) if k] if baseline is not None else None
        if scored:
            n = len(scored)
            metrics[f"{PREFIX}/prob_mean"] = sum(mean_prob(s.logp) for s in scored) / n
            metrics[f"{PREFIX}/base_prob_mean"] = sum(mean_prob(s.base) for s in scored) / n
            metrics[f"{PREFIX}/reasoning_chars_mean"] = sum(s.reasoning_chars for s in scored) / n
        metrics[f"{PREFIX}/time_s"] = time.perf_counter() - t0
        return metrics

    def score(self, rows: Sequence[Trajectory], tasks: Mapping[str, Task]) -> list[Scored]:
        """Every row's reference log-probs (and ranks) after its reasoning and without it, in one pass."""
        encode = self.engine.tokenizer.encode
        fallback = all(t.settings.number_fallback for t in self.terms)
        forced, where = TeacherForcing(self.engine, "{answer}"), []
        for t in rows:
            starts, task = turn_starts(t), tasks[t.task_id]
            prompt = t.token_ids[:starts[0]] if starts else list(t.token_ids)  # no generated token: all prompt
            reasoning = reasoning_of(t.completion_text, fallback)
            state = prompt + (encode(reasoning, add_special_tokens=False) if reasoning else [])
            where.append((forced.add(state, task), forced.add(prompt, task), len(reasoning)))
        if not forced:
            return []
        out = forced.run(self.params.temperature, ranks=self.ranks)
        return [Scored(out[i][0], out[i][1], out[b][0], n) for i, b, n in where]

    def term_values(self, term: Any, scored: Sequence[Scored], groups: Sequence[list[int]]
                    ) -> tuple[list[float], list[bool]]:
        """The term's value of every row, and which groups DRO's filters drop (RLPR's std filter acts on the
        whole rewards, in ``run``)."""
        cfg = term.settings
        if isinstance(cfg, RLPRSettings):
            return [rlpr_reward(s.logp, s.base if cfg.debias else None) for s in scored], [False] * len(groups)
        values = [0.0] * len(scored)
        max_sigma, hardest = [], []
        for g in groups:
            logp = torch.tensor([scored[i].logp for i in g], dtype=torch.float64)
            base = torch.tensor(scored[g[0]].base, dtype=torch.float64) if cfg.masked_baseline else None
            r3, sigma = r3_rewards(logp, base, cfg.weighting)
            for i, v in zip(g, r3.tolist(), strict=True):
                values[i] = v
            max_sigma.append(float(sigma.max()) if sigma.numel() else 0.0)
            hardest.append([hardest_rank(scored[i].ranks, cfg.difficulty_fraction) for i in g])
        return values, dro_drops(max_sigma, hardest, cfg)

    def state_dict(self) -> dict[str, Any]:
        return {name: th.state_dict() for name, th in self.thresholds.items()}

    def load_state_dict(self, state: Any) -> None:
        for name, th in self.thresholds.items():
            if name in state:
                th.load_state_dict(state[name])


def reference_reward_stage(reward: Any, task_verifier: str, engine: Any,
                           params: SamplingParams) -> ReferenceRewardStage | None:
    """The run's stage when a reward term's verifier declares ``reference_logp`` (None otherwise)."""
    terms = reference_terms(reward, task_verifier)
    return ReferenceRewardStage(engine, terms, params) if terms else None
