import csv
import json
import logging
import random

import pytest

from reinforge.data.columns import ColumnsConfig
from reinforge.data.tabular import prompt_fingerprint, read_table_tasks, table_splits
from reinforge.errors import DataError

ROWS = [
    {
        "uid": f"q{i}",
        "question": f"What is {i}+{i}?",
        "messages": [{"role": "user", "content": f"{i}*2=?"}],
        "solution": 2 * i,
        "level": i % 2,
        "src": "synthetic",
    }
    for i in range(4)
]
COLS = ColumnsConfig(prompt="question", answer="solution", id="uid", difficulty="level", metadata=["src"])


def write(fmt: str, rows: list[dict], tmp_path, name: str = "data"):
    """Write ``rows`` in one format; returns (path, reader kwargs)."""
    if fmt == "jsonl":
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path, {}
    if fmt == "csv":
        path = tmp_path / f"{name}.csv"
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()} for r in rows)
        return path, {"json_columns": ("messages",)}
    if fmt == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)  # rows span batches
        return path, {}
    datasets = pytest.importorskip("datasets")
    if fmt == "hf_disk":
        path = tmp_path / name
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
        return path, {}
    if fmt == "hf_dict":
        path = tmp_path / name
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                              "test": datasets.Dataset.from_list(rows[:1])}).save_to_disk(str(path))
        return path, {"split": "train"}
    assert fmt == "hf_files"  # JSON lines read by datasets.load_dataset("json")
    path = tmp_path / f"{name}.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, {"cache_dir": tmp_path / "hf-cache"}


