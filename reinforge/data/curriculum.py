"""Task samplers that learn from the run: online difficulty filtering and DUMP's distribution-level UCB.

Each keeps ``PromptStats`` (reinforge/data/prompt_stats.py) and draws only from counters and seeds
(no hidden random state), so ``state_dict`` (JSON, saved in checkpoints) restores exactly what the
uninterrupted run would have drawn next. ``metrics()`` adds ``sampler/...`` keys to the step's record.

Asynchronous RL (``orchestrate.mode: async``) draws a step's tasks up to ``max_staleness`` steps before
the loop observes the previous steps' groups: these samplers then decide on statistics that are that
many steps old (a filtered prompt may be drawn once more before its verdict arrives; DUMP's bucket
probabilities lag by the same amount). Nothing else changes: ``observe`` still sees every group once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from reinforge.data.base import TaskSampler
from reinforge.data.prompt_stats import GroupOutcome, PromptStats
from reinforge.data.samplers import TASK_SAMPLERS
from reinforge.registry import Settings
from reinforge.types import Task


class StatsSampler:
    """Base of the samplers here: the tasks, the seed, the settings and the run's ``PromptStats``."""

    def __init__(self, tasks: Sequence[Task], seed: int, cfg: Any, history: int = 8) -> None:
        if len(tasks) == 0:
            raise ValueError("cannot sample from an empty task split")
        self.tasks, self.seed, self.cfg = tasks, seed, cfg
        self.stats = PromptStats(history=history)  # the last `history` group outcomes of each prompt
        self.draws = 0  # next_batch calls so far: the key of each draw's random stream

    def observe(self, trajectories: Sequence[Any]) -> None:
        self.learn(self.stats.update(trajectories))

    def learn(self, groups: list[GroupOutcome]) -> None:
        """A sampler's own use of the step's groups (none by default)."""

    def metrics(self) -> dict[str, float]:
        return self.stats.metrics()

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "draws": self.draws, "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.draws = int(state["seed"]), int(state["draws"])
        self.stats.load_state_dict(state["stats"])


# ---------------------------------------------------------------------------------------- filtering
class FilterSettings(Settings):
    window: int = Field(1, ge=1, le=64, description="a prompt is skipped once its last `window` groups were all "
                        "right (or all wrong) the same way")
    recheck_after: int = Field(2, ge=1, description="a skipped prompt is drawn again (re-checked) this many "
                               "`recheck_unit`s after it was last drawn")
    recheck_unit: Literal["epochs", "steps"] = Field("epochs", description="epochs: passes over the split; steps: "
                                                     "RL steps since the prompt's last group was observed")
    skip_solved: bool = Field(True, description="skip prompts whose groups were all right")
    skip_unsolved: bool = Field(True, description="skip prompts whose groups were all wrong")


@TASK_SAMPLERS.register(
    "difficulty_filter",
    formula="skip x while its last w groups were all correct (or all wrong), re-check it after "
            "recheck_after epochs or steps",
    paper="2506.02177", settings=FilterSettings)
