"""RePO's replay (Li et al. 2025, "RePO: Replay-Enhanced Policy Optimization", arXiv:2506.09340): a
per-prompt buffer of past trajectories mixed into each step's groups (``rollout.replay``).

Every sampled trajectory is kept, with its tokens, the sampling log-probs of the policy that drew
it (the behaviour policy mu), that policy's version and its reward, in a first-in-first-out buffer
per prompt (task id) of ``capacity`` samples. Each step, for every kept group whose prompt's buffer
holds at least ``min_to_replay`` samples, a *replay strategy* (a registered part, recipe key
``rollout.replay``) picks ``replays`` of them, chosen *before* the step's own samples join the
buffer (the authors' order); they enter the batch as trajectories of their own group (``split``,
the paper's separate advantage estimation: the next group ids after the step's own) or of the fresh
group (``mixed``). They keep their stored ``logprobs`` and ``version``, so the
off-policy machinery applies: RePO's own objective is the ``repo`` policy loss (the ratio
pi_theta / mu clipped, algo/policy_losses.py); ``algo.mismatch`` corrections see them as stale samples.
With ``until_step`` = S > 0 nothing is replayed from step S on (ReMix's policy reincarnation, Liang
et al. 2025, arXiv:2507.06892: mix-policy training first, on-policy training after).

Strategies (``fn(rewards, cfg, rng) -> indices``, over the buffer oldest first): ``recent`` (the
newest k), ``highest`` (the k highest rewards, newest first among ties), ``random`` (k uniformly,
seeded by run seed, step and prompt), ``max_variance`` (the k-subset of largest reward variance,
larger reward sum on ties), ``all`` (the whole buffer). The buffer is saved in checkpoints
(``state.json``, key ``replay``), so a resumed run replays what the uninterrupted one would have.
"""

from __future__ import annotations

import random
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from reinforge.registry import Registry, Settings, kind
from reinforge.types import Trajectory

REPO_PAPER = "RePO, Li et al. 2025, arXiv:2506.09340"


class ReplaySettings(Settings):
    """The buffer and how many past samples join each group (the authors' script: 16, 8, 16, split)."""

    capacity: int = Field(16, ge=1, description="samples kept per prompt, oldest evicted first (max_cache_size)")
    replays: int = Field(8, ge=1, description="past samples added to each group (num_replays; all: every one)")
    min_to_replay: int = Field(16, ge=1, description="replay a prompt only when its buffer holds this many samples")
    groups: Literal["split", "mixed"] = Field(
        "split", description="split: replayed samples are a group of their own (advantages apart, the paper's); "
        "mixed: they join the fresh group")
    max_prompts: int = Field(0, ge=0, description="prompts kept; the least recently sampled is evicted (0 = all)")
    until_step: int = Field(0, ge=0, description="replay only at steps below this one, then train on fresh samples "
                            "alone (ReMix's policy reincarnation, the switch back to on-policy; 0 = always replay)")

    @model_validator(mode="after")
    def _reachable(self) -> ReplaySettings:
        if self.min_to_replay > self.capacity:
            raise ValueError(f"min_to_replay ({self.min_to_replay}) > capacity ({self.capacity}): nothing would "
                             "ever be replayed")
        return self


StrategyFn = Callable[..., list[int]]
REPLAY_STRATEGIES: Registry[StrategyFn] = kind("replay", Registry("replay strategy"))


@REPLAY_STRATEGIES.register("recent", formula="S(B_x) = the k newest samples of x", paper=REPO_PAPER,
                            settings=ReplaySettings)
def recent(rewards: Sequence[float], cfg: ReplaySettings) -> list[int]:
    """The ``replays`` newest samples (the buffer is oldest first)."""
    n = len(rewards)
    return list(range(max(n - cfg.replays, 0), n))


@REPLAY_STRATEGIES.register("highest", formula="S(B_x) = the k samples of x with the highest rewards",
                            paper=REPO_PAPER, settings=ReplaySettings)
def highest(rewards: Sequence[float], cfg: ReplaySettings) -> list[int]:
    """The ``replays`` highest rewards; among equal rewards the newer first."""
    order = sorted(range(len(rewards)), key=lambda i: (-rewards[i], -i))
    return sorted(order[:cfg.replays])


@REPLAY_STRATEGIES.register("random", formula="S(B_x) = k samples of x uniformly without replacement",
                            paper=REPO_PAPER, settings=ReplaySettings)
def uniform(rewards: Sequence[float], cfg: ReplaySettings, rng: random.Random) -> list[int]:
    """``replays`` samples drawn uniformly without replacement."""
    return sorted(rng.sample(range(len(rewards)), min(cfg.replays, len(rewards))))


@REPLAY_STRATEGIES.register("max_variance", formula="S(B_x) = argmax_{|S| = k} Var(r_S) (then the larger sum)",
                            paper=REPO_PAPER, settings=ReplaySettings)
