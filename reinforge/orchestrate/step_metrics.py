"""What a step reports about its rollout: reward, response, group and episode statistics, every rank's
trajectories gathered on rank 0, and the warning when the policy has collapsed (docs/metrics.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

from reinforge.learn import distributed
from reinforge.orchestrate.episodes import BatchStats
from reinforge.orchestrate.roles import role_metrics
from reinforge.rewards.composite import judge_metrics
from reinforge.types import Trajectory

COLLAPSE_PATIENCE = 5  # steps in a row with no reward spread in any group before we warn


def gather_step(trajs: list[Trajectory], bstats: BatchStats, adv: Any) -> tuple[list[Trajectory], BatchStats,
                                                                                  Any] | None:
    """Every rank's trajectories, batch counts and advantages (a tensor or None) on rank 0; None on
    the other ranks."""
    import torch

    parts = distributed.gather_object((trajs, bstats, adv))
    if parts is None:
        return None
    advs = [a for _, _, a in parts if a is not None]
    return ([t for p, _, _ in parts for t in p],
            BatchStats(*(sum(getattr(s, f.name) for _, s, _ in parts) for f in dataclasses.fields(BatchStats))),
            torch.cat(advs) if advs else None)


class CollapseDetector:
    """Says so (once) when no group has had any reward spread for ``patience`` steps in a row while
    the mean reward is below 1: every advantage is then 0, there is no gradient, and a collapsed
    policy cannot recover by itself."""

    def __init__(self, patience: int = COLLAPSE_PATIENCE, active: bool = True) -> None:
        self.patience, self.flat_steps, self.warned = patience, 0, not active  # groups of 1 never have spread

    def update(self, metrics: dict[str, Any]) -> str | None:
        if "reward/mean" not in metrics:  # nothing was sampled this step (all dropped as stale)
            return None
        flat = metrics["groups/spread_frac"] == 0 and metrics["reward/mean"] < 1.0
        self.flat_steps = self.flat_steps + 1 if flat else 0
        if self.flat_steps < self.patience or self.warned:
            return None
        self.warned = True
        return (
            f"step {metrics['step']}: no group has had any reward spread for {self.flat_steps} steps "
            f"(mean reward {metrics['reward/mean']:.3f}): there is no gradient and the policy has likely "
            "collapsed. Lower train.lr, raise rollout.temperature, or add algo.kl.coef."
        )


class TruncationDetector:
    """Says so (once) when at least ``share`` of the completions were cut at ``rollout.max_new_tokens`` for
    ``patience`` steps in a row: the answers do not fit the token limit (e.g. the default recipe's 8 tokens,
    sized for 2-digit addition, carried over to a task with longer answers)."""

    def __init__(self, max_new_tokens: int, patience: int = COLLAPSE_PATIENCE, share: float = 0.9) -> None:
        self.max_new_tokens, self.patience, self.share = max_new_tokens, patience, share
        self.cut_steps, self.warned = 0, False

    def update(self, metrics: dict[str, Any]) -> str | None:
        if "response/truncated_frac" not in metrics:
            return None
        cut = metrics["response/truncated_frac"] >= self.share
        self.cut_steps = self.cut_steps + 1 if cut else 0
        if self.cut_steps < self.patience or self.warned:
            return None
        self.warned = True
        return (f"step {metrics['step']}: {metrics['response/truncated_frac']:.0%} of the completions hit "
                f"rollout.max_new_tokens={self.max_new_tokens} for {self.cut_steps} steps in a row: the answers are "
                "cut before they end. Raise rollout.max_new_tokens for this task.")


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    n = len(trajs)
    if n == 0:  # e.g. every group of an async batch was too stale
        return {"rollout/trajectories": 0.0}
    ended = [t for t in trajs if not t.continues]  # a window that continues (T-PPO) has no reward yet
    return {
        **reward_metrics(ended),
        "response/length_mean": sum(t.num_generated for t in trajs) / n,
        "response/truncated_frac": sum(t.finish_reason == "length" and not t.continues for t in trajs) / n,
        **episode_metrics(trajs),
    }


def reward_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Reward statistics of the scored trajectories (none: no keys)."""
    n = len(trajs)
    if n == 0:
        return {}
    rewards = [t.reward for t in trajs]
    mean = sum(rewards) / n
    terms: dict[str, list[float]] = {}
    term_errors: dict[str, int] = {}
    for t in trajs:
        for name, value in t.metadata.get("reward_terms", {}).items():
            terms.setdefault(name, []).append(value)
            term_errors[name] = term_errors.get(name, 0) + (name in t.metadata.get("reward_term_errors", {}))
    return {
        **{f"reward/term/{name}": sum(v) / len(v) for name, v in terms.items()},
        **{f"reward/errors/{name}": float(n) for name, n in term_errors.items()},
        **judge_metrics(t.metadata.get("reward_term_stats", {}) for t in trajs),
        "reward/failed_calls": float(sum(t.metadata.get("reward_status", "ok") != "ok" for t in trajs)),
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / max(n - 1, 1)) ** 0.5,
        "reward/accuracy": sum(bool(t.metadata.get("correct")) for t in trajs) / n,
    }


