"""The command line: fast help, clear errors without tracebacks, eval and algos output."""

import json
import subprocess
import sys
import time

import pytest


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "reinforge.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_help_is_fast_and_lists_commands():
    _run("--help")  # warm the filesystem cache
    t0 = time.perf_counter()
    out = _run("--help")
    elapsed = time.perf_counter() - t0
    assert out.returncode == 0
    for cmd in ("train", "eval", "algos"):
        assert cmd in out.stdout
    assert elapsed < 1.0, f"reinforge --help took {elapsed:.2f} s"


def test_bad_override_fails_before_work_with_one_message(tmp_path):
    out = _run("train", "algo.policy_loss.clip_hgh=0.3", cwd=tmp_path)
    assert out.returncode == 2
    assert "algo.policy_loss.clip_hgh" in out.stderr and "clip_high" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "runs").exists()


def test_missing_model_and_bad_data_messages(tmp_path):
    out = _run("train", "model.path=/no/such/model", cwd=tmp_path)
    assert out.returncode == 2 and "model.path" in out.stderr and "Traceback" not in out.stderr
    deep = tmp_path / ("a_long_directory_name_" * 5)  # a message longer than a terminal line is not wrapped
    deep.mkdir()
    bad = deep / "d.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n[1, 2]\n')
    out = _run("train", "task.kind=jsonl", f"task.path={bad}", "task.heldout_size=1", cwd=tmp_path)
    assert out.returncode == 2 and f"{bad}:2" in out.stderr and "Traceback" not in out.stderr


def test_algos_lists_registered_parts():
    out = _run("algos")
    assert out.returncode == 0
    for name in ("grpo", "ppo_clip", "token_mean", "k3"):
        assert name in out.stdout


@pytest.mark.slow
def test_eval_reports_greedy_pass_maj_with_intervals_and_curves(tmp_path):
    out_file, plot = tmp_path / "eval.json", tmp_path / "passk.png"
    out = _run("eval", "--model", "tiny-base", "--model", "tiny-base", "--samples", "4", "--heldout-size", "60",
               "--out", str(out_file), "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    result = json.loads(out_file.read_text())["models"]["tiny-base"]
    assert set(result["pass_at_k"]) == {"1", "2", "4"} and set(result["maj_at_k"]) == {"1", "2", "4"}
    p = result["pass_at_k"]
    assert 0 < p["1"] <= p["2"] <= p["4"] <= 1
    assert p["1"] == pytest.approx(result["mean_at_n"])  # pass@1 is the mean correctness
    assert 0.1 < result["greedy_accuracy"] < 0.7  # the shipped base is promising but imperfect
    for name, (lo, hi) in result["confidence_intervals_95"].items():
        value = result["greedy_accuracy"] if name == "greedy_accuracy" else None
        assert 0 <= lo <= hi <= 1, name
        if value is not None:
            assert lo <= value <= hi
    assert list(result["pass_curve"]) == ["1", "2", "3", "4"]
    assert "pass@4" in out.stdout and "95% CI" in out.stdout
    assert plot.stat().st_size > 1000
    bad = _run("eval", "--model", "tiny-base", "--samples", "4", "--ks", "8", "--out", str(out_file))
    assert bad.returncode == 2 and "--ks" in bad.stderr


def test_eval_takes_task_and_reward_from_a_recipe(tmp_path):
    data = tmp_path / "t.csv"
    data.write_text("question,solution,level\n" + "".join(f"{a}+{a}=,{2 * a},{'easy' if a < 30 else 'hard'}\n"
                                                          for a in range(10, 50)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"task: {{kind: table, path: {data}, heldout_size: 20, as_chat: true, "
                      "columns: {prompt: question, answer: solution, difficulty: level}}\n")
    out_file = tmp_path / "e.json"
    out = _run("eval", "--model", "tiny-base", "--recipe", str(recipe), "--samples", "2", "--out", str(out_file))
    assert out.returncode == 0, out.stderr
    result = json.loads(out_file.read_text())["models"]["tiny-base"]
    assert result["num_prompts"] == 20
    assert set(result["breakdown"]["difficulty"]) <= {"easy", "hard"} and result["breakdown"]["difficulty"]
