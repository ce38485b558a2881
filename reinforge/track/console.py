"""Live console progress (rich): a bar with step, reward, held-out accuracy, tokens/s, step time.

Off a terminal (CI, pipes) it prints one plain line every ``every`` steps instead.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

GIVEN_ROW_SIGNALS = (("train/nll", "nll"), ("train/preference/accuracy", "pairs ranked right"),
                     ("train/preference/margin", "margin"))
"""What a run without rollouts (SFT, offline DPO) shows in place of the reward."""


def _fmt(metrics: dict[str, Any], heldout: float | None) -> str:
    acc = f"{heldout:.3f}" if heldout is not None else "  -  "
    signal = " | ".join(f"{label} {metrics[k]:.3f}" for k, label in GIVEN_ROW_SIGNALS if k in metrics)
    if "reward/mean" not in metrics and signal:  # no rollout: the given rows' own training signal
        return f"{signal} | held-out {acc} | {metrics.get('time/step_s', 0.0):.2f} s/step"
    nll = f" | nll {metrics['train/nll']:.3f}" if "train/nll" in metrics else ""
    return (
        f"reward {metrics.get('reward/mean', 0.0):.3f}{nll} | held-out {acc} | "
        f"{metrics.get('perf/tokens_per_s', 0.0):7.0f} tok/s | {metrics.get('time/step_s', 0.0):.2f} s/step"
    )


class ConsoleProgress:
    def __init__(self, total: int, start: int = 0, every: int = 10, console: Console | None = None) -> None:
        self.console = console or Console()
        self.total, self.every = total, every
        self.heldout: float | None = None
        self.live = self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
            TimeElapsedColumn(), console=self.console, disable=not self.live,
        )
        self.task = self.progress.add_task("", total=total, completed=start)

    def __enter__(self) -> ConsoleProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if "eval/heldout_acc" in metrics:
            self.heldout = metrics["eval/heldout_acc"]
        line = _fmt(metrics, self.heldout)
        self.progress.update(self.task, completed=step, description=line)
        if not self.live and (step % self.every == 0 or step == self.total):
            self.console.print(f"step {step:5d}/{self.total} | {line}", highlight=False)

    def print(self, message: str) -> None:
        self.console.print(message, highlight=False)
