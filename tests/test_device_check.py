"""scripts/device_check.py: the whole check on the CPU (--quick --cpu), its report when a step fails, and
the figures of benchmarks/bench_gpu.py against hand-computed values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gpu  # noqa: E402
import device_check  # noqa: E402


@pytest.mark.slow
@pytest.mark.heavy
def test_quick_cpu_check_runs_every_step_and_reports_its_figures(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "--quick", "--cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=1500)
    report = json.loads((tmp_path / "device_report.json").read_text())
    assert proc.returncode == 0, (report["failed"], [s["error"] for s in report["steps"] if s["error"]])
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == [name for name, _, _ in device_check.STEPS if name != "install"]
    assert all(s["status"] == "ok" for s in steps.values())
    f = {name: s["figures"] for name, s in steps.items()}
    assert f["machine"]["matmul_peak_tflops"] > 0 and f["machine"]["copy_bandwidth_gbs"] > 0
    assert f["cuda_tests"]["passed"] >= 3 and f["cuda_tests"]["failures"] == 0
    assert f["generate"]["torch_tokens_per_s"] > 0 and f["generate"]["hf_tokens_per_s"] > 0
    assert 0 < f["generate"]["torch_fraction_of_bandwidth_limit"] < 1
    assert 0 < f["learner"]["mfu"] < 1 and f["learner"]["largest_micro_batch_tokens"] >= 256
    assert f["grpo_step"]["generate_s"] > 0 and f["grpo_step"]["train_s"] > 0 and f["grpo_step"]["steps"] == 2
    assert f["recipe"]["steps"] == 2 and 0 <= f["recipe"]["final_heldout"] <= 1
    assert set(f["async"]["speedup"]) == {"async s=1"}
    assert "| learner | ok |" in (tmp_path / "device_report.md").read_text()


def test_a_failed_step_is_reported_with_its_figures_and_the_run_goes_on(tmp_path, monkeypatch):
    def fake_step(name, args, env, allowed, bandwidth):
        if name == "learner":
            raise device_check.StepFailed({"update_s": 1.5}, "OutOfMemoryError: at 65536 tokens")
        if name == "recipe":
            raise ValueError("boom")
        return {"copy_bandwidth_gbs": 3.0} if name == "machine" else {"seen_bandwidth": bandwidth}

    monkeypatch.setattr(device_check, "_step", fake_step)
    assert device_check.main(["--quick", "--cpu", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "device_report.json").read_text())
    assert report["failed"] == ["learner", "recipe"]
    steps = {s["step"]: s for s in report["steps"]}
    assert steps["learner"]["figures"] == {"update_s": 1.5} and "65536" in steps["learner"]["error"]
    assert steps["recipe"]["error"] == "ValueError: boom"
    assert steps["async"]["status"] == "ok" and steps["generate"]["figures"] == {"seen_bandwidth": 3.0}
    md = (tmp_path / "device_report.md").read_text()
    assert "| learner | failed |" in md and "## recipe: failed" in md


def test_a_spent_budget_skips_the_remaining_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(device_check, "_step", lambda *a: {})
    assert device_check.main(["--cpu", "--out", str(tmp_path), "--budget-s", "1"]) == 0
    report = json.loads((tmp_path / "device_report.json").read_text())
    assert {s["status"] for s in report["steps"]} == {"skipped"}


def test_training_flops_and_the_decode_limit_by_hand():
    from types import SimpleNamespace

    import torch

    cfg = SimpleNamespace(tie_word_embeddings=True, num_hidden_layers=2, hidden_size=4, num_attention_heads=2,
                          num_key_value_heads=1)
    model = SimpleNamespace(config=cfg, parameters=lambda: [torch.zeros(10), torch.zeros(5, 2)])
    # 6 x 20 params x 100 tokens + 12 x 2 layers x 4 hidden x 50 seq x 100 tokens
    assert bench_gpu.training_flops(model, 100, 50) == 6 * 20 * 100 + 12 * 2 * 4 * 50 * 100
    # 8 rows, context 10: KV bytes = 8 rows x 2 layers x 2 (k, v) x 1 head x 2 dims x 10 x 2 bytes = 1280;
    # 1e9 B/s over (720 + 1280) B per step = 5e5 steps/s, x 8 rows
    assert bench_gpu.decode_limit_tokens_per_s(cfg, 8, 10, 720, 1.0) == pytest.approx(8 * 1e9 / 2000)


def test_quick_shapes_keep_the_real_model_class():
    cfg = bench_gpu.shape_config("qwen2.5-0.5b", quick=True)
    real = bench_gpu.shape_config("qwen2.5-0.5b", quick=False)
    assert type(cfg) is type(real) and cfg.model_type == "qwen2"
    assert (real.hidden_size, real.num_hidden_layers, real.vocab_size) == (896, 24, 151936)
    assert cfg.vocab_size == 4096 and cfg.num_hidden_layers == 2


def test_steps_runs_only_the_named_steps_and_refuses_an_unknown_one(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(device_check, "_step", lambda name, *a: seen.append(name) or {})
    assert device_check.main(["--cpu", "--out", str(tmp_path), "--steps", "learner,recipe"]) == 0
    assert seen == ["learner", "recipe"]
    report = json.loads((tmp_path / "device_report.json").read_text())
    assert [s["step"] for s in report["steps"]] == ["learner", "recipe"]
    with pytest.raises(SystemExit):
        device_check.main(["--cpu", "--out", str(tmp_path), "--steps", "learner,warp_drive"])
    assert "warp_drive" in capsys.readouterr().err


def test_a_step_cut_short_takes_its_children_with_it(tmp_path):
    """The timeout kills the step's whole process group: a grandchild (a benchmark's worker holding GPU
    memory) does not outlive it."""
    pid_file = tmp_path / "grandchild.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    with pytest.raises(subprocess.TimeoutExpired):
        device_check._run([sys.executable, "-c", script], {}, timeout=3)
    pid = int(pid_file.read_text())
    import os
    import time

    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"grandchild {pid} outlived the step")
