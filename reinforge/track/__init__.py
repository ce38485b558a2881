"""Metric sinks: console progress, JSONL files (always), optional TensorBoard / W&B / MLflow, plots, report."""

from reinforge.track.report import write_report
from reinforge.track.sinks import (
    MetricsSink,
    MLflowSink,
    TensorBoardSink,
    WandbSink,
    build_sinks,
    close_sinks,
)

__all__ = ["MLflowSink", "MetricsSink", "TensorBoardSink", "WandbSink", "build_sinks", "close_sinks", "write_report"]
