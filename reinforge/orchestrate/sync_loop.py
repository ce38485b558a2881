"""The synchronous RL loop (shared/DESIGN.md, section 1), one step at a time:

    tasks -> prompts -> rollout -> trajectories -> rewards -> advantages -> batch -> update -> weight sync
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from reinforge.algo.advantages import ADVANTAGES
from reinforge.eval.heldout import evaluate
from reinforge.orchestrate.agent_episodes import AgentRunner
from reinforge.orchestrate.components import Components
from reinforge.orchestrate.episodes import (
    build_batch,
    generate_single_turn,
    greedy_baseline_rewards,
    groups_with_spread,
    score_single_turn,
    shape_overlong,
)
from reinforge.orchestrate.multi_turn import episode_player, run_episodes
from reinforge.orchestrate.step_metrics import CollapseDetector, gather_step, rollout_metrics
from reinforge.track.console import ConsoleProgress
from reinforge.track.jsonl import JsonlSink
from reinforge.track.plots import plot_run
from reinforge.track.report import write_report
from reinforge.track.sinks import build_sinks, close_sinks
from reinforge.train import distributed
from reinforge.train.checkpoint import save_checkpoint
from reinforge.train.memory import peak_mb, reset_peak
from reinforge.types import Trajectory

FINAL_EVAL_SEED_OFFSET = 7_919  # eval.json's sampling seed = run seed + this (apart from training's stream)


@dataclass
class Rollout:
    """What one step sampled (``sampled``, for metrics) and what it trains on (``kept``)."""

    sampled: list[Trajectory] = field(default_factory=list)
    kept: list[Trajectory] = field(default_factory=list)
    baseline: list[float] | None = None
    rounds: int = 0
    reward_s: float = 0.0


@dataclass
class TrainResult:
    """Where a run went and its held-out greedy accuracy before and after training."""

    run_dir: Path
    steps: int
    heldout_before: float | None
    heldout_after: float

    def metrics(self) -> list[dict[str, Any]]:
        """Every record of the run's ``metrics.jsonl`` (one per step, and the evaluations)."""
        from reinforge.track.jsonl import read_jsonl

        return read_jsonl(self.run_dir / "metrics.jsonl")


