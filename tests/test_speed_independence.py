"""A run's result does not depend on the machine's speed: a slowed-down run makes exactly the same
steps as a fast one until the time limit stops it, and then says it was cut (metrics, report)."""

import time

from reinforge.config import load_config
from reinforge.orchestrate import loop as loop_module
from reinforge.orchestrate.loop import Loop
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl
from reinforge.track.report import write_report

MACHINE_DEPENDENT = ("time/", "perf/", "memory/", "eval/", "run/")


def _cfg(tmp_path, name, *overrides):
    return load_config(None, [
        f"output_dir={tmp_path}", f"name={name}", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "train.steps=8", "task.heldout_size=8", "eval.every=0", "eval.final_samples=0", "log.report=false",
        "checkpoint.every=0", *overrides,
    ])


def _deterministic(record):
    return {k: v for k, v in record.items() if not k.startswith(MACHINE_DEPENDENT)}


class _SlowClock:
    """The loop's ``time`` module as a machine ``lag_s`` slower per step would see it."""

    def __init__(self) -> None:
        self.lag = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.lag


def test_slow_machine_makes_the_same_steps_until_the_time_limit_says_it_cut(tmp_path, monkeypatch):
    fast = train(_cfg(tmp_path, "fast", "train.time_limit_s=0"))
    step, clock = Loop.train_step, _SlowClock()

    def slow_step(self, n):  # each step really waits a little and, on the loop's clock, 1000 s more
        time.sleep(0.2)
        clock.lag += 1000.0
        return step(self, n)

    monkeypatch.setattr(Loop, "train_step", slow_step)
    monkeypatch.setattr(loop_module, "time", clock)
    # the limit: the fast run's whole time + 2500 s, which the slowed run passes after step 3 (3000 s
    # of lag) and not after step 2 however loaded this machine is (the fast run's real time cancels)
    fast_s = read_jsonl(fast.run_dir / "metrics.jsonl")[-1]["time/elapsed_s"]
    slow = train(_cfg(tmp_path, "slow", f"train.time_limit_s={fast_s + 2500}"))
    assert fast.steps == 8 and slow.steps == 3
    a = read_jsonl(fast.run_dir / "metrics.jsonl")
    b = read_jsonl(slow.run_dir / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(slow.steps + 1))
    assert [_deterministic(r) for r in b] == [_deterministic(r) for r in a[: slow.steps + 1]]
    assert b[0]["eval/heldout_acc"] == a[0]["eval/heldout_acc"]
    assert b[-1]["run/stopped_by_time_limit"] == 1.0 and b[-1]["run/steps_planned"] == 8.0
    assert not any("run/stopped_by_time_limit" in r for r in a)
    page = write_report(slow.run_dir).read_text()
    assert f"at step {slow.steps} of 8 planned: the learning-rate schedule was cut" in page


def test_the_default_run_keeps_a_wide_margin_under_its_time_limit():
    # The default run's 1000 steps take about 150-160 s of step time on 2 idle cores (README); its
    # time limit is a safety net several times that, so a loaded machine still runs every step.
    cfg = load_config(None)
    assert cfg.train.time_limit_s >= 6 * 215
