"""Checkpoints carry a manifest of checksums: a truncated or corrupt checkpoint is detected on
resume, reported, and the one before it used (exactly); a full disk stops the run with a clear
message and leaves the previous checkpoint intact."""

import errno
import json

import pytest
import torch
from safetensors.torch import load_file

from reinforge.config import load_config
from reinforge.errors import ReinforgeError
from reinforge.learn import checkpoint
from reinforge.learn.checkpoint import list_checkpoints, verify_checkpoint
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl

TIMING = ("time/", "perf/", "memory/")


def _cfg(tmp_path, name, *overrides):
    return load_config(None, [
        f"output_dir={tmp_path}", f"name={name}", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "train.steps=6", "task.heldout_size=8", "train.time_limit_s=0", "eval.every=0", "eval.final_samples=0",
        "log.report=false", "checkpoint.every=2", "checkpoint.keep=3", *overrides,
    ])


def _untimed(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path):
    run = train(_cfg(tmp_path, "m", "train.steps=2"))
    (ckpt,) = list_checkpoints(run.run_dir)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    files = {f.name for f in ckpt.iterdir() if f.is_file() and f.name != "manifest.json"}
    assert manifest["step"] == 2 and set(manifest["files"]) == files
    assert {"model.safetensors", "trainer.pt", "rng.pt", "state.json"} <= files
    assert verify_checkpoint(ckpt) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_newest_checkpoint_is_reported_and_the_previous_one_resumed_exactly(tmp_path, damage, capsys):
    straight = train(_cfg(tmp_path, "straight"))
    broken = train(_cfg(tmp_path, "broken", "train.steps=6"))
    newest = list_checkpoints(broken.run_dir)[-1]
    assert newest.name == "step_6"
    weights = newest / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        weights.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    else:
        (newest / "trainer.pt").unlink()
    problem = verify_checkpoint(newest)
    assert problem is not None and {"truncate": "truncated", "flip": "corrupt", "delete": "missing"}[damage] in problem
    resumed = train(resume=broken.run_dir)
    err = capsys.readouterr().err
    assert "step_6 is damaged" in err and "resuming from" in err and "step_4" in err
    assert resumed.steps == 6
    # steps 5 and 6 run again from the step-4 checkpoint: the same as the uninterrupted run
    assert _untimed(read_jsonl(resumed.run_dir / "metrics.jsonl")) == _untimed(read_jsonl(straight.run_dir / "metrics.jsonl"))
    a = load_file(straight.run_dir / "checkpoints/step_6/model.safetensors")
    b = load_file(resumed.run_dir / "checkpoints/step_6/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_every_checkpoint_damaged_is_a_clear_error(tmp_path):
    run = train(_cfg(tmp_path, "all", "train.steps=2"))
    for ckpt in list_checkpoints(run.run_dir):
        (ckpt / "rng.pt").write_bytes(b"junk")
    with pytest.raises(ReinforgeError, match="no undamaged checkpoint"):
        train(resume=run.run_dir)


def test_full_disk_stops_the_run_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    save = torch.save
    calls = {"n": 0}

    def disk_full_at_step_4(obj, f, *args, **kwargs):
        if "step_4" in str(f):
            calls["n"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", disk_full_at_step_4)
    with pytest.raises(ReinforgeError, match=r"no space left on the device while writing the step-4 checkpoint.*"
                                              r"step_2 is intact.*--resume"):
        train(_cfg(tmp_path, "full"))
    assert calls["n"] == 1
    ckpts = list_checkpoints(tmp_path / "full")
    assert [c.name for c in ckpts] == ["step_2"] and verify_checkpoint(ckpts[0]) is None
    assert not list((tmp_path / "full" / "checkpoints").glob(".tmp_*"))  # no half-written directory left
