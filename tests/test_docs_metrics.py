"""docs/metrics.md lists every metric a run logs: short runs of the main configurations (GRPO with KL,
entropy and mismatch correction; PPO with a critic; a multi-turn environment) log nothing it lacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reinforge.config import load_config
from reinforge.orchestrate.run import train

DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
SHORT = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=8",
         "eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0", "eval.every=1"]


def documented() -> list[re.Pattern]:
    """The keys in the first column of the page's tables, ``<...>`` matching any name."""
    keys = [k for row in re.findall(r"^\| (`.*?) \|", DOC, flags=re.M) for k in re.findall(r"`([^`]+)`", row)]
    return [re.compile("".join("[^ /]+" if part.startswith("<") else re.escape(part)
                               for part in re.split(r"(<[^>]+>)", k))) for k in keys]


def _undocumented(keys: set[str]) -> set[str]:
    patterns = documented()
    return {k for k in keys if not any(p.fullmatch(k) for p in patterns)}


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["algo.kl.coef=0.05", "algo.entropy_coef=0.01", "algo.mismatch.mode=token_tis"],
    ["preset=ppo"],
    ["model.path=tiny-agent", "env.name=retry", "env.max_turns=2", "rollout.max_new_tokens=5"],
    ["model.path=tiny-agent", "task.kind=nim", "env.name=nim", "env.max_turns=4", "rollout.max_new_tokens=1",
     "algo.advantage=at_grpo", "algo.skip_equal_reward_groups=false", "model.lora.enabled=true",
     "model.lora.sync=adapter", "env.role_adapters=[first,second]", "algo.mismatch.mode=token_tis"],
], ids=["grpo_kl_entropy_tis", "ppo", "multi_turn", "role_adapters"])
def test_every_logged_metric_is_documented(tmp_path, overrides):
    result = train(load_config(None, [f"output_dir={tmp_path}", *SHORT, *overrides]))
    keys = {k for record in result.metrics() for k in record}
    assert len(keys) > 30
    assert _undocumented(keys) == set()


def test_the_check_sees_an_undocumented_metric():
    assert _undocumented({"train/loss", "reward/term/correct", "eval/pass@4"}) == set()
    assert _undocumented({"train/no_such_metric", "reward/term"}) == {"train/no_such_metric", "reward/term"}