class DifficultyFilterSampler(StatsSampler):
    """Uniform epochs over the split (``TaskSampler``) that skip prompts DAPO's dynamic sampling would
    drop (arXiv:2503.14476: groups whose samples are all right or all wrong carry no GRPO gradient)
    *before* they are sampled, from their own recent history: GRESO's pre-rollout filter
    (arXiv:2506.02177), with a deterministic re-check instead of GRESO's skip probability
    (a prompt skipped because of its last ``window`` groups is drawn again ``recheck_after`` epochs or
    steps later; its next group decides whether it stays skipped). When every remaining prompt of a
    whole pass would be skipped, they are drawn anyway (the run never stalls)."""

    def __init__(self, tasks: Sequence[Task], seed: int, cfg: FilterSettings | None = None) -> None:
        cfg = cfg or FilterSettings()
        super().__init__(tasks, seed, cfg, history=max(8, cfg.window))
        self.order = TaskSampler(tasks, seed)
        self.drawn_epoch: dict[str, int] = {}  # the epoch each prompt was last drawn in
        self.skipped = 0  # prompts skipped since the last metrics() call

    def _skip(self, task_id: str) -> bool:
        cfg, r = self.cfg, self.stats.get(task_id)
        if r is None or self.stats.zero_spread_streak(task_id) < cfg.window:
            return False
        if not (cfg.skip_solved if r.recent[-1] > 0 else cfg.skip_unsolved):
            return False
        since = (self.order.epoch - self.drawn_epoch.get(task_id, -10**9) if cfg.recheck_unit == "epochs"
                 else self.stats.step - r.last_step)
        return since < cfg.recheck_after

    def next_batch(self, n: int) -> list[Task]:
        self.draws += 1
        out: list[Task] = []
        run = 0  # consecutive skips: a whole split of them means everything left is filtered
        while len(out) < n:
            task = self.order.next_batch(1)[0]
            if run < len(self.tasks) and self._skip(task.id):
                run += 1
                self.skipped += 1
                continue
            run = 0
            self.drawn_epoch[task.id] = self.order.epoch
            out.append(task)
        return out

    def filtered(self) -> int:
        """Prompts that would be skipped if drawn now."""
        return sum(self._skip(k) for k in self.stats.records)

    def metrics(self) -> dict[str, float]:
        out = {**super().metrics(), "sampler/skipped": float(self.skipped), "sampler/filtered": float(self.filtered())}
        self.skipped = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "order": self.order.state_dict(), "drawn_epoch": dict(self.drawn_epoch),
                "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.order.load_state_dict(state["order"])
        self.drawn_epoch = {k: int(v) for k, v in state["drawn_epoch"].items()}
        self.skipped = int(state["skipped"])


# ---------------------------------------------------------------------------------------- DUMP
class DumpSettings(Settings):
    bucket_key: str = Field("source", min_length=1, description="Task.metadata key whose value names a task's "
                            "distribution (bucket), e.g. source or difficulty; tasks without it share one bucket")
    window: int = Field(300, ge=1, description="recent |advantage| values kept per bucket (the paper's sliding window)")
    exploration: float = Field(1.0, ge=0, description="c, the weight of the UCB exploration bonus")
    temperature: float = Field(0.1, gt=0, description="tau of the softmax over the buckets' UCB scores")
    scale_by_std: bool = Field(True, description="GRPO's advantage (divided by the group's std); false: r - mean")
    adv_eps: float = Field(1e-6, gt=0, description="epsilon added to the group std")


def group_abs_advantages(rewards: Sequence[float], scale_by_std: bool, eps: float) -> list[float]:
    """|A_i| of GRPO's outcome advantage A_i = (r_i - mean) / (std + eps), unbiased std (0 for one sample)."""
    r = np.asarray(rewards, dtype=np.float64)
    adv = r - r.mean()
    if scale_by_std:
        adv = adv / ((r.std(ddof=1) if len(r) > 1 else 0.0) + eps)
    return [float(x) for x in np.abs(adv)]


def ucb_scores(abs_adv_means: np.ndarray, counts: np.ndarray, c: float) -> np.ndarray:
    """UCB_j = mean_window|A|_j + c * sqrt(2 ln(sum_k n_k + 1) / (n_j + 1))."""
    return abs_adv_means + c * np.sqrt(2 * math.log(counts.sum() + 1) / (counts + 1))


def softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    z = np.exp((x - x.max()) / temperature)
    return z / z.sum()


UNLABELLED = "-"  # the bucket of tasks whose metadata lacks the bucket key


@TASK_SAMPLERS.register(
    "dump",
    formula="P(d_j) = softmax_j(UCB_j / tau), UCB_j = mean_window|A|_j + c * sqrt(2 ln(sum_k n_k + 1) / (n_j + 1))",
    paper="2504.09710", settings=DumpSettings)
