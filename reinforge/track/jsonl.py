"""Append-only JSONL sinks (metrics.jsonl, samples.jsonl), truncatable on resume."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")

    def truncate_after_step(self, step: int) -> None:
        """Drop records of steps after ``step`` (written after the checkpoint a run resumes from)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in kept))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
