"""``train()``: one run from its config, the entry point of ``reinforge train`` and ``reinforge.train``.

It builds the components, creates (or resumes) the run directory, and runs the loop (loop.py) over
its batch source: this process's rollout, or rollout workers sampling ahead (async_batches.py). With ``train.world_size`` > 1 it first
spawns that many ranks here (or joins torchrun's), each of which runs ``train`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from reinforge.config import RunConfig, dump_config, load_config
from reinforge.errors import ReinforgeError
from reinforge.learn import distributed
from reinforge.learn.checkpoint import (
    latest_checkpoint,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_reward_state,
)
from reinforge.orchestrate.collectors import Collector
from reinforge.orchestrate.components import Components, build_components, resolve_config
from reinforge.orchestrate.demo_batches import demonstration_batches, preference_batches
from reinforge.orchestrate.loop import Loop, TrainResult, local_batches
from reinforge.orchestrate.run_dir import create_run_dir
from reinforge.orchestrate.stages import build_stages
from reinforge.track import provenance
from reinforge.track.jsonl import JsonlSink


def train(cfg: RunConfig | None = None, resume: Path | None = None, overrides: list[str] | None = None,
          progress_every: int | None = None) -> TrainResult:
    """Run (or resume) a training run; returns where it went and the held-out accuracy before/after.

    With ``train.world_size`` > 1 it runs in that many processes (spawned here, or started by
    torchrun); rank 0 logs, evaluates, checkpoints and returns the result (docs/distributed.md)."""
    if resume is not None:
        cfg, run_dir = _resumed_config(resume, overrides or [])
    else:
        cfg = cfg or load_config(None, overrides)
        run_dir = None
    cfg = resolve_config(cfg)  # what the run uses, and its config.yaml records
    if distributed.needs_spawn(cfg):
        return spawn_train(cfg, resume, overrides, progress_every)
    joined = distributed.init(cfg)  # joins torchrun's process group; a no-op with one process
    c = build_components(cfg)
    run_dir = run_dir or distributed.from_main(lambda: create_run_dir(cfg))
    start, resumed = _restore(c, run_dir) if resume is not None else (0, None)
    if distributed.is_main():
        (run_dir / "config.yaml").write_text(dump_config(cfg))
        provenance.record(run_dir, cfg.seed, resumed_from=start if resume is not None else None)
    source = partial(worker_batches if cfg.orchestrate.mode == "async" else local_batches, resumed=resumed)
    if cfg.demonstrations.path is not None and not cfg.demonstrations.mix:  # SFT (mixed in: a stage)
        source = demonstration_batches
    if cfg.preferences.path is not None:  # offline preference pairs (DPO)
        source = preference_batches
    result = Loop(c, run_dir, start, progress_every or cfg.log.console_every, source, resumed).run()
    if joined:
        distributed.finish()
    return result


def worker_batches(c: Components, collector: Collector, resumed: Mapping[str, Any] | None = None):
    """Asynchronous RL: rollout workers sample ahead (async_batches.py); this process trains and runs the
    stages after collection over ``collector`` (orchestrate/stages.py), restored from ``resumed``."""
    import torch

    from reinforge.orchestrate.async_batches import WorkerBatches

    torch.set_num_threads(c.cfg.orchestrate.learner_threads)
    return WorkerBatches(c.cfg, c.sampler, c.reward_pool, c.learner.model, c.engine.version,
                         build_stages(c, collector, resumed), resumed)


def _resumed_config(run_dir: Path, overrides: list[str]) -> tuple[RunConfig, Path]:
    if not (run_dir / "config.yaml").is_file():
        raise ReinforgeError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    return load_config(run_dir / "config.yaml", overrides), run_dir


def _restore(c: Components, run_dir: Path) -> tuple[int, dict[str, Any]]:
    """The components' state from ``run_dir``'s newest undamaged checkpoint (read and verified here,
    once); the step it was written at and its ``state.json``, which the stages and the source restore from."""
    ckpt = latest_valid_checkpoint(run_dir, warn=_warn)
    if ckpt is None:
        found = "no checkpoint" if not list_checkpoints(run_dir) else "no undamaged checkpoint"
        raise ReinforgeError(f"--resume {run_dir}: {found} in {run_dir / 'checkpoints'}")
    if ckpt != latest_checkpoint(run_dir):
        _warn(f"resuming from {ckpt}, the newest undamaged checkpoint")
    c.learner.restore_policy(ckpt, c.cfg.model.dtype, c.cfg.model.device)
    trainer_state, state = load_checkpoint(ckpt, c.engine.generator)
    c.learner.load_state_dict(trainer_state)
    c.sampler.load_state_dict(state["sampler"])
    c.reward_pool.load_state_dict(load_reward_state(ckpt))
    c.engine.update_weights(c.learner.model, state["policy_version"])
    step = int(state["step"])
    for name in ("metrics.jsonl", "samples.jsonl", "reward_failures.jsonl") if distributed.is_main() else ():
        JsonlSink(run_dir / name).truncate_after_step(step)
    return step, state


def spawn_train(cfg: RunConfig, resume: Path | None, overrides: list[str] | None,
                progress_every: int | None) -> TrainResult:
    """``train`` in ``train.world_size`` spawned processes; rank 0's ``TrainResult``."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").SimpleQueue()
    distributed.spawn(_train_rank, cfg, cfg, resume, overrides, progress_every, results)
    if results.empty():
        raise ReinforgeError("rank 0 finished without a result")
    return results.get()


def _train_rank(cfg: RunConfig, resume: Path | None, overrides: list[str] | None, progress_every: int | None,
                results) -> None:  # type: ignore[no-untyped-def]
    result = train(None if resume is not None else cfg, resume, overrides, progress_every)
    if distributed.is_main():
        results.put(result)



def _warn(message: str) -> None:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"[yellow]warning:[/yellow] {message}", highlight=False)
