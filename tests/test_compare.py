"""`reinforge compare` on fake run directories (metrics.jsonl + config.yaml; no training)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from reinforge.errors import ConfigError, DataError
from reinforge.eval.compare import (
    compare_runs,
    format_table,
    plot_performance_profiles,
    run_compare,
    sequential_from_runs,
)
from reinforge.eval.runs import group_runs, load_runs


def make_run(root: Path, name: str, final: float, seed: int = 0, preset: str | None = "grpo",
             advantage: str = "grpo", policy_loss: str = "ppo_clip", evals: list[float] | None = None) -> Path:
    """A run directory whose eval/heldout_acc goes through ``evals`` then ``final``, with training
    records (no eval metric) in between, as the sync loop writes them."""
    path = root / name
    path.mkdir(parents=True)
    config = {"name": name, "seed": seed, "preset": preset,
              "algo": {"advantage": advantage, "policy_loss": policy_loss, "clip_high": 0.2}}
    (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    records, step = [], 0
    for value in [*(evals or [0.3]), final]:
        records.append({"step": step, "eval/heldout_acc": value})
        step += 1
        records.append({"step": step, "reward/mean": 0.5, "train/loss": 0.1})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:-1]))
    return path


def test_load_runs_scores_and_errors(tmp_path: Path) -> None:
    make_run(tmp_path / "runs", "r1", 0.8, evals=[0.2, 0.4, 0.6])
    make_run(tmp_path / "runs", "r2", 0.9)
    runs = load_runs([tmp_path / "runs"])  # a directory of run directories
    assert [r.name for r in runs] == ["r1", "r2"]
    assert runs[0].score() == pytest.approx(0.8)
    assert runs[0].score(last_k=3) == pytest.approx((0.4 + 0.6 + 0.8) / 3)
    assert runs[0].score(last_k=100) == pytest.approx((0.2 + 0.4 + 0.6 + 0.8) / 4)
    assert runs[0].score("reward/mean") == pytest.approx(0.5)
    with pytest.raises(DataError, match="eval/pass@4.*reward/mean"):
        runs[0].score("eval/pass@4")
    nan_run = tmp_path / "nan"
    make_run(tmp_path, "nan", 0.5)
    with (nan_run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 9, "eval/heldout_acc": "nan"}) + "\n")  # how JsonlSink stores NaN
    with pytest.raises(DataError, match="not finite"):
        load_runs([nan_run])[0].score()
    with pytest.raises(DataError, match="not a run directory"):
        load_runs([tmp_path / "missing"])


def test_grouping_by_preset_algo_key_and_explicit_groups(tmp_path: Path) -> None:
    for i in range(3):
        make_run(tmp_path, f"g{i}", 0.5, seed=2 - i, preset="grpo")
        make_run(tmp_path, f"d{i}", 0.6, seed=i, preset="dapo", advantage="grpo", policy_loss="ppo_clip")
        make_run(tmp_path, f"x{i}", 0.7, seed=i, preset=None, advantage="rloo", policy_loss="cispo")
    groups = group_runs([str(tmp_path)])
    assert sorted(groups) == ["dapo", "grpo", "rloo+cispo"]
    assert [r.seed for r in groups["grpo"]] == [0, 1, 2]  # seed order, not name order
    assert [r.name for r in groups["grpo"]] == ["g2", "g1", "g0"]
    by_adv = group_runs([str(tmp_path)], group_by="algo.advantage")
    assert sorted(by_adv) == ["grpo", "rloo"] and len(by_adv["grpo"]) == 6
    explicit = group_runs([f"mine={tmp_path / 'g0'},{tmp_path / 'x1'}", str(tmp_path / "d2")])
    assert sorted(explicit) == ["dapo", "mine"] and len(explicit["mine"]) == 2
    with pytest.raises(ConfigError, match="algo.nope"):
        group_runs([str(tmp_path)], group_by="algo.nope")


def _two_groups(tmp_path: Path, a: list[float], b: list[float]) -> list[str]:
    for i, v in enumerate(a):
        make_run(tmp_path, f"a{i}", v, seed=i, preset="grpo")
    for i, v in enumerate(b):
        make_run(tmp_path, f"b{i}", v, seed=i, preset="dapo")
    return [str(tmp_path)]


def test_compare_runs_aggregates_and_improvement(tmp_path: Path) -> None:
    a = [0.60, 0.62, 0.65, 0.58, 0.61, 0.90]  # one lucky seed
    b = [0.70, 0.72, 0.71, 0.69, 0.73, 0.74]
    result = compare_runs(group_runs(_two_groups(tmp_path, a, b)), n_boot=500)
    grpo, dapo = result.groups["grpo"], result.groups["dapo"]
    assert grpo.estimates["mean"].point == pytest.approx(np.mean(a))
    assert grpo.estimates["iqm"].point == pytest.approx(np.mean(sorted(a)[1:5]))  # int(1.5) = 1 cut per side
    assert grpo.estimates["optimality_gap"].point == pytest.approx(1 - np.mean(a))
    for est in (*grpo.estimates.values(), *dapo.estimates.values()):
        assert est.low <= est.point <= est.high
    (imp,) = result.improvements
    assert (imp.x, imp.y) == ("grpo", "dapo")
    assert imp.poi.point == pytest.approx(6 / 36)  # only the 0.90 seed beats any dapo seed (all six)
    assert imp.poi.low <= imp.poi.point <= imp.poi.high
    assert len(result.taus) == len(result.profiles["grpo"]["point"]) == 101
    assert result.profiles["dapo"]["point"][0] == 1.0 and result.profiles["dapo"]["point"][-1] == 0.0
    table = format_table(result)
    assert "| grpo | 6 |" in table and "| dapo | 6 |" in table
    assert f"{np.mean(b):.3f}" in table and "P(X > Y)" in table and "0.167" in table


def test_plot_performance_profiles(tmp_path: Path) -> None:
    result = compare_runs(group_runs(_two_groups(tmp_path / "runs", [0.1, 0.2, 0.3], [0.5, 0.6, 0.7])), n_boot=200)
    png = plot_performance_profiles(result, tmp_path / "out" / "profile.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sequential_from_runs_replays_in_order() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(2.0, 1.0, size=20), rng.normal(0.0, 1.0, size=20)
    report = sequential_from_runs(a, b, n_per_batch=5, alpha=0.05, names=("fast", "slow"))
    assert report.final.decision == "a_better"
    assert report.final.n_seeds < 20 and len(report.decisions) == report.final.batch
    assert "fast is better than slow" in report.summary()
    same = sequential_from_runs(a, a + 0.0, n_per_batch=5)  # identical scores: D = 0 at every look
    assert same.final.decision == "equal" and same.final.n_seeds == 20
    more = sequential_from_runs(a[:10], a[:10], n_per_batch=5, max_batches=4)
    assert more.final.decision == "continue" and more.final.n_seeds == 10
    assert "more seeds needed" in more.summary()
    with pytest.raises(ConfigError):
        sequential_from_runs(a[:3], b[:3], n_per_batch=5)


def test_run_compare_writes_json_and_png_and_prints_the_decision(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    paths = _two_groups(tmp_path / "runs", list(rng.uniform(0.2, 0.4, 10)), list(rng.uniform(0.7, 0.9, 10)))
    text = run_compare(paths, "eval/heldout_acc", None, 1, str(tmp_path / "out"), True, 5, 0.05, n_boot=300)
    assert "| grpo | 10 |" in text
    assert "dapo is better than grpo" in text and "decision 'b_better' after 1 batch(es), 5 seeds per group" in text
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert data["sequential"]["decision"] == "b_better" and data["sequential"]["n_seeds"] == 5
    assert set(data["groups"]) == {"grpo", "dapo"}
    assert data["groups"]["dapo"]["estimates"]["iqm"]["point"] > 0.7
    assert (tmp_path / "out" / "performance_profile.png").stat().st_size > 1000
    make_run(tmp_path / "runs", "third", 0.5, preset="ppo")
    with pytest.raises(ConfigError, match="exactly two groups"):
        run_compare(paths, "eval/heldout_acc", None, 1, None, True, 5, 0.05, n_boot=100)


def test_run_compare_several_metrics_as_tasks(tmp_path: Path) -> None:
    paths = _two_groups(tmp_path, [0.5, 0.6], [0.7, 0.8])
    text = run_compare(paths, "eval/heldout_acc,reward/mean", None, 1, None, False, 5, 0.05, n_boot=100)
    assert "metric: eval/heldout_acc, reward/mean" in text
    # grpo: task means 0.55 and 0.5, so the mean over tasks is 0.525
    assert "| grpo | 2 | 0.525 [" in text


def test_compare_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from reinforge.cli import app

    rng = np.random.default_rng(2)
    paths = _two_groups(tmp_path / "runs", list(rng.uniform(0.2, 0.4, 5)), list(rng.uniform(0.7, 0.9, 5)))
    result = CliRunner().invoke(app, ["compare", *paths, "--out", str(tmp_path / "o")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "| dapo | 5 |" in result.output and (tmp_path / "o" / "compare.json").is_file()
    bad = CliRunner().invoke(app, ["compare", str(tmp_path / "nothing")])
    assert bad.exit_code == 2 and "error" in bad.output.lower()