FORMATS = ["jsonl", "csv", "parquet", "hf_disk", "hf_dict", "hf_files"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_mapped_columns(fmt, tmp_path):
    path, kw = write(fmt, ROWS, tmp_path)
    tasks = read_table_tasks(path, COLS, **kw)
    assert [t.id for t in tasks] == ["q0", "q1", "q2", "q3"]
    assert [t.prompt for t in tasks] == [f"What is {i}+{i}?" for i in range(4)]
    assert [t.answer for t in tasks] == ["0", "2", "4", "6"]
    for i, t in enumerate(tasks):
        assert set(t.metadata) == {"difficulty", "src"}
        assert str(t.metadata["difficulty"]) == str(i % 2) and t.metadata["src"] == "synthetic"

    chat = read_table_tasks(path, ColumnsConfig(prompt="messages", answer="solution"), **kw)
    assert chat[3].prompt == [{"role": "user", "content": "3*2=?"}]
    stem = path.stem if path.suffix else path.name
    assert [t.id for t in chat] == [f"{stem}:{i}" for i in range(4)]
    # metadata=None copies every column not mapped to a role
    assert set(chat[0].metadata) == {"uid", "question", "level", "src"}


def test_system_column_as_chat_and_tests_column(tmp_path):
    rows = [
        {"q": "add", "a": "x", "sys": "Be brief.", "tests": ["assert f(1) == 2"]},
        {"q": "echo", "a": "y", "sys": "", "tests": [{"input": "1\n", "output": "1\n"}]},
        {"q": "inc", "a": "z", "sys": "", "tests": "assert g() == 0"},
    ]
    path, _ = write("jsonl", rows, tmp_path)
    tasks = read_table_tasks(path, ColumnsConfig(prompt="q", answer="a", system="sys", tests="tests",
                                                 metadata=[]), as_chat=True)
    assert tasks[0].prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add"}]
    assert tasks[1].prompt == [{"role": "user", "content": "echo"}]  # an empty system cell adds nothing
    assert tasks[0].metadata == {"asserts": ["assert f(1) == 2"]}
    assert tasks[1].metadata == {"io": [{"input": "1\n", "output": "1\n"}]}
    assert tasks[2].metadata == {"asserts": "assert g() == 0"}
    raw = read_table_tasks(path, ColumnsConfig(prompt="q", answer=None, metadata=[]))
    assert raw[0].prompt == "add" and raw[0].answer == ""


def _raises(match: str, path, cols=None, **kw):
    with pytest.raises(DataError, match=match) as e:
        read_table_tasks(path, cols, **kw)
    return str(e.value)


def test_row_errors_name_file_line_and_column(tmp_path):
    j = tmp_path / "bad.jsonl"
    j.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "result": "2"}\n')
    msg = _raises(r"bad\.jsonl:3: missing column 'answer'", j)
    assert "columns: ['prompt', 'result']" in msg
    j.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": [{"role": "robot", "content": "x"}], "answer": "1"}\n')
    _raises(r"bad\.jsonl:2: column 'prompt', message 0: unknown role 'robot'", j)
    j.write_text('{"prompt": [{"role": "user"}], "answer": "1"}\n')
    _raises(r"bad\.jsonl:1: column 'prompt', message 0: expected \{'role': str, 'content': str\}", j)
    j.write_text('{"prompt": 7, "answer": "1"}\n')
    _raises(r"bad\.jsonl:1: column 'prompt' must be a string or a non-empty list", j)
    j.write_text('{"prompt": "a", "answer": null}\n')
    _raises(r"bad\.jsonl:1: column 'answer' \(answer\) is empty", j)
    j.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "a", "answer"\n')
    _raises(r"bad\.jsonl:2: not valid JSON", j)
    j.write_text('{"id": "x", "prompt": "a", "answer": "1"}\n{"id": "x", "prompt": "b", "answer": "2"}\n')
    _raises(r"bad\.jsonl:2: duplicate id 'x' \(first at .*bad\.jsonl:1\)", j, ColumnsConfig(id="id"))
    j.write_text('{"prompt": "a", "answer": "1"}\n')
    _raises(r"bad\.jsonl:1: missing column 'level'", j, ColumnsConfig(metadata=["level"]))
    _raises(r"bad\.jsonl:1: missing column 'tests'", j, ColumnsConfig(tests="tests"))

    c = tmp_path / "bad.csv"
    c.write_text('prompt,answer\n"multi\nline",1\nb\n')  # the short record starts on line 4
    msg = _raises(r"bad\.csv:4: fewer fields than the header: no value for column 'answer'", c)
    assert "columns: ['prompt', 'answer']" in msg
    c.write_text("prompt,answer\na,1,extra\n")
    _raises(r"bad\.csv:2: 3 fields, but the header has 2", c)
    c.write_text('q,answer\n"[{""role"": ""user""",1\n')
    _raises(r"bad\.csv:2: column 'q' is not valid JSON", c, ColumnsConfig(prompt="q"), json_columns=("q",))
    c.write_text("q,answer\nhello,\n")
    _raises(r"bad\.csv:2: column 'answer' \(answer\) is empty", c, ColumnsConfig(prompt="q"))

    (tmp_path / "empty.csv").write_text("prompt,answer\n")
    _raises("the dataset is empty", tmp_path / "empty.csv")
    _raises("no such file", tmp_path / "missing.parquet")
    (tmp_path / "x.txt").write_text("hi")
    _raises(r"unknown file type '\.txt'", tmp_path / "x.txt")


def test_columnar_errors_name_row_index(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "a", "answer": "1"}] * 2), p)
    msg = _raises(r"bad\.parquet: row 0: missing column 'prompt'", p)
    assert "columns: ['answer', 'text']" in msg
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": "1"}] * 3 + [{"prompt": None, "answer": "2"}]),
                   p, row_group_size=2)
    _raises(r"bad\.parquet: row 3: column 'prompt' is null", p)
    (tmp_path / "junk.parquet").write_text("not parquet")
    _raises(r"junk\.parquet: not a readable Parquet file", tmp_path / "junk.parquet")

    datasets = pytest.importorskip("datasets")
    d = tmp_path / "ds"
    datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}, {"prompt": "", "answer": "2"}]).save_to_disk(str(d))
    _raises(r"ds: row 1: column 'prompt' is empty", d)
    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}]),
                          "test": datasets.Dataset.from_list([{"q": "b", "answer": "2"}])}).save_to_disk(str(dd))
    _raises(r"dd: a DatasetDict with splits \['test', 'train'\]; choose one with task.split", dd)
    _raises(r"dd: a DatasetDict with splits \['test', 'train'\]; no split 'dev'", dd, split="dev")
    _raises(r"dd \[test\]: row 0: missing column 'prompt'", dd, split="test")
    _raises("not a dataset written by datasets' save_to_disk", tmp_path)


