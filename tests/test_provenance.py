"""provenance.json: what a run directory records about the code, the machine and the command."""

import json
import subprocess
import sys

import torch

import reinforge
from reinforge.track import provenance
from reinforge.track.report import write_report


def test_record_appends_one_session_per_start_and_resume(tmp_path):
    first = provenance.record(tmp_path, seed=7)
    second = provenance.record(tmp_path, seed=7, resumed_from=40)
    sessions = json.loads((tmp_path / "provenance.json").read_text())["sessions"]
    assert sessions == provenance.read(tmp_path) == [first, second]
    assert "resumed_from_step" not in first and second["resumed_from_step"] == 40
    assert first["seed"] == 7 and first["command"] == sys.argv
    assert first["versions"]["torch"] == torch.__version__ and first["versions"]["reinforge"] == reinforge.__version__
    assert first["machine"]["torch_threads"] == torch.get_num_threads() and first["machine"]["cpu"]
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, replaced atomically


def test_git_commit_of_a_checkout_and_none_outside_one(tmp_path):
    assert provenance.git_state(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.txt").write_text("a")
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", *env, "-C", str(tmp_path), "add", "f.txt"], check=True)
    subprocess.run(["git", *env, "-C", str(tmp_path), "commit", "-qm", "x"], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "f.txt").write_text("b")
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": True}


def test_report_shows_every_session(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    page = write_report(tmp_path).read_text()
    assert "No provenance.json" in page
    provenance.record(tmp_path, seed=3)
    provenance.record(tmp_path, seed=3, resumed_from=12)
    page = write_report(tmp_path).read_text()
    assert "Provenance: started" in page and "Provenance: resume 1" in page
    assert "resumed from step 12" in page and f"torch {torch.__version__}" in page


def test_a_training_run_records_its_provenance(tmp_path):
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    cfg = load_config(None, [f"output_dir={tmp_path}", "name=p", "train.steps=1", "rollout.prompts_per_step=2",
                             "rollout.group_size=2", "task.heldout_size=4", "eval.every=0", "checkpoint.every=0",
                             "eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "seed=5"])
    run = train(cfg)
    (entry,) = provenance.read(run.run_dir)
    assert entry["seed"] == 5 and entry["versions"]["torch"] == torch.__version__
