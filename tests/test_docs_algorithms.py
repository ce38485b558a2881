"""docs/algorithms.md agrees with the code: every registered formula verbatim, every preset's parts; every preset
is measured in docs/measurements/presets.md."""

import re
from pathlib import Path

import pytest

from reinforge.algo import REGISTRIES
from reinforge.config import config_from_dict, preset_names

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOC = (DOCS / "algorithms.md").read_text().replace("\\|", "|")
# the measurement logs of algorithms.md (its presets measured on the built-in task)
MEASURED = (DOCS / "measurements" / "presets.md").read_text().replace("\\|", "|")


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_every_registered_formula_is_documented_verbatim(kind):
    for entry in REGISTRIES[kind].entries():
        assert f"`{entry.formula}`" in DOC, f"{kind} {entry.name}: formula missing from docs/algorithms.md"
        assert f"| `{entry.name}` |" in DOC, f"{kind} {entry.name}: no table row"


def _preset_rows() -> dict[str, list[str]]:
    section = DOC.split("## Presets", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `(\w+)` \|", line)
        if m and m.group(1) in preset_names():
            rows[m.group(1)] = [c.strip().strip("`") for c in line.strip("|").split("|")]
    return rows


def test_preset_table_matches_the_preset_files():
    rows = _preset_rows()
    assert set(rows) == set(preset_names())
    for name, cells in rows.items():
        a = config_from_dict({"preset": name}).algo
        assert cells[1:4] == [a.advantage, a.policy_loss, a.loss_agg], name
        kl = f"{a.kl.estimator}` x {a.kl.coef:g} in {a.kl.placement}" if a.kl.coef > 0 else "-"
        assert cells[4] == kl, name


def test_measured_table_lists_every_preset():
    measured = MEASURED.split("## What each preset reaches here", 1)[1]  # and the later presets' sections
    for name in preset_names():
        assert re.search(rf"^\| {name} \| 0\.\d+ \[0\.\d+, 0\.\d+\] \| (0\.\d+, ){{2}}0\.\d+ \|", measured, re.M), name
    assert "scripts/run_presets.py" in measured and "| X | Y | P(X > Y)" in measured


@pytest.mark.parametrize("kind", ["mismatch", "loss_term"])
def test_the_other_algorithm_parts_are_documented_verbatim(kind):
    from reinforge.parts import all_kinds

    for entry in all_kinds()[kind].entries():
        assert f"`{entry.formula}`" in DOC, f"{kind} {entry.name}: formula missing from docs/algorithms.md"
        assert f"| `{entry.name}` |" in DOC, f"{kind} {entry.name}: no table row"