class SyncLoop:
    def __init__(self, c: Components, run_dir: Path, start: int, progress_every: int) -> None:
        self.c, self.cfg, self.run_dir, self.start = c, c.cfg, run_dir, start
        self.metrics = JsonlSink(run_dir / "metrics.jsonl")
        self.samples = JsonlSink(run_dir / "samples.jsonl")
        self.reward_failures = JsonlSink(run_dir / "reward_failures.jsonl")
        self.progress_every = progress_every
        self.collapse = CollapseDetector()
        self.agents: AgentRunner | None = None

    def run(self) -> TrainResult:
        self.sinks = (build_sinks(list(self.cfg.log.sinks), self.run_dir, self.cfg.model_dump(mode="json"))
                      if distributed.is_main() else [])
        self.agents = self._start_agents()
        try:
            return self._run()
        finally:
            close_sinks(self.sinks)
            self.c.reward_pool.close()
            if self.agents is not None:
                self.agents.close()

    def _start_agents(self) -> AgentRunner | None:
        cfg, c = self.cfg, self.c
        if cfg.env.agent is None:
            return None
        r = cfg.rollout
        return AgentRunner(cfg.env.agent, c.engine, max_tokens=c.episode_limits().max_turn_tokens,
                           temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, workers=cfg.env.agent_workers)

    def _log(self, metrics: dict[str, Any]) -> None:
        self.metrics.write(metrics)
        for sink in self.sinks:
            sink.write(metrics)

    def _run(self) -> TrainResult:
        cfg, t0 = self.cfg, time.perf_counter()
        main = distributed.is_main()  # with several ranks, only rank 0 evaluates, logs and reports
        before = self._evaluate_and_log(0) if self.start == 0 and main else None
        if self.start == 0 and cfg.eval.final_samples and main:
            self._final_eval("before")
        step, last_eval = self.start, None
        console = None if main else Console(quiet=True)
        with ConsoleProgress(cfg.train.steps, self.start, self.progress_every, console) as progress:
            progress.print(f"run directory: {self.run_dir}")
            for step in range(self.start + 1, cfg.train.steps + 1):
                metrics = self.train_step(step)
                if step == self.start + 1 and cfg.reward.on_error == "auto":
                    self.c.reward_pool.on_error = "zero"  # the reward function survived a whole step
                out_of_time = cfg.train.time_limit_s > 0 and distributed.any_rank(
                    time.perf_counter() - t0 > cfg.train.time_limit_s)
                last = step == cfg.train.steps or out_of_time
                if main:
                    if (cfg.eval.every and step % cfg.eval.every == 0) or last:
                        last_eval = self._evaluate(step)
                        metrics.update(last_eval)
                    self._log(metrics)
                    progress.update(step, metrics)
                    self._warn_on_collapse(progress, metrics)
                if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or last:
                    self.save(step)
                if out_of_time:
                    progress.print(f"time limit of {cfg.train.time_limit_s:.0f} s reached at step {step}")
                    break
        if not main:
            return TrainResult(self.run_dir, step, None, float("nan"))
        after = last_eval["eval/heldout_acc"] if last_eval else self._evaluate(step)["eval/heldout_acc"]
        if cfg.eval.final_samples:
            self._final_eval("after")
        plot_run(self.run_dir)
        if cfg.log.report:
            write_report(self.run_dir)
        return TrainResult(self.run_dir, step, before, after)

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int) -> dict[str, Any]:
        c, cfg = self.c, self.cfg
        reset_peak(cfg.model.device)
        t_start = time.perf_counter()
        rollout = self.collect(step)
        self.observe(rollout.sampled)
        t_gen = time.perf_counter()
        batch, bstats = build_batch(rollout.kept, cfg.algo, c.engine.pad_id, rollout.baseline)
        train_metrics: dict[str, float] = {}
        if distributed.any_rank(batch is not None):  # with several ranks, one without rows joins in too
            train_metrics = c.learner.update(batch)
            self.publish_weights(c.engine.version + 1)
        t_end = time.perf_counter()
        trajs = rollout.sampled
        adv = batch.advantages[batch.loss_mask > 0] if batch is not None and batch.advantages is not None else None
        if distributed.world() > 1:  # rank 0 reports the whole step, every rank's samples
            gathered = gather_step(trajs, bstats, adv)
            if gathered is None:
                return {}
            trajs, bstats, adv = gathered
        n_groups = max(len({t.group_id for t in trajs}), 1)
        self._write_samples(step, trajs)
        self._write_reward_failures(step, trajs)
        generated = sum(t.num_generated for t in trajs)
        metrics: dict[str, Any] = {"step": step, "policy_version": c.engine.version}
        peak = peak_mb(cfg.model.device)
        if peak is not None:
            metrics["memory/peak_mb"] = peak
        metrics.update(rollout_metrics(trajs))
        metrics.update({f"train/{k}": v for k, v in train_metrics.items()})
        metrics.update({
            "groups/spread_frac": len(groups_with_spread(trajs)) / n_groups,
            "groups/kept_frac": bstats.groups_kept / n_groups,
            "batch/sequences": bstats.sequences_kept,
            "rollout/rounds": rollout.rounds,
            "time/generate_s": t_gen - t_start - rollout.reward_s,
            "time/reward_s": rollout.reward_s,
            "time/train_s": t_end - t_gen,
            "time/step_s": t_end - t_start,
            "perf/tokens_per_s": generated / max(t_end - t_start, 1e-9),
            "perf/gen_tokens_per_s": generated / max(t_gen - t_start - rollout.reward_s, 1e-9),
        })
        if adv is not None and adv.numel():
            metrics.update({"adv/mean": adv.mean().item(), "adv/std": adv.std().item() if adv.numel() > 1 else 0.0,
                            "adv/abs_mean": adv.abs().mean().item()})
        return metrics

    def observe(self, trajs: list[Trajectory]) -> None:
        """The task sampler sees every scored trajectory of the step (every rank's, so that samplers of
        all ranks stay in the same state and keep drawing the same tasks)."""
        if distributed.world() > 1:
            trajs = [t for part in distributed.all_gather_object(trajs) for t in part]
        self.c.sampler.observe(trajs)

    def publish_weights(self, version: int) -> None:
        """The new policy to the rollout engine (and, in async mode, to the rollout workers)."""
        self.c.engine.update_weights(self.c.learner.model, version)

    def collect(self, step: int) -> Rollout:
        """One rollout batch: ``prompts_per_step`` groups, scored and shaped.

        With DAPO's dynamic sampling, groups without reward spread are set aside and more prompts
        are sampled until ``prompts_per_step`` groups with spread are in hand, for at most
        ``dynamic_sampling_max_rounds`` rounds (then the batch is what was found)."""
        c, cfg = self.c, self.cfg
        algo, n_prompts, g = cfg.algo, cfg.rollout.prompts_per_step, cfg.rollout.group_size
        lo, hi = distributed.shard(n_prompts)  # with several ranks: this rank's prompts [lo, hi) of each draw
        distributed.seed_rollout(c.engine.generator, cfg.seed, step)
        out = Rollout()
        while True:
            out.rounds += 1
            tasks = c.sampler.next_batch(n_prompts)[lo:hi]  # every rank draws the same tasks
            offset = out.rounds * n_prompts - n_prompts + lo
            if self.agents is not None:  # a black-box agent plays through the proxy
                trajs = self.agents.run(tasks, g, group_offset=offset)
            elif cfg.env.multi_turn:  # environment steps (and their rewards) interleave with generation
                trajs = run_episodes(tasks, c.engine, c.make_env, c.sampling_params(), c.episode_limits(), step,
                                     group_offset=offset)
            else:
                _, generations = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=step,
                                                      group_sampler=cfg.rollout.group_sampler)
                t0 = time.perf_counter()
                trajs = score_single_turn(tasks, generations, g, c.reward_pool, group_offset=offset)
                out.reward_s += time.perf_counter() - t0
            shape_overlong(trajs, algo, cfg.rollout.max_new_tokens)
            baseline = None
            if "baseline" in ADVANTAGES.needs(algo.advantage):  # e.g. ReMax's greedy baseline
                greedy = self._greedy_baseline(tasks, step)
                baseline = [greedy[t.group_id - offset] for t in trajs]
            out.sampled += trajs
            if not algo.dynamic_sampling:
                out.kept, out.baseline = trajs, baseline
                return out
            spread = groups_with_spread(trajs)
            room = (hi - lo) - len({t.group_id for t in out.kept})
            take = set(sorted(spread)[:room])
            out.kept += [t for t in trajs if t.group_id in take]
            if baseline is not None:
                out.baseline = (out.baseline or []) + [b for t, b in zip(trajs, baseline, strict=True)
                                                      if t.group_id in take]
            if distributed.all_ranks(len(take) == room or out.rounds >= algo.dynamic_sampling_max_rounds):
                return out  # (a rank already full samples on, unused, until every rank is: same draws)

    def _greedy_baseline(self, tasks: list, step: int) -> list[float]:
        """ReMax's baseline: the reward of one greedy completion (or episode) per task."""
        c = self.c
        if self.agents is not None:
            return [t.reward for t in self.agents.run(tasks, 1, greedy=True)]
        limits = c.episode_limits() if self.cfg.env.multi_turn else None
        return greedy_baseline_rewards(tasks, c.engine, c.make_env, c.sampling_params(), step, c.reward_pool, limits)

    def _player(self):
        """Multi-turn environments are evaluated by playing their episodes."""
        c = self.c
        if self.agents is not None:
            return self.agents.player()
        return episode_player(c.engine, c.make_env, c.episode_limits()) if self.cfg.env.multi_turn else None

    def _evaluate(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        result = evaluate(
            self.c.engine, self.c.splits.heldout, self.c.reward_pool,
            max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
            system_prompt=cfg.task.system_prompt, player=self._player(),
        )
        return result.as_metrics()

    def _final_eval(self, when: str) -> None:
        """mean@n, pass@k, maj@k with bootstrap intervals on the held-out split, into eval.json; after
        training, also the before/after pass@k curves (passk.png). Both evaluations sample from the
        same seed (common random numbers), so an unchanged policy scores exactly the same; the rollout
        generator's state is restored afterwards, so training samples as it would without them."""
        import json

        from reinforge.eval.plots import plot_pass_curves

        cfg = self.cfg
        generator = getattr(self.c.engine, "generator", None)
        training_state = generator.get_state() if generator is not None else None
        if generator is not None:  # the same sampling stream before and after: they differ by the policy only
            generator.manual_seed(cfg.seed + FINAL_EVAL_SEED_OFFSET)
        result = evaluate(
            self.c.engine, self.c.splits.heldout, self.c.reward_pool,
            max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
            samples=cfg.eval.final_samples, temperature=cfg.eval.final_temperature,
            ks=[k for k in (1, 2, 4, 8, 16, 32, 64) if k <= cfg.eval.final_samples],
            system_prompt=cfg.task.system_prompt, confidence=True, player=self._player(),
        )
        if training_state is not None:
            generator.set_state(training_state)  # training samples as if there had been no evaluation
        path = self.run_dir / "eval.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        data[when] = {"policy_version": self.c.engine.version, "samples": cfg.eval.final_samples,
                      "temperature": cfg.eval.final_temperature, **result.to_dict()}
        path.write_text(json.dumps(data, indent=2) + "\n")
        curves = {name: {int(k): v for k, v in data[name]["pass_curve"].items()} for name in ("before", "after")
                  if name in data}
        if when == "after":
            plot_pass_curves(curves, self.run_dir / "passk.png", title="pass@k on the held-out split")

    def _evaluate_and_log(self, step: int) -> float:
        metrics = self._evaluate(step)
        self._log({"step": step, **metrics})
        return metrics["eval/heldout_acc"]

    def save(self, step: int) -> None:
        c = self.c
        model, trainer_state = c.learner.checkpoint_model(), c.learner.state_dict()  # collectives under FSDP2
        if not distributed.is_main():
            return
        save_checkpoint(
            self.run_dir, step, model, c.tokenizer, trainer_state, c.engine.generator,
            self.checkpoint_state(), keep=self.cfg.checkpoint.keep,
        )

    def checkpoint_state(self) -> dict[str, Any]:
        """What ``state.json`` holds besides the step (the async loop adds its in-flight requests)."""
        return {"sampler": self.c.sampler.state_dict(), "policy_version": self.c.engine.version}

    def _write_samples(self, step: int, trajs: list[Trajectory]) -> None:
        n = self.cfg.log.samples_per_step
        stride = max(1, len(trajs) // max(n, 1))
        for t in trajs[::stride][:n]:
            prompt_ids = [tok for tok, m in zip(t.token_ids, t.loss_mask, strict=True) if not m]
            self.samples.write({
                "step": step, "task_id": t.task_id,
                "prompt": self.c.tokenizer.decode(prompt_ids, skip_special_tokens=True),
                "completion": t.completion_text, "reward": t.reward, "finish_reason": t.finish_reason,
            })

    def _write_reward_failures(self, step: int, trajs: list[Trajectory]) -> None:
        """Every failed reward call and failed composite term of the step, with its sample."""
        for t in trajs:
            failures = dict(t.metadata.get("reward_term_errors", {}))
            if t.metadata.get("reward_status", "ok") != "ok":
                failures["*"] = f"{t.metadata['reward_status']}: {t.metadata.get('reward_error', '')}"
            for term, error in failures.items():
                self.reward_failures.write({"step": step, "task_id": t.task_id, "term": term, "error": error,
                                            "completion": t.completion_text})

    def _warn_on_collapse(self, progress: ConsoleProgress, metrics: dict[str, Any]) -> None:
        warning = self.collapse.update(metrics)
        if warning:
            progress.print(f"[bold red]warning:[/] {warning}")


