"""Real crashes: a `reinforge train` process SIGKILLed at a random moment, resumed, SIGKILLed again
while it writes a checkpoint, and resumed again, in synchronous and in asynchronous mode (requests in flight), ends with
exactly the metrics and weights of an uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reinforge.track.jsonl import read_jsonl

STEPS = 8
MACHINE_DEPENDENT = ("time/", "perf/", "memory/", "async/wait_s", "async/worker_generate_s", "async/worker_reward_s",
                     "async/worker_env_s")
COMMON = [f"train.steps={STEPS}", "checkpoint.every=2", "checkpoint.keep=10", "rollout.prompts_per_step=4",
          "rollout.group_size=4", "task.heldout_size=8", "eval.every=0", "eval.final_samples=0", "log.report=false",
          "train.time_limit_s=0", "train.lr_schedule=cosine", "train.minibatches=2", "log.console_every=1"]
MODES = {
    "sync": [],
    # weight_update=wait: each request samples with the weights it was admitted for, not ones that
    # arrive mid-generation (which would make even an uninterrupted run depend on timing)
    "async": ["orchestrate.mode=async", "orchestrate.max_staleness=1", "orchestrate.weight_update=wait"],
}


# The child is `reinforge train` on a slow disk: fsyncing a checkpoint's temporary directory takes
# 0.2 s, so the kill "while writing" lands inside the write every time, not by luck of timing.
SLOW_DISK_TRAIN = """
import time
import reinforge.learn.checkpoint as checkpoint
fsync_dir = checkpoint._fsync_dir
def slow_fsync_dir(path):
    if path.name.startswith(".tmp_step_"):
        time.sleep(0.2)
    fsync_dir(path)
checkpoint._fsync_dir = slow_fsync_dir
from reinforge.cli import main
main()
"""


def _start(args: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-c", SLOW_DISK_TRAIN, "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its rollout workers, as a crash of the machine would
    proc.wait()


def _logged_steps(run_dir: Path) -> int:
    try:
        return (run_dir / "metrics.jsonl").read_text().count("\n")
    except FileNotFoundError:
        return 0


def _kill_at_random(proc: subprocess.Popen, run_dir: Path, rng: random.Random) -> bool:
    """SIGKILL at a random moment inside a random step between the first checkpoint and the last
    two (so the resumed run still has a checkpoint to write, however fast the machine); False if the
    run ended first."""
    target = rng.randint(3, STEPS - 3)  # metrics lines: step 0 (eval) ... the step in flight
    while proc.poll() is None and (_logged_steps(run_dir) < target
                                   or not list((run_dir / "checkpoints").glob("step_*"))):
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.1))
    if proc.poll() is not None:
        return False
    _kill(proc)
    return True


def _kill_while_writing(proc: subprocess.Popen, run_dir: Path) -> bool:
    """SIGKILL the moment a checkpoint's temporary directory appears; False if the run ended first."""
    root = str(run_dir / "checkpoints")
    while proc.poll() is None:
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            continue
        if any(name.startswith(".tmp_step_") for name in names):
            _kill(proc)
            return True
        time.sleep(0.005)
    return False


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]


def _deterministic(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(MACHINE_DEPENDENT)}
            for r in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.learning)])  # seed 1: make test-learning
def test_sigkill_at_random_and_while_writing_then_resume_is_bit_exact(tmp_path, mode, seed):
    rng = random.Random(f"{mode}-kills-{seed}")
    args = [*COMMON, *MODES[mode], f"output_dir={tmp_path}", f"seed={seed}"]
    _finish(_start([*args, "name=straight"]))
    run_dir = tmp_path / "crashed"
    proc = _start([*args, "name=crashed"])
    kills = [_kill_at_random(proc, run_dir, rng)]
    proc = _start(["--resume", str(run_dir)])
    kills.append(_kill_while_writing(proc, run_dir))
    proc = _start(["--resume", str(run_dir)])
    _finish(proc)
    assert kills == [True, True], f"both kills must land before the run ends: {kills}"
    assert [r["step"] for r in _deterministic(run_dir)] == list(range(STEPS + 1))
    assert _deterministic(run_dir) == _deterministic(tmp_path / "straight")
    if mode == "async":  # wait: update k samples with version k - 2 exactly (k - 1 at first), never by timing
        lags = [r["async/lag_max"] for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl") if "async/lag_max" in r]
        assert lags == [min(1, k - 1) for k in range(1, STEPS + 1)]
    final = f"checkpoints/step_{STEPS}/model.safetensors"
    a, b = load_file(tmp_path / "straight" / final), load_file(run_dir / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
