"""scripts/compare_methods.py: every variant of every family is a valid config, and a run is summarised
from its metrics (held-out accuracy after, the family's metric over the last steps, samples)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import compare_methods  # noqa: E402

from reinforge.config import load_config  # noqa: E402


@pytest.mark.parametrize("family,variant", [(f, v) for f, spec in compare_methods.FAMILIES.items()
                                            for v in spec["variants"]])
def test_every_variant_loads(family, variant, tmp_path):
    spec = compare_methods.FAMILIES[family]
    cfg = load_config(spec.get("recipe"), [*compare_methods.COMMON, *compare_methods.batch_shape(family),
                                           *spec["base"], *compare_methods.prompt_file(family, tmp_path),
                                           *spec["variants"][variant], f"output_dir={tmp_path}"])
    assert cfg.rollout.group_size == 8 and cfg.train.time_limit_s == 0
    assert cfg.rollout.prompts_per_step == spec.get("prompts_per_step", 16)


def test_summary_reads_the_last_steps(tmp_path):
    rows = [{"step": 0, "eval/heldout_acc": 0.25}]
    rows += [{"step": k, "reward/mean": 0.1, "rollout/sampled": 128.0, "response/length_mean": float(k)}
             for k in range(1, 6)]
    rows.append({"step": 5, "eval/heldout_acc": 0.5})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    after, metric, samples = compare_methods.summary(str(tmp_path), "response/length_mean", window=2)
    assert (after, metric, samples) == (0.5, 4.5, 640.0)  # steps 4 and 5; 5 x 128 samples
    assert math.isnan(compare_methods.summary(str(tmp_path), "absent/key", window=2)[1])
