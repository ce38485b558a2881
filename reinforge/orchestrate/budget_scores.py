"""AnytimeReasoner's dense rewards over thinking budgets, for a part that declares the need
``budget_scores`` (the ``brpo`` estimator, algo/brpo.py; Qi et al. 2025, arXiv:2505.13438; MRT's
progress, algo/mrt.py, reads the same scores).

After a step's rollout, every kept single-turn row (replayed ones included; not demonstrations) is cut
after b_s = max(1, round(f_s * rollout.max_new_tokens)) generated tokens for each of the estimator's
``budgets`` f_s (b_s = 0 for f_s = 0: the prompt alone), and the answer at each cut is scored by the
run's reward pool:

- ``summary_tokens = 0``: the answer is the cut response itself (its decoded first b_s tokens; e.g. the
  last number written so far, under ``numeric_match``), for models that write no separate summary;
- ``summary_tokens > 0``: the policy samples a summary of at most that many tokens after the cut and
  ``summary_suffix`` (AnytimeReasoner's summary policy; one summary per cut), and the whole text is scored.

A row that ended within a budget is scored on its whole completion at that budget (the paper: thinking
that finished early keeps its own answer). Each row gets ``metadata['budget_scores']`` (r_{i,s}) and
``metadata['budget_ends']`` (min(b_s, its length)); the producer below writes the batch fields
``budget_scores`` / ``budget_ends`` [N, S] (a row without them: its reward at every budget, ends at the
batch width). Recomputed every step; nothing kept across steps. The summaries are not trained on
(AnytimeReasoner also optimises the summary policy, with GRPO over each budget's summaries: not built).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from reinforge.algo.brpo import ENDS, FIELD, BudgetCutSettings
from reinforge.algo.objective import required_inputs
from reinforge.config import AlgoConfig
from reinforge.errors import ConfigError
from reinforge.orchestrate.batch_fields import produces
from reinforge.orchestrate.rollouts import KeptRowsStage
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.types import Task, Trajectory

PREFIX = "rollout/budget_scores"


def budget_tokens(cfg: BudgetCutSettings, max_new_tokens: int) -> list[int]:
    """b_s = max(1, round(f_s * max_new_tokens)), 0 for f_s = 0 (the prompt alone)."""
    return [max(1, round(f * max_new_tokens)) if f > 0 else 0 for f in cfg.budgets]


class BudgetScores:
    """The stage's work: ``__call__(tasks, trajectories, params)`` writes each row's per-budget scores and
    returns the step's counters (``rollout/budget_scores/*``: the mean score at each budget)."""

    def __init__(self, collector: Any, cfg: BudgetCutSettings) -> None:
        if not hasattr(collector, "continue_states") or not hasattr(collector, "pool"):  # single-turn collectors
            raise ConfigError("algo.advantage: the answers at thinking budgets (budget_scores) cut single-turn "
                              f"completions; the {type(collector).__name__} collector cannot (env.name=single_turn)")
        self.collector, self.cfg = collector, cfg

    def __call__(self, tasks: Mapping[str, Task], trajectories: Sequence[Trajectory],
                 params: SamplingParams) -> dict[str, float]:
        rows = [t for t in trajectories if not t.demonstration and 1 in t.loss_mask]
        if not rows:
            return {}
        t0, budgets = time.perf_counter(), budget_tokens(self.cfg, params.max_new_tokens)
        cuts = []  # (row, budget index, generated tokens before the cut) of every cut inside a row
        for i, t in enumerate(rows):
            n = len(t.token_ids) - t.loss_mask.index(1)
            t.metadata[ENDS] = [min(b, n) for b in budgets]
            t.metadata[FIELD] = [None] * len(budgets)
            cuts += [(i, s, e) for s, e in enumerate(t.metadata[ENDS]) if e < n]
        whole = self.collector.pool.score([tasks[t.task_id] for t in rows], [t.completion_text for t in rows])
        cut_scores = self._score_cuts(tasks, rows, cuts, params)
        for (i, s, _), r in zip(cuts, cut_scores, strict=True):
            rows[i].metadata[FIELD][s] = r
        for t, outcome in zip(rows, whole, strict=True):
            t.metadata[FIELD] = [outcome.reward if r is None else r for r in t.metadata[FIELD]]
        means = [sum(t.metadata[FIELD][s] for t in rows) / len(rows) for s in range(len(budgets))]
        return {**{f"{PREFIX}/b{s + 1}": m for s, m in enumerate(means)},
                f"{PREFIX}/cuts": float(len(cuts)), f"{PREFIX}/time_s": time.perf_counter() - t0}

    def _score_cuts(self, tasks: Mapping[str, Task], rows: list[Trajectory], cuts: list[tuple[int, int, int]],
                    params: SamplingParams) -> list[float]:
        if not cuts:
            return []
        tokenizer = self.collector.engine.tokenizer
        starts = [t.loss_mask.index(1) for t in rows]
        prefixes = [rows[i].token_ids[starts[i]: starts[i] + e] for i, _, e in cuts]
        cut_tasks = [tasks[rows[i].task_id] for i, _, _ in cuts]
        if self.cfg.summary_tokens == 0:
            texts = [tokenizer.decode(p, skip_special_tokens=True) for p in prefixes]
            return [o.reward for o in self.collector.pool.score(cut_tasks, texts)]
        suffix = list(tokenizer(self.cfg.summary_suffix, add_special_tokens=False)["input_ids"])
        asked = [p + suffix for p in prefixes]
        requests = [GenerationRequest(rows[i].token_ids[: starts[i]] + a, str(k))
                    for k, ((i, _, _), a) in enumerate(zip(cuts, asked, strict=True))]
        gens = self.collector.engine.generate(
            requests, dataclasses.replace(params, n=1, greedy=False, max_new_tokens=self.cfg.summary_tokens))
        texts = [tokenizer.decode(a + g.token_ids, skip_special_tokens=True) for a, g in zip(asked, gens, strict=True)]
        return [o.reward for o in self.collector.pool.score(cut_tasks, texts)]


class BudgetScoreStage(KeptRowsStage):
    """r_{i,s} of every kept row (``budget_scores``), from the current policy; nothing kept across steps."""

    name, writes = "budget_scores", ("kept.metadata.budget_scores", "kept.metadata.budget_ends")


def budget_score_stage(algo: Any, collector: Any, params: SamplingParams) -> BudgetScoreStage | None:
    """The run's stage when a part declares ``budget_scores`` (None otherwise), with the estimator's settings."""
    if FIELD not in required_inputs(algo):
        return None
    cfg = algo.advantage.settings
    if not isinstance(cfg, BudgetCutSettings):
        raise ConfigError(f"algo.advantage={algo.advantage} declares {FIELD} but its settings give no budget cuts")
    return BudgetScoreStage(BudgetScores(collector, cfg), params)


@produces(FIELD, ENDS)
def _budget_scores(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    s_count = len(getattr(algo.advantage.settings, "budgets", [1.0]))
    scores = torch.tensor([t.metadata.get(FIELD) or [t.reward] * s_count for t in kept], dtype=torch.float64)
    ends = torch.tensor([t.metadata.get(ENDS) or [width] * s_count for t in kept], dtype=torch.int64)
    return scores.reshape(len(kept), s_count), ends.reshape(len(kept), s_count)
