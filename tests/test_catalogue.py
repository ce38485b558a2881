"""The listings of ``reinforge algos``, ``envs``, ``verifiers`` and ``recipes`` (reinforge/catalogue.py):
they fit an 80-column terminal, show one entry in full, filter by kind and word, and print Markdown."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from reinforge.catalogue import Item, first_sentence, part_items, presets_using
from reinforge.cli import app

COMMANDS = ("algos", "envs", "verifiers", "recipes")


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    return result.exit_code, result.output


def _entries(out: str) -> list[list[str]]:
    """The listing's entries: a line that starts an entry (two spaces, then a name) and its continuations."""
    entries: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            entries.append([line])
        elif line.startswith("   ") and entries:
            entries[-1].append(line)
    return entries


@pytest.mark.parametrize("command", COMMANDS)
def test_each_listing_fits_80_columns_and_no_entry_wraps_past_three_lines(command):
    code, out = _run(command)
    assert code == 0, out
    assert max(len(line) for line in out.splitlines()) <= 80
    entries = _entries(out)
    assert len(entries) >= 4 and max(len(e) for e in entries) <= 3


def test_algos_lists_presets_and_every_algorithm_part_with_its_paper_id():
    code, out = _run("algos")
    assert code == 0
    names = {e[0].split()[0] for e in _entries(out)}
    assert {"grpo", "dapo", "ppo_clip", "gae", "token_mean", "k3", "overlong_penalty"} <= names
    assert any(e[0].split()[:2] == ["dapo", "2503.14476"] for e in _entries(out))


def test_one_entry_in_full_shows_formula_settings_paper_and_the_presets_using_it():
    code, out = _run("algos", "ppo_clip")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80
    for shown in ("ppo_clip (policy_loss)", "formula:", "clip_high = 0.2: upper clip range", "arXiv:1707.06347",
                  "presets:"):
        assert shown in out, shown
    assert "dapo" in out.split("presets:")[1]
    code, out = _run("algos", "grpo")  # a preset and a part of the same name: both
    assert "grpo (preset)" in out and "grpo (advantage)" in out and "policy_loss = ppo_clip" in out


def test_kind_search_and_markdown():
    code, out = _run("algos", "--kind", "loss_agg")
    assert code == 0 and out.splitlines()[0] == "loss_agg:" and len(_entries(out)) == 5
    code, out = _run("algos", "--search", "entropy", "--kind", "advantage")
    names = {e[0].split()[0] for e in _entries(out)}
    assert code == 0 and {"aepo", "gtpo"} <= names and "grpo" not in names
    code, out = _run("verifiers", "--markdown")
    assert code == 0 and out.startswith("| name | kind | paper | summary |") and "| `exact_match` | verifier |" in out
    code, out = _run("recipes", "default")
    assert code == 0 and "reinforge/recipes/default.yaml" in out


def test_unknown_names_and_kinds_are_refused_with_the_choices():
    code, out = _run("algos", "ppo_clipp")
    assert code != 0 and "did you mean ppo_clip" in out
    code, out = _run("algos", "--kind", "nope")
    assert code != 0 and "allowed: preset, advantage" in out


def test_first_sentence_skips_abbreviations_and_paper_ids_come_from_arxiv_or_the_citation():
    assert first_sentence("Schulman et al. 2017, PPO. The rest.") == "Schulman et al. 2017, PPO"
    assert first_sentence("Dr. GRPO advantage: no std. More") == "Dr. GRPO advantage: no std"
    assert Item("x", "k", "", "Yu et al. 2025, DAPO (arXiv:2503.14476)").paper_id == "2503.14476"
    assert Item("x", "k", "", "ReTool (Feng et al. 2025), the code interpreter").paper_id == "Feng 2025"
    assert all(i.summary for i in part_items(("advantage", "env", "verifier")))
    assert presets_using("ppo_clip") and "grpo" in presets_using("ppo_clip")