def max_variance(rewards: Sequence[float], cfg: ReplaySettings) -> list[int]:
    """The k-subset whose rewards have the largest (population) variance, the larger sum on ties. A
    maximal-variance subset is always the j largest and k - j smallest rewards for some j (moving an
    inner value outwards never lowers the spread), so j = 0..k are tried instead of every subset;
    among equal rewards the newer samples are taken."""
    k = min(cfg.replays, len(rewards))
    order = sorted(range(len(rewards)), key=lambda i: (-rewards[i], -i))  # high first, newer first
    low_order = sorted(range(len(rewards)), key=lambda i: (rewards[i], -i))  # low first, newer first
    best: tuple[float, float] | None = None
    chosen: list[int] = []
    for j in range(k + 1):
        top = order[:j]
        rest = [i for i in low_order if i not in top][:k - j]
        subset = top + rest
        values = [rewards[i] for i in subset]
        mean = sum(values) / k
        key = (round(sum((v - mean) ** 2 for v in values) / k, 12), sum(values))
        if best is None or key > best:
            best, chosen = key, subset
    return sorted(chosen)


@REPLAY_STRATEGIES.register("all", formula="S(B_x) = B_x", paper=REPO_PAPER, settings=ReplaySettings)
def everything(rewards: Sequence[float]) -> list[int]:
    """The whole buffer of the prompt."""
    return list(range(len(rewards)))


@dataclass
class _Inputs:
    rewards: Sequence[float]
    rng: random.Random


def _record(t: Trajectory, step: int) -> list[Any]:
    """What the buffer keeps of a trajectory (plain JSON for ``state.json``)."""
    return [list(t.token_ids), list(t.loss_mask), list(t.logprobs), t.version, list(t.token_versions), t.reward,
            t.finish_reason, t.completion_text, bool(t.metadata.get("correct", t.reward > 0)), step,
            [list(s) for s in t.turn_spans], list(t.turn_rewards)]


def _replayed(record: list[Any], group_id: int, task_id: str, step: int) -> Trajectory:
    ids, mask, logp, version, versions, reward, finish, text, correct, seen, spans, turn_rewards = record
    return Trajectory(list(ids), list(mask), list(logp), int(version), group_id, task_id, reward=float(reward),
                      turn_rewards=list(turn_rewards), finish_reason=finish, completion_text=text,
                      metadata={"correct": bool(correct), "replayed": True, "replay_age": step - int(seen)},
                      token_versions=list(versions), turn_spans=[tuple(s) for s in spans])


class ReplayBuffer:
    """Per-prompt FIFO buffers and the strategy ``name`` that picks what each group replays."""

    def __init__(self, name: str, settings: ReplaySettings | None = None, seed: int = 0) -> None:
        REPLAY_STRATEGIES.entry(name)  # unknown: a ConfigError naming the allowed ones
        self.name, self.cfg, self.seed = name, settings or ReplaySettings(), seed
        self.buffers: OrderedDict[str, list[list[Any]]] = OrderedDict()  # least recently sampled first
        self.last: dict[str, float] = {}

    def select(self, task_id: str, step: int) -> list[list[Any]]:
        """The records the strategy replays for one group of ``task_id`` at ``step`` (none below the minimum)."""
        buf = self.buffers.get(task_id, [])
        if len(buf) < self.cfg.min_to_replay or 0 < self.cfg.until_step <= step:
            return []
        rng = random.Random(zlib.crc32(f"{self.seed}:{step}:{task_id}".encode()))
        rewards = [float(r[5]) for r in buf]
        return [buf[i] for i in REPLAY_STRATEGIES.call(self.name, _Inputs(rewards, rng), self.cfg)]

    def mix(self, kept: list[Trajectory], step: int, next_group: int) -> list[Trajectory]:
        """The replayed trajectories for the fresh groups of ``kept`` (each group once, in order); split
        groups take the ids ``next_group``, ``next_group`` + 1, ..."""
        out: list[Trajectory] = []
        seen: set[int] = set()
        for t in kept:
            if t.demonstration or t.group_id in seen or t.metadata.get("replayed"):
                continue
            seen.add(t.group_id)
            chosen = self.select(t.task_id, step)
            gid = next_group if self.cfg.groups == "split" else t.group_id
            next_group += bool(chosen) and self.cfg.groups == "split"
            out += [_replayed(r, gid, t.task_id, step) for r in chosen]
        ages = [t.metadata["replay_age"] for t in out]
        self.last = {"replay/samples": float(len(out)), "replay/groups": float(len({t.group_id for t in out})),
                     "replay/age_mean": sum(ages) / len(ages) if ages else 0.0,
                     "replay/reward_mean": sum(t.reward for t in out) / len(out) if out else 0.0}
        return out

    def add(self, sampled: Sequence[Trajectory], step: int) -> None:
        """The step's own samples join their prompts' buffers (oldest evicted beyond ``capacity``)."""
        for t in sampled:
            if t.demonstration or t.metadata.get("replayed"):
                continue
            buf = self.buffers.pop(t.task_id, [])
            self.buffers[t.task_id] = (buf + [_record(t, step)])[-self.cfg.capacity:]
        while self.cfg.max_prompts and len(self.buffers) > self.cfg.max_prompts:
            self.buffers.popitem(last=False)

    def metrics(self) -> dict[str, float]:
        return {**self.last, "replay/buffer_prompts": float(len(self.buffers)),
                "replay/buffer_samples": float(sum(len(b) for b in self.buffers.values()))}

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": [[k, v] for k, v in self.buffers.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffers = OrderedDict((k, [list(r) for r in v]) for k, v in state["buffers"])
