"""Optional metric sinks beside metrics.jsonl (always written): TensorBoard, Weights & Biases (offline),
MLflow (local sqlite store). Each imports its library only when built and logs every numeric value of a
metrics record at ``step = metrics["step"]``; ``close()`` may be called more than once.

    sinks = build_sinks(cfg.log.sinks, run_dir, cfg.model_dump(mode="json"))
"""

from __future__ import annotations

import logging
import numbers
import os
import re
from pathlib import Path
from typing import Any, Protocol

from reinforge.errors import ReinforgeError

SINK_NAMES = ("tensorboard", "wandb", "mlflow")


class MetricsSink(Protocol):
    def write(self, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def numeric_metrics(metrics: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """The step and the numeric values of a metrics record (bools, strings, ``step`` itself left out)."""
    step = metrics.get("step")
    if not isinstance(step, numbers.Integral) or isinstance(step, bool):
        raise ReinforgeError(f"metrics record without an integer 'step': {sorted(metrics)}")
    values = {k: float(v) for k, v in metrics.items()
              if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)}
    return int(step), values


def _missing(package: str, extra: str) -> ReinforgeError:
    return ReinforgeError(f"log.sinks: '{extra}' needs {package}: pip install 'reinforge[{extra}]'")


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"algo": {"kl": {"coef": 0}}} -> {"algo.kl.coef": 0}."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, name + "."))
        else:
            out[name] = value
    return out


class TensorBoardSink:
    """Scalars in ``run_dir/tensorboard/`` (torch.utils.tensorboard; needs the ``tensorboard`` package)."""

    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing("tensorboard", "tensorboard") from None
        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, metrics: dict[str, Any]) -> None:
        step, values = numeric_metrics(metrics)
        if self._writer is None:
            raise ReinforgeError("TensorBoardSink.write after close()")
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbSink:
    """A W&B run in offline mode under ``run_dir/wandb/``; never touches the network
    (upload later with ``wandb sync run_dir/wandb/offline-run-*``)."""

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing("wandb", "wandb") from None
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self._run: Any = wandb.init(
            project=project, name=run_dir.name, dir=str(run_dir), config=config, mode="offline",
            reinit="create_new", settings=wandb.Settings(silent=True),
        )
        self.run_path = Path(self._run.dir).parent  # run_dir/wandb/offline-run-<time>-<id>/

    def write(self, metrics: dict[str, Any]) -> None:
        step, values = numeric_metrics(metrics)
        if self._run is None:
            raise ReinforgeError("WandbSink.write after close()")
        self._run.log(values, step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


_MLFLOW_BAD = re.compile(r"[^/\w.\- ]")


def mlflow_name(key: str) -> str:
    """An MLflow-valid metric or param name: it allows letters, digits, '_', '-', '.', ' ', '/' (and ':'
    outside Windows); '@' becomes '_at_' (``eval/pass@4`` -> ``eval/pass_at_4``), anything else '_'."""
    name = _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))
    name = re.sub(r"/+", "/", name).strip("/")  # MLflow rejects names that normalise as paths differently
    return name or "_"


class MLflowSink:
    """An MLflow run in a local sqlite store ``run_dir/mlflow.db`` (artifacts in ``run_dir/mlflow-artifacts``).
    Read it with ``mlflow ui --backend-store-uri sqlite:///run_dir/mlflow.db``. MLflow telemetry is off
    unless MLFLOW_DISABLE_TELEMETRY is already set."""

    def __init__(self, run_dir: Path, experiment: str, config: dict[str, Any]) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        try:
            import alembic  # noqa: F401 - the sqlite store needs them; mlflow-skinny does not bring them
            import sqlalchemy  # noqa: F401
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing("mlflow (mlflow-skinny, sqlalchemy, alembic)", "mlflow") from None
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial tables" lines
        run_dir = Path(run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = f"sqlite:///{run_dir / 'mlflow.db'}"
        self._metric_cls, self._client = Metric, MlflowClient(tracking_uri=self.tracking_uri)
        exp = self._client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else self._client.create_experiment(
            experiment, artifact_location=(run_dir / "mlflow-artifacts").as_uri())
        self.run_id: str | None = self._client.create_run(exp_id, run_name=run_dir.name).info.run_id
        params = [Param(mlflow_name(k), str(v)[:6000]) for k, v in flatten_config(config).items()]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params
            self._client.log_batch(self.run_id, params=params[i:i + 100])
        self._client.log_dict(self.run_id, config, "config.json")

    def write(self, metrics: dict[str, Any]) -> None:
        import time

        step, values = numeric_metrics(metrics)
        if self.run_id is None:
            raise ReinforgeError("MLflowSink.write after close()")
        now = int(time.time() * 1000)
        batch = [self._metric_cls(mlflow_name(k), v, now, step) for k, v in values.items()]
        for i in range(0, len(batch), 1000):  # log_batch takes at most 1000 metrics
            self._client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def close(self) -> None:
        if self.run_id is not None:
            self._client.set_terminated(self.run_id)
            self.run_id = None


def build_sinks(names: list[str], run_dir: Path, config: dict[str, Any], project: str = "reinforge"
                ) -> list[MetricsSink]:
    """The sinks named in ``log.sinks`` (JSONL is always written and is not one of them); ``project`` is
    the W&B project and the MLflow experiment, the run is named after ``run_dir``."""
    unknown = [n for n in names if n not in SINK_NAMES]
    if unknown:
        raise ReinforgeError(f"log.sinks: unknown sink(s) {unknown}; allowed: {', '.join(SINK_NAMES)} "
                             "(metrics.jsonl is always written)")
    if len(set(names)) != len(names):
        raise ReinforgeError(f"log.sinks: a sink is listed twice: {names}")
    run_dir = Path(run_dir)
    makers = {
        "tensorboard": lambda: TensorBoardSink(run_dir),
        "wandb": lambda: WandbSink(run_dir, project, config),
        "mlflow": lambda: MLflowSink(run_dir, project, config),
    }
    sinks: list[MetricsSink] = []
    try:
        for name in names:
            sinks.append(makers[name]())
    except BaseException:
        close_sinks(sinks)
        raise
    return sinks


def close_sinks(sinks: list[MetricsSink]) -> None:
    """Close every sink, even if one fails (the first error is raised after the rest are closed)."""
    error: BaseException | None = None
    for sink in sinks:
        try:
            sink.close()
        except Exception as e:  # close the others first
            error = error or e
    if error is not None:
        raise error
