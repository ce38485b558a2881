"""Learning on environments from other frameworks (docs/environments.md, "Learning results"): seed 0 of each
recipe's measured runs, repeated; the held-out rise it reached is asserted with a margin. Marked `learning`
(minutes each, not in the default suite)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verifiers.v1", reason="the envs extra is not installed")
pytest.importorskip("textarena", reason="the envs extra is not installed")


def _train(tmp_path, recipe: str):
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    result = train(load_config(recipe, [f"output_dir={tmp_path}", "seed=0"]))
    return result, json.loads((result.run_dir / "eval.json").read_text())


@pytest.mark.learning  # 60 steps of 16 x 8 additions and two evaluations of 200 problems: 3-5 minutes loaded
def test_tiny_base_learns_the_verifiers_addition_taskset(tmp_path):
    """Measured (seeds 0, 1, 2): mean@4 +0.18, +0.10, +0.08; greedy +0.125, +0.03, +0.01."""
    result, data = _train(tmp_path, "verifiers_addition")
    before, after = data["before"]["mean_at_n"], data["after"]["mean_at_n"]
    assert after >= before + 0.06, (before, after)
    assert result.heldout_after > result.heldout_before, (result.heldout_before, result.heldout_after)


@pytest.mark.learning  # 30 steps of 8 x 8 games and two evaluations of 64 games: 7-8 minutes loaded
def test_tiny_agent_learns_textarena_tictactoe_against_the_random_opponent(tmp_path):
    """Measured (seeds 0, 1): win rate mean@4 +0.55, +0.49; greedy +0.58, +0.52 (docs/environments.md)."""
    result, data = _train(tmp_path, "textarena_tictactoe")
    before, after = data["before"]["mean_at_n"], data["after"]["mean_at_n"]
    assert after >= before + 0.3, (before, after)
    assert result.heldout_after >= result.heldout_before + 0.3, (result.heldout_before, result.heldout_after)
