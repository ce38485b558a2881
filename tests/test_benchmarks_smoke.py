"""The benchmark scripts still run against the current API: each one on its smallest settings
(the figures are meaningless here; benchmarks/BENCHMARKS.md has the real runs). bench_async.py and
bench_gpu.py run on their smallest settings in tests/test_device_check.py (scripts/device_check.py --quick --cpu)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

SMOKE = {
    # concurrent differs from sequential only in env.concurrency, which the async run uses too
    "bench_agent_latency.py": ["--latencies", "0.01", "--steps", "2", "--repeats", "1", "--prompts", "1", "--group", "2",
                               "--workers", "1", "--settings", "sequential,async"],
    "bench_demo.py": ["--seeds", "0", "--target", "0", "--out", "/tmp/reinforge-bench-demo-smoke", "--compare",
                      "train.steps=2 eval.every=1 task.heldout_size=8 eval.final_samples=0 log.report=false", "--set",
                      "train.steps=3", "eval.every=1", "task.heldout_size=8", "eval.final_samples=0", "log.report=false",
                      "checkpoint.every=0"],
    "bench_plain_grpo.py": ["--steps", "2", "--eval-every", "1", "--threads", "1", "--out", "/tmp/reinforge-plain-grpo.json"],
    "bench_classic_impala.py": ["--actors", "0", "--updates", "3", "--warmup", "1", "--repeats", "1"],
    "bench_memory.py": ["--quick", "--repeats", "1"],
    "bench_lm_head.py": ["--vocab", "1000", "--hidden", "16", "--positions", "64", "--chunks", "0,16", "--repeats", "1"],
    "bench_learner.py": ["--prompts", "2", "--group", "2", "--repeats", "1"],
    "bench_rollout.py": ["--sizes", "tiny", "--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--repeats", "1"],
    "bench_sandbox.py": ["--runs", "2"],
    "bench_short_completions.py": ["--repeats", "1", "--batches", "2"],
    "bench_verifier_pool.py": ["--calls", "4", "--code-calls", "2", "--exact-calls", "4", "--repeats", "1"],
    "bench_server.py": ["--requests", "4", "--concurrency", "2"],
    "bench_soak.py": ["--steps", "4", "--every", "2"],
    "bench_strategies.py": ["--steps", "1", "--repeats", "1", "--eval-every", "1", "--heldout", "4", "--only",
                            "spec_rl,treepo", "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4"],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_runs_on_its_smallest_settings(script):
    proc = subprocess.run([sys.executable, str(BENCH / script), *SMOKE[script]], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "|" in proc.stdout, proc.stdout  # printed its table


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("bench_*.py") if p.name not in SMOKE))
def test_the_other_benchmarks_parse_their_arguments(script):
    """bench_vs_trl needs TRL and minutes per run; it must at least import and parse."""
    proc = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage" in proc.stdout, proc.stderr[-3000:]
