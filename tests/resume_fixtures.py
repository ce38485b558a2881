"""A run trained straight and the same run killed right after one of its checkpoints, then resumed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

TIMED = ("time/", "perf/", "memory/", "rollout/gen_time")  # metrics that depend on the machine's speed


class Killed(Exception):
    """Stands for the process being killed right after a checkpoint."""


def straight_and_resumed(monkeypatch, cfg: Callable[[str], Any], kill_at: int = 2):
    """``train(cfg("straight"))`` and ``train(cfg("split"))`` killed after its step-``kill_at``
    checkpoint, then resumed from its run directory: the two ``TrainResult``s."""
    from reinforge.orchestrate.loop import Loop
    from reinforge.orchestrate.run import train

    straight = train(cfg("straight"))
    save = Loop.save

    def save_then_die(self, step):
        save(self, step)
        if step == kill_at:
            raise Killed

    monkeypatch.setattr(Loop, "save", save_then_die)
    split = cfg("split")
    with pytest.raises(Killed):
        train(split)
    monkeypatch.undo()
    from pathlib import Path

    return straight, train(resume=Path(split.output_dir) / "split")


def untimed(run) -> list[dict[str, Any]]:
    """The run's metrics records without the timing-dependent keys (``TIMED``, and seconds: ``*_s``)."""
    from reinforge.track.jsonl import read_jsonl

    return [{k: v for k, v in r.items() if not k.startswith(TIMED) and not k.endswith("_s")}
            for r in read_jsonl(run.run_dir / "metrics.jsonl")]
