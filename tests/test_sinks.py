"""Optional metric sinks, each tested offline by reading back what it wrote."""

import random
import struct
import sys
import time

import numpy as np
import pytest

from reinforge.errors import ReinforgeError
from reinforge.track.sinks import (
    MLflowSink,
    TensorBoardSink,
    WandbSink,
    build_sinks,
    close_sinks,
    mlflow_name,
    numeric_metrics,
)


def _records(n: int = 4, seed: int = 0) -> list[dict]:
    """Metrics records shaped like the loop's: a step-0 evaluation, then training steps with nested
    keys, an '@' key, and values that must not be logged (a string, a bool)."""
    rng = random.Random(seed)
    out = [{"step": 0, "eval/heldout_acc": rng.random()}]
    for step in range(1, n + 1):
        out.append({
            "step": step, "policy_version": step, "reward/mean": rng.random(), "train/mismatch/is_weight": rng.random(),
            "time/step_s": rng.uniform(0.1, 1.0), "eval/pass@4": rng.random(), "note": "text", "flag": True,
        })
    return out


def _expected(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """key -> [(step, value)] of every numeric value, as the sinks should log it."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        step, values = numeric_metrics(r)
        for k, v in values.items():
            series.setdefault(k, []).append((step, v))
    return series


CONFIG = {"name": "t", "algo": {"advantage": "grpo", "kl": {"coef": 0.01}}, "train": {"lr": 1e-4, "steps": 4}}


def test_numeric_metrics_keeps_numbers_only():
    step, values = numeric_metrics({"step": 3, "a/b": 1, "c": 0.5, "s": "x", "f": False, "n": None,
                                    "np": np.float32(0.25), "npi": np.int64(2)})
    assert step == 3 and values == {"a/b": 1.0, "c": 0.5, "np": 0.25, "npi": 2.0}
    assert numeric_metrics({"step": np.int64(4)})[0] == 4
    with pytest.raises(ReinforgeError, match="step"):
        numeric_metrics({"a": 1.0})


def test_build_sinks_rejects_unknown_and_duplicate_names(tmp_path):
    with pytest.raises(ReinforgeError) as err:
        build_sinks(["tensorboard", "comet"], tmp_path, CONFIG)
    assert "comet" in str(err.value) and all(n in str(err.value) for n in ("tensorboard", "wandb", "mlflow"))
    with pytest.raises(ReinforgeError, match="twice"):
        build_sinks(["wandb", "wandb"], tmp_path, CONFIG)
    assert build_sinks([], tmp_path, CONFIG) == []


@pytest.mark.parametrize("name, modules", [
    ("tensorboard", ["torch.utils.tensorboard"]),
    ("wandb", ["wandb"]),
    ("mlflow", ["mlflow", "mlflow.entities", "mlflow.tracking"]),
    ("mlflow", ["sqlalchemy"]),  # mlflow-skinny alone has no sqlite store
])
def test_missing_library_names_the_pip_command(tmp_path, monkeypatch, name, modules):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(ReinforgeError) as err:
        build_sinks([name], tmp_path, CONFIG)
    assert f"pip install 'reinforge[{name}]'" in str(err.value)


def test_mlflow_names_are_valid_for_mlflow():
    validation = pytest.importorskip("mlflow.utils.validation", reason="mlflow not installed (reinforge[mlflow])")
    assert mlflow_name("eval/pass@4") == "eval/pass_at_4"
    assert mlflow_name("train/mismatch/is_weight") == "train/mismatch/is_weight"  # '/' is allowed as is
    for key in ["eval/pass@4", "a//b/", "x<y>", "maj@16", "/lead", "é ok"]:
        validation._validate_metric_name(mlflow_name(key))  # raises on an invalid name
    with pytest.raises(Exception, match="Names may only contain"):
        validation._validate_metric_name("eval/pass@4")  # why we sanitise


def test_tensorboard_sink_reads_back(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (reinforge[tensorboard])")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = _records()
    sink = TensorBoardSink(tmp_path)
    for r in records:
        sink.write(r)
    sink.close()
    sink.close()  # safe twice
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    expected = _expected(records)
    assert set(acc.Tags()["scalars"]) == set(expected)
    for key, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in points]
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6)  # stored as float32
    with pytest.raises(ReinforgeError, match="after close"):
        sink.write(records[1])


def _wandb_records(path) -> list:
    """Records of a W&B transaction log (run-<id>.wandb): a 7-byte header (':W&B', magic 0xBEE1, version),
    then LevelDB-log framing: 32 KiB blocks of chunks (crc32c u32, length u16, type u8: 1 full, 2 first,
    3 middle, 4 last), each record a serialised wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def _complete_wandb_log(path, timeout: float = 10.0) -> list:
    """The log's records once it holds the run's exit record: wandb's finish() can return before its
    service (wandb-core) has flushed the log to disk (seen: only the 7-byte header for ~50 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        recs = _wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)


def test_wandb_offline_sink_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (reinforge[wandb])")
    import json

    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home" / var.lower()))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there: offline or fail
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    records = _records()
    sink = WandbSink(run_dir, "proj", CONFIG)
    for r in records:
        sink.write(r)
    sink.close()
    sink.close()  # safe twice
    assert sink.run_path.parent == run_dir / "wandb" and sink.run_path.name.startswith("offline-run-")
    (log,) = sink.run_path.glob("run-*.wandb")
    recs = _complete_wandb_log(log)
    history: dict[str, list[tuple[int, float]]] = {}
    for rec in recs:
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            for k, v in items.items():
                if not k.startswith("_"):
                    history.setdefault(k, []).append((items["_step"], v))
    expected = _expected(records)
    assert "exit" in [r.WhichOneof("record_type") for r in recs], "no exit record: the run did not finish"
    assert set(history) == set(expected)
    for key, points in expected.items():
        assert [s for s, _ in history[key]] == [s for s, _ in points]
        assert [v for _, v in history[key]] == pytest.approx([v for _, v in points])
    (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert {k: config[k] for k in CONFIG} == CONFIG
    assert run.project == "proj" and run.display_name == "run"


def test_mlflow_sqlite_sink_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow not installed (reinforge[mlflow])")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    records = _records()
    sink = MLflowSink(tmp_path, "exp", CONFIG)
    run_id = sink.run_id
    for r in records:
        sink.write(r)
    sink.close()
    sink.close()  # safe twice
    assert (tmp_path / "mlflow.db").is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    assert client.get_experiment(run.info.experiment_id).name == "exp"
    expected = _expected(records)
    assert set(run.data.metrics) == {mlflow_name(k) for k in expected}
    for key, points in expected.items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, mlflow_name(key)))
        assert [s for s, _ in got] == [s for s, _ in points]
        assert [v for _, v in got] == pytest.approx([v for _, v in points])
    assert run.data.params["algo.kl.coef"] == str(CONFIG["algo"]["kl"]["coef"])
    assert run.data.params["train.lr"] == str(CONFIG["train"]["lr"])
    artifact = tmp_path / "mlflow-artifacts" / run_id / "artifacts" / "config.json"
    assert artifact.is_file()


def test_build_sinks_builds_and_closes_the_named_sinks(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (reinforge[tensorboard])")
    sinks = build_sinks(["tensorboard"], tmp_path, CONFIG)
    assert [type(s) for s in sinks] == [TensorBoardSink]
    for r in _records(2):
        for s in sinks:
            s.write(r)
    close_sinks(sinks)
    close_sinks(sinks)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