class DumpSampler(StatsSampler):
    """DUMP (Wang et al. 2025, arXiv:2504.09710): a bandit over data distributions (buckets of
    ``Task.metadata[bucket_key]``). A bucket's learnability is the expected absolute advantage of its
    recent samples (a sliding window of ``window`` values); UCB adds an exploration bonus for buckets
    sampled less (``n_j`` samples observed from bucket j); a softmax with temperature ``tau`` turns
    the scores into the probability of drawing each batch slot from that bucket; within a bucket tasks
    are drawn without replacement, reshuffled every pass. Defaults as the authors' code (window 300,
    c = 1, tau = 0.1, the +1 in both counts of the bonus).

    Choice: the sampler sees trajectories before the learner computes advantages, so it recomputes
    GRPO's outcome advantage from each group's rewards (what the paper uses: GRPO); with another
    advantage estimator it is still this GRPO signal. Buckets are the sorted distinct values."""

    def __init__(self, tasks: Sequence[Task], seed: int, cfg: DumpSettings | None = None) -> None:
        super().__init__(tasks, seed, cfg or DumpSettings())
        labels = [str(t.metadata.get(self.cfg.bucket_key, UNLABELLED)) for t in tasks]
        self.buckets = sorted(set(labels))
        index = {b: j for j, b in enumerate(self.buckets)}
        self.bucket_of = {t.id: index[b] for t, b in zip(tasks, labels, strict=True)}
        members: list[list[int]] = [[] for _ in self.buckets]
        for i, b in enumerate(labels):
            members[index[b]].append(i)
        self.members = [np.asarray(m) for m in members]
        self.positions = [[0, 0] for _ in self.buckets]  # (epoch, position) of each bucket's own shuffle
        self.windows: list[list[float]] = [[] for _ in self.buckets]
        self.counts = np.zeros(len(self.buckets), dtype=np.int64)
        self.last_probs = np.full(len(self.buckets), 1 / len(self.buckets))

    def probabilities(self) -> np.ndarray:
        means = np.array([np.mean(w) if w else 0.0 for w in self.windows])
        return softmax(ucb_scores(means, self.counts, self.cfg.exploration), self.cfg.temperature)

    def _next_in(self, j: int) -> Task:
        epoch, pos = self.positions[j]
        if pos == len(self.members[j]):
            epoch, pos = epoch + 1, 0
        order = np.random.default_rng([self.seed, j, epoch]).permutation(len(self.members[j]))
        self.positions[j] = [epoch, pos + 1]
        return self.tasks[int(self.members[j][order[pos]])]

    def next_batch(self, n: int) -> list[Task]:
        self.draws += 1
        self.last_probs = self.probabilities()
        slots = np.random.default_rng([self.seed, 7, self.draws]).choice(len(self.buckets), size=n,
                                                                         p=self.last_probs)
        return [self._next_in(int(j)) for j in slots]

    def learn(self, groups: list[GroupOutcome]) -> None:
        for g in groups:
            j = self.bucket_of.get(g.task_id)
            if j is None:
                continue
            values = group_abs_advantages(g.rewards, self.cfg.scale_by_std, self.cfg.adv_eps)
            self.windows[j] = (self.windows[j] + values)[-self.cfg.window:]
            self.counts[j] += len(values)

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        for j, b in enumerate(self.buckets):
            out[f"sampler/bucket_prob/{b}"] = float(self.last_probs[j])
            out[f"sampler/bucket_abs_adv/{b}"] = float(np.mean(self.windows[j])) if self.windows[j] else 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "buckets": self.buckets, "positions": self.positions,
                "windows": self.windows, "counts": [int(c) for c in self.counts],
                "last_probs": [float(p) for p in self.last_probs]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if list(state["buckets"]) != self.buckets:
            raise ValueError(f"checkpoint's buckets {state['buckets']} differ from the split's {self.buckets}")
        self.positions = [[int(e), int(p)] for e, p in state["positions"]]
        self.windows = [[float(x) for x in w] for w in state["windows"]]
        self.counts = np.asarray(state["counts"], dtype=np.int64)
        self.last_probs = np.asarray(state["last_probs"], dtype=np.float64)
