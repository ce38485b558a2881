"""The RL loop (docs/architecture.md), one step at a time:

    tasks -> rollout -> rewards        a ``BatchSource`` (in this process, or rollout workers ahead)
    -> batch -> advantages -> update   the learner
    -> weight sync                     the rollout engine(s)

The loop does not know where its batches come from (``LocalBatches`` in synchronous mode,
``WorkerBatches`` in asynchronous mode) nor what kind of episodes they hold (the run's
``Collector``, which evaluation plays too).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from reinforge.errors import TrainingDiverged
from reinforge.eval.ablation import blank_pictures, shuffled_pictures
from reinforge.eval.heldout import evaluate
from reinforge.learn import distributed
from reinforge.learn.checkpoint import latest_checkpoint, save_checkpoint
from reinforge.learn.memory import peak_mb, reset_peak
from reinforge.models.precision import resolved_autocast
from reinforge.orchestrate.batch_sources import BatchSource, LocalBatches, Rollout
from reinforge.orchestrate.collectors import Collector, play
from reinforge.orchestrate.components import Components
from reinforge.orchestrate.episodes import build_batch
from reinforge.orchestrate.stages import build_stages
from reinforge.orchestrate.step_metrics import (
    CollapseDetector,
    TruncationDetector,
    gather_step,
    step_record,
    time_limit_message,
    time_limit_metrics,
)
from reinforge.track.console import ConsoleProgress
from reinforge.track.jsonl import JsonlSink
from reinforge.track.plots import plot_run
from reinforge.track.report import write_report
from reinforge.track.sinks import build_sinks, close_sinks
from reinforge.types import Trajectory, declares_stage

SourceFactory = Callable[[Components, Collector], BatchSource]

FINAL_EVAL_SEED_OFFSET = 7_919  # eval.json's sampling seed = run seed + this (apart from training's stream)


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


def local_batches(c: Components, collector: Collector, resumed: Mapping[str, Any] | None = None) -> BatchSource:
    """Synchronous RL: each step samples its batch here, with the loop's engine, then runs the run's
    stages (orchestrate/stages.py), restored from ``resumed`` (the checkpoint's ``state.json``)."""
    cfg = c.cfg
    return LocalBatches(cfg.algo, cfg.rollout, cfg.seed, c.sampler, collector, c.sampling_params(), c.engine.generator,
                        build_stages(c, collector, resumed))


class Loop:
    """One run's steps, evaluations and checkpoints over ``source``'s batches (synchronous by default)."""

    def __init__(self, c: Components, run_dir: Path, start: int, progress_every: int,
                 source: SourceFactory = local_batches, resumed: Mapping[str, Any] | None = None) -> None:
        """``resumed``: the ``state.json`` of the checkpoint the run resumes from (read once, by the caller);
        the collector's state comes from it, the source's factory was given it."""
        self.c, self.cfg, self.run_dir, self.start = c, c.cfg, run_dir, start
        self.metrics = JsonlSink(run_dir / "metrics.jsonl")
        self.samples = JsonlSink(run_dir / "samples.jsonl")
        self.reward_failures = JsonlSink(run_dir / "reward_failures.jsonl")
        self.progress_every = progress_every
        self.collapse = CollapseDetector(active=self.cfg.rollout.group_size > 1)  # one sample per prompt: no spread
        self.truncation = TruncationDetector(self.cfg.rollout.max_new_tokens)
        self.collector = c.make_collector()  # this process's: the synchronous rollout, and evaluation
        if resumed and hasattr(self.collector, "load_state_dict"):  # e.g. a group sampler's earlier rollouts
            self.collector.load_state_dict(resumed.get("collector", {}))
        try:
            self.source = source(c, self.collector)
        except BaseException:
            self.collector.close()
            raise

    def run(self) -> TrainResult:
        self.sinks = (build_sinks(list(self.cfg.log.sinks), self.run_dir, self.cfg.model_dump(mode="json"))
                      if distributed.is_main() else [])
        try:
            return self._run()
        finally:
            close_sinks(self.sinks)
            self.source.close()
            self.collector.close()
            self.c.reward_pool.close()

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
            if cfg.train.autocast == "auto":  # what it resolved to on this machine
                progress.print(f"train.autocast=auto: the learner's forwards in {resolved_autocast(cfg)}")
            for step in range(self.start + 1, cfg.train.steps + 1):
                metrics = self.checked_train_step(step)
                if step == self.start + 1 and cfg.reward.on_error == "auto":
                    self.c.reward_pool.on_error = "zero"  # the reward function survived a whole step
                out_of_time = cfg.train.time_limit_s > 0 and step < cfg.train.steps and distributed.any_rank(
                    time.perf_counter() - t0 > cfg.train.time_limit_s)
                last = step == cfg.train.steps or out_of_time
                if main:
                    metrics["time/elapsed_s"] = time.perf_counter() - t0  # wall clock since the run (re)started
                    if out_of_time:
                        metrics.update(time_limit_metrics(cfg.train.steps))
                    if (cfg.eval.every and step % cfg.eval.every == 0) or last:
                        last_eval = self._evaluate(step)
                        metrics.update(last_eval)
                    self._log(metrics)
                    progress.update(step, metrics)
                    self._warn_on_collapse(progress, metrics)
                if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or last:
                    self.save(step)
                if out_of_time:
                    progress.print(time_limit_message(cfg.train.time_limit_s, step, cfg.train.steps))
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
    def checked_train_step(self, step: int) -> dict[str, Any]:
        """One ordinary step (``train_step``); a numerical fault (``TrainingDiverged``) is re-raised naming
        the step and the last good checkpoint to resume from."""
        try:
            return self.train_step(step)
        except TrainingDiverged as e:
            last = latest_checkpoint(self.run_dir)
            where = (f"the last good checkpoint is {last} (resume with `reinforge train --resume {self.run_dir}`, "
                     "e.g. with a lower train.lr)" if last is not None else "no checkpoint was written before it")
            raise TrainingDiverged(f"run stopped at step {step}: {e} {where[0].upper()}{where[1:]}.") from e

    def train_step(self, step: int) -> dict[str, Any]:
        c, t_start, train = self.c, time.perf_counter(), {}
        reset_peak(self.cfg.model.device)
        rollout = self.source.collect(step)  # tasks -> rollout -> rewards (shaped)
        self.observe(rollout.sampled)  # the task sampler learns from every scored sample
        rollout.metrics.update(getattr(c.sampler, "metrics", dict)())  # a sampler's own sampler/... metrics
        t_gen = time.perf_counter()
        batch, counts = build_batch(rollout.kept, self.cfg.algo, c.engine.pad_id, rollout.baseline)
        if distributed.any_rank(batch is not None):  # with several ranks, one without rows joins in too
            c.learner.prepare(batch)  # no-grad passes: old and reference log-probs, critic values
            c.learner.estimate_advantages(batch)  # the run's advantage estimator
            train = c.learner.update(batch)
        # weight sync, also after a step without rows (every group filtered): versions count steps, so
        # async admission control (which waits for version k - 1 - max_staleness before sampling for step
        # k) and the lag of each token stay in step with the loop; the weights are then unchanged
        self.publish_weights(c.engine.version + 1)
        return self.report(step, rollout, batch, counts, train, (t_start, t_gen, time.perf_counter()))

    def report(self, step: int, rollout: Rollout, batch, counts, train: dict[str, float],
               clock: tuple[float, float, float]) -> dict[str, Any]:
        """The step's metrics (rank 0 reports the whole step, every rank's samples; {} on the others),
        and its samples and reward failures written to the run directory."""
        adv = batch.advantages[batch.loss_mask > 0] if batch is not None and batch.advantages is not None else None
        trajs = rollout.sampled
        if distributed.world() > 1:
            gathered = gather_step(trajs, counts, adv)
            if gathered is None:
                return {}
            trajs, counts, adv = gathered
        self._write_samples(step, trajs)
        self._write_reward_failures(step, trajs)
        return step_record(step, self.c.engine.version, replace(rollout, sampled=trajs), counts, adv, train, clock,
                           peak_mb(self.cfg.model.device))

    def observe(self, trajs: list[Trajectory]) -> None:
        """The task sampler sees every scored trajectory of the step (every rank's, so that samplers of
        all ranks stay in the same state and keep drawing the same tasks)."""
        if distributed.world() > 1:
            trajs = [t for part in distributed.all_gather_object(trajs) for t in part]
        self.c.sampler.observe([t for t in trajs if not t.continues])  # a continuing one has no outcome yet

    @declares_stage("publish", reads=("policy",), writes=("engine weights", "version"))
    def publish_weights(self, version: int) -> None:
        """The new policy to the loop's rollout engine, then to the source's (rollout workers)."""
        self.c.engine.update_weights(self.c.learner.model, version)
        self.source.published(self.c.learner.model, version)

    def _evaluate(self, step: int) -> dict[str, float]:
        """Greedy held-out accuracy; with ``eval.picture_ablation`` also with blank and shuffled pictures."""
        cfg = self.cfg
        views = {"": self.c.splits.heldout}
        if cfg.eval.picture_ablation:
            views |= {"_blank": blank_pictures(views[""]), "_shuffled": shuffled_pictures(views[""], cfg.seed)}
        metrics: dict[str, float] = {}
        for suffix, tasks in views.items():
            with self._evaluating():
                result = evaluate(self.c.engine, tasks, self.c.reward_pool, player=play(self.collector),
                                  max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens)
            metrics |= {f"{k}{suffix}": v for k, v in result.as_metrics().items()}
        return metrics

    def _final_eval(self, when: str) -> None:
        """mean@n, pass@k, maj@k with bootstrap intervals on the held-out split, into eval.json; after
        training, also the before/after pass@k curves (passk.png). Both evaluations sample from the
        same seed (common random numbers), so an unchanged policy scores exactly the same; the rollout
        generator's state is restored afterwards, so training samples as it would without them."""

        from reinforge.eval.plots import plot_pass_curves

        cfg = self.cfg
        generator = getattr(self.c.engine, "generator", None)
        training_state = generator.get_state() if generator is not None else None
        if generator is not None:  # the same sampling stream before and after: they differ by the policy only
            generator.manual_seed(cfg.seed + FINAL_EVAL_SEED_OFFSET)
        with self._evaluating():
            result = evaluate(
                self.c.engine, self.c.splits.heldout, self.c.reward_pool,
                max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                samples=cfg.eval.final_samples, temperature=cfg.eval.final_temperature,
                ks=[k for k in (1, 2, 4, 8, 16, 32, 64) if k <= cfg.eval.final_samples],
                confidence=True, player=play(self.collector, texts := []), texts=texts,  # texts: the report's examples
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

    def _evaluating(self) -> AbstractContextManager[None]:
        """The source's setting for evaluations (``WorkerBatches``: the idle workers' cores), if it has one."""
        return getattr(self.source, "evaluating", nullcontext)()

    def _evaluate_and_log(self, step: int) -> float:
        metrics = self._evaluate(step)
        self._log({"step": step, **metrics})
        return metrics["eval/heldout_acc"]

    def save(self, step: int) -> None:
        c = self.c
        model, trainer_state = c.learner.checkpoint_model(), c.learner.state_dict()  # collectives under FSDP2
        if not distributed.is_main():
            return
        processor = getattr(c.engine, "processor", None)  # a vision-language model's: its tokenizer and image processor
        save_checkpoint(
            self.run_dir, step, model, processor or c.tokenizer, trainer_state, c.engine.generator,
            self.checkpoint_state(), keep=self.cfg.checkpoint.keep, reward_state=c.reward_pool.state_dict(),
            adapter_name=c.learner.checkpoint_adapter,
        )

    def checkpoint_state(self) -> dict[str, Any]:
        """What ``state.json`` holds besides the step (the source adds its own, e.g. requests in flight)."""
        return {"sampler": self.c.sampler.state_dict(), "policy_version": self.c.engine.version,
                "collector": getattr(self.collector, "state_dict", dict)(), **self.source.state()}

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
        """A collapsed policy (no reward spread) or answers cut at the token limit, each said once."""
        for warning in (self.collapse.update(metrics), self.truncation.update(metrics)):
            if warning:
                progress.print(f"[bold red]warning:[/] {warning}")
