"""Metric sinks: console progress, JSONL files, plots."""