def test_hf_data_files_glob(tmp_path):
    pytest.importorskip("datasets")
    for shard in range(2):
        (tmp_path / f"part-{shard}.jsonl").write_text(
            "".join(json.dumps({"prompt": f"p{shard}{i}", "answer": str(i)}) + "\n" for i in range(3)))
    tasks = read_table_tasks(tmp_path / "part-*.jsonl", cache_dir=tmp_path / "cache")
    assert sorted(t.prompt for t in tasks) == sorted(f"p{s}{i}" for s in range(2) for i in range(3))


def _dup_rows() -> list[dict]:
    """60 rows, 40 distinct prompts: prompts 0..9 appear 3 times (as chat, and with other whitespace)."""
    rows = [{"prompt": f"question {i}", "answer": str(i)} for i in range(40)]
    for i in range(10):
        rows.append({"prompt": [{"role": "user", "content": f"question  {i}"}], "answer": str(i)})
        rows.append({"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": f" question {i}\n"}],
                     "answer": str(i)})
    return rows


def test_seeded_split_never_puts_a_prompt_on_both_sides(tmp_path):
    rows = _dup_rows()
    path, _ = write("jsonl", rows, tmp_path)
    s = table_splits(path, heldout_size=12, seed=3)
    train_fp = {prompt_fingerprint(t.prompt) for t in s.train}
    held_fp = {prompt_fingerprint(t.prompt) for t in s.heldout}
    assert len(s.heldout) == 12 and len(s.train) == len(rows) - 12
    assert not train_fp & held_fp
    assert len(train_fp | held_fp) == 40  # the three spellings of a duplicated prompt are one prompt
    # deterministic from the seed, and independent of the row order in the file
    assert [t.id for t in table_splits(path, heldout_size=12, seed=3).heldout] == [t.id for t in s.heldout]
    random.Random(0).shuffle(rows)
    shuffled, _ = write("jsonl", rows, tmp_path, name="shuffled")
    again = table_splits(shuffled, heldout_size=12, seed=3)
    assert {prompt_fingerprint(t.prompt) for t in again.heldout} == held_fp
    other = table_splits(path, heldout_size=12, seed=4)
    assert {prompt_fingerprint(t.prompt) for t in other.heldout} != held_fp
    with pytest.raises(DataError, match=r"heldout_size=60 must be in 0..59 \(60 rows\)"):
        table_splits(path, heldout_size=60)


def test_heldout_file_removes_its_prompts_from_training(tmp_path, caplog):
    train, _ = write("jsonl", _dup_rows(), tmp_path, name="train")
    held, _ = write("csv", [{"prompt": f"question {i}", "answer": str(i)} for i in (0, 1, 30)], tmp_path, name="held")
    with caplog.at_level(logging.WARNING, logger="reinforge.data.tabular"):
        s = table_splits(train, held)
    assert [t.prompt for t in s.heldout] == ["question 0", "question 1", "question 30"]
    assert len(s.train) == 60 - 7  # 3 spellings each of prompts 0 and 1, and prompt 30
    assert not {prompt_fingerprint(t.prompt) for t in s.train} & {prompt_fingerprint(t.prompt) for t in s.heldout}
    assert "dropped 7 training rows" in caplog.text


def test_heldout_split_of_a_saved_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "dd"
    train = [{"prompt": f"p{i}", "answer": str(i)} for i in range(6)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(train),
                          "test": datasets.Dataset.from_list(train[:2])}).save_to_disk(str(path))
    s = table_splits(path, path, split="train", heldout_split="test")
    assert [t.prompt for t in s.heldout] == ["p0", "p1"] and [t.prompt for t in s.train] == ["p2", "p3", "p4", "p5"]