EPISODE_INFO_KEYS = ("tool_calls", "tool_errors", "guesses", "attempts")


def episode_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Multi-turn episodes: mean turns, the fraction cut by each limit, the mean of the numeric
    counters environments report (tool calls and errors, guesses, attempts) and each role's metrics
    (orchestrate/roles.py)."""
    if not any(t.turn_spans for t in trajs):
        return {}
    n = len(trajs)
    out = {"episode/turns_mean": sum(len(t.turn_spans) for t in trajs) / n}
    for reason in ("max_turns", "max_total_tokens"):
        out[f"episode/truncated/{reason}"] = sum(t.metadata.get("truncated") == reason for t in trajs) / n
    for key in EPISODE_INFO_KEYS:
        values = [t.metadata[key] for t in trajs if isinstance(t.metadata.get(key), int | float)]
        if values:
            out[f"episode/{key}_mean"] = sum(values) / len(values)
    return {**out, **role_metrics(trajs)}


def step_record(step: int, version: int, rollout, bstats: BatchStats, adv: Any, train: dict[str, float],
                clock: tuple[float, float, float], peak: float | None) -> dict[str, Any]:
    """The metrics line of one step (docs/metrics.md): ``rollout`` is the step's ``Rollout`` (its
    ``sampled`` trajectories every rank's), ``adv`` the masked advantages (a tensor or None), ``clock``
    the times at the start, after the rollout and after the update."""
    from reinforge.orchestrate.episodes import groups_with_spread

    trajs, (t_start, t_gen, t_end) = rollout.sampled, clock
    n_groups = max(len({t.group_id for t in trajs}), 1)
    generated = sum(t.num_generated for t in trajs)
    generate_s = t_gen - t_start - rollout.reward_s - rollout.env_s
    metrics: dict[str, Any] = {"step": step, "policy_version": version}
    if peak is not None:
        metrics["memory/peak_mb"] = peak
    metrics.update(rollout_metrics(trajs))
    metrics.update({f"train/{k}": v for k, v in train.items()})
    metrics.update({
        "groups/spread_frac": len(groups_with_spread(trajs)) / n_groups,
        "groups/kept_frac": bstats.groups_kept / n_groups,
        "batch/sequences": bstats.sequences_kept,
        "rollout/rounds": rollout.rounds,
        "rollout/sampled": float(len(trajs)),
        "time/generate_s": generate_s,
        "time/reward_s": rollout.reward_s,
        "time/env_s": rollout.env_s,
        "time/train_s": t_end - t_gen,
        "time/step_s": t_end - t_start,
        "perf/tokens_per_s": generated / max(t_end - t_start, 1e-9),
        "perf/gen_tokens_per_s": generated / max(generate_s, 1e-9),
    })
    metrics.update(token_metrics(trajs, rollout.tokens_reused, generate_s))
    if adv is not None and adv.numel():
        metrics.update({"adv/mean": adv.mean().item(), "adv/std": adv.std().item() if adv.numel() > 1 else 0.0,
                        "adv/abs_mean": adv.abs().mean().item()})
    metrics.update(rollout.metrics)
    return metrics


def token_metrics(trajs: list[Trajectory], reused_elsewhere: int, generate_s: float) -> dict[str, float]:
    """Tokens the step decoded and tokens it reused instead: a sample's own ``metadata['tokens_reused']``
    (a group sampler's reused prefix or tree segment) plus ``reused_elsewhere`` (the source's, e.g.
    replayed samples); the seconds saved at this step's decode rate; the samples per group (budget)."""
    fresh = [t for t in trajs if not t.demonstration]
    in_samples = sum(int(t.metadata.get("tokens_reused", 0)) for t in fresh)
    decoded = sum(t.num_generated for t in fresh) - in_samples
    reused = in_samples + reused_elsewhere
    sizes: dict[int, int] = {}
    for t in fresh:
        sizes[t.group_id] = sizes.get(t.group_id, 0) + 1
    per_group = list(sizes.values()) or [0]
    return {"rollout/tokens_generated": float(decoded), "rollout/tokens_reused": float(reused),
            "rollout/gen_time_saved_s": reused * generate_s / max(decoded, 1),
            "rollout/budget_min": float(min(per_group)), "rollout/budget_max": float(max(per_group)),
            "rollout/budget_mean": sum(per_group) / len(per_group)}


def time_limit_metrics(steps_planned: int) -> dict[str, float]:
    """The record of the step at which ``train.time_limit_s`` stopped the run before its last step."""
    return {"run/stopped_by_time_limit": 1.0, "run/steps_planned": float(steps_planned)}


def time_limit_message(limit_s: float, step: int, steps_planned: int) -> str:
    """What the console says when the time limit cuts a run short."""
    return (f"time limit of {limit_s:.0f} s reached at step {step} of {steps_planned}: the run stopped early and "
            "its learning-rate schedule was cut, so the result depends on this machine's speed. Raise "
            "train.time_limit_s (0 = no limit) to run every step.")
