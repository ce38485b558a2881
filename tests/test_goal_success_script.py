"""scripts/goal_success.py: the share of training episodes that reached their goal, per window of env
steps, on a hand-written metrics.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from goal_success import training_success  # noqa: E402


def test_training_success_per_window(tmp_path):
    # 50-step episodes ending at steps 50, 100, ..., 300; returns: -50 (missed), -49 (reached once), ...
    returns = [-50.0, -49.0, -50.0, -10.0, -50.0, -50.0]
    lines = [json.dumps({"step": 1, "env_steps": 1})]  # a record without an ended episode is skipped
    lines += [json.dumps({"step": 50 * (i + 1), "env_steps": 50 * (i + 1), "episode/return_mean": r})
              for i, r in enumerate(returns)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    # windows (0, 100], (100, 200], (200, 300]: {-50, -49}, {-50, -10}, {-50, -50}
    assert training_success(tmp_path, 50, 100) == [0.5, 0.5, 0.0]
    assert training_success(tmp_path, 50, 300) == [2 / 6]
