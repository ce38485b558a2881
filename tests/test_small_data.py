"""A small data file trains as it is: the held-out split of a file is a share of its rows (at most
``task.heldout_max``) unless ``task.heldout_size`` is given, and a size the file cannot hold is refused
naming both."""

from __future__ import annotations

import json

import pytest

from reinforge.config import load_config
from reinforge.data.sources import build_task_splits
from reinforge.errors import DataError


def _file(tmp_path, rows: int):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(rows)))
    (tmp_path / "my_reward.py").write_text(
        "def score(task, completion):\n    return float(completion.strip() == task.answer)\n")
    return path


def test_a_300_row_file_splits_a_tenth_off_and_the_cap_holds_for_a_large_one(tmp_path):
    path = _file(tmp_path, 300)
    cfg = load_config(None, ["task.kind=jsonl", f"task.path={path}", "task.columns.prompt=question"])
    splits = build_task_splits(cfg.task)
    assert (len(splits.train), len(splits.heldout)) == (270, 30)
    assert cfg.task.heldout_rows(20_000) == 500 and cfg.task.heldout_rows(3) == 1
    table = load_config(None, ["task.kind=table", f"task.path={path}", "task.columns.prompt=question",
                               "task.heldout_fraction=0.2"])
    assert len(build_task_splits(table.task).heldout) == 60
    assert load_config(None).task.heldout_size == 500  # the built-in task keeps its 500


def test_a_held_out_size_the_file_cannot_hold_is_refused_with_both_sizes(tmp_path):
    path = _file(tmp_path, 300)
    cfg = load_config(None, ["task.kind=jsonl", f"task.path={path}", "task.columns.prompt=question",
                             "task.heldout_size=300"])
    with pytest.raises(DataError, match=r"task.heldout_size=300 leaves no training rows \(300 rows\)"):
        build_task_splits(cfg.task)


@pytest.mark.slow
def test_a_300_row_file_with_a_reward_file_trains_with_only_the_path_and_the_column_mapping(tmp_path):
    from reinforge.orchestrate.run import train

    path = _file(tmp_path, 300)
    given = ["task.kind=jsonl", f"task.path={path}", "task.columns.prompt=question",
             f"task.verifier={tmp_path / 'my_reward.py'}:score"]
    tiny = [f"output_dir={tmp_path}", "train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "eval.final_samples=0", "eval.every=0", "log.report=false", "checkpoint.every=0"]  # only to be quick
    result = train(load_config(None, [*given, *tiny]))
    assert result.steps == 2 and 0.0 <= result.heldout_after <= 1.0
