"""scripts/overoptimisation.py: every variant is a valid run config, and a finished run reads back into
the table's figures (the measurement itself is in docs/rewards.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import overoptimisation  # noqa: E402

from reinforge.config import load_config  # noqa: E402


@pytest.mark.parametrize("variant", list(overoptimisation.VARIANTS))
def test_every_variant_is_a_valid_config(variant, tmp_path) -> None:
    overrides = [o.replace("{ensemble}", str(tmp_path / "ens")) for o in overoptimisation.VARIANTS[variant]]
    cfg = load_config("rlhf_arithmetic", overrides)
    assert cfg.reward.terms[0].name == "rm" and cfg.reward.terms[1].weight == 0.0  # the gold stays unseen


def test_a_finished_run_reads_back_into_the_table(tmp_path) -> None:
    rows = [{"step": s, "reward/term/rm": float(s), "reward/term/gold": 0.5 - 0.1 * s, "train/kl_ref": 0.2 * s}
            for s in range(1, 5)]
    records = [{"step": 0, "eval/heldout_acc": 0.4}, *rows, {"step": 4, "eval/heldout_acc": 0.1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    series = overoptimisation.read_run(tmp_path, steps=4)
    assert series["proxy"] == [1.0, 2.0, 3.0, 4.0] and series["heldout"] == [0.4, 0.1]
    table = overoptimisation.table({"none": {0: series, 1: series}}, window=2)
    assert "| none | 1.50 -> 3.50 | 0.350 -> 0.150 | 0.70 | 0.100, 0.100 | 0.100 |" in table
    with pytest.raises(SystemExit, match="not a finished run of 5 steps"):
        overoptimisation.read_run(tmp_path, steps=5)
