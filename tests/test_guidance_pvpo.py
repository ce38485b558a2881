"""PVPO's ground-truth injection (issue 18): the ``failed_groups`` guidance rule and how the loop applies it."""

from __future__ import annotations

import pytest

from reinforge.config import load_config
from reinforge.data.demonstrations import demonstration
from reinforge.errors import ConfigError
from reinforge.orchestrate.demo_batches import GroupGuidance
from reinforge.orchestrate.guidance_rules import FailedGroupSettings, every_group, failed_groups
from reinforge.types import Trajectory


def test_failed_groups_rule_by_hand():
    pvpo = FailedGroupSettings()  # replace, only where V_ref <= 0
    assert failed_groups([0.0, 0.0], [False, False], 0.0, pvpo) == "replace"
    assert failed_groups([1.0, 0.0], [True, False], 0.0, pvpo) == "skip"  # a sample succeeded
    assert failed_groups([0.0, 0.0], [False, False], 0.25, pvpo) == "skip"  # the reference solved it sometimes
    assert failed_groups([0.5], [False], 0.25, FailedGroupSettings(max_reference_value=0.5, replace=False)) == "add"
    assert failed_groups([0.0], [False], None, FailedGroupSettings(max_reference_value=None)) == "replace"
    with pytest.raises(ValueError, match="max_reference_value"):
        failed_groups([0.0], [False], None, pvpo)
    assert every_group([1.0], [True], None, None) == "add"


def _row(prompt: list[int], group: int, task_id: str, reward: float) -> Trajectory:
    return Trajectory(token_ids=[*prompt, 7, 8], loss_mask=[0] * len(prompt) + [1, 1],
                      logprobs=[0.0] * (len(prompt) + 2), version=0, group_id=group, task_id=task_id,
                      reward=reward, metadata={"correct": reward > 0})


def _guidance(settings: FailedGroupSettings):
    prompts = [[1, 4, 2], [1, 5, 3], [1, 6, 3]]  # token ids of three prompts, then an answer and EOS
    demos = [demonstration([*p, 9, 2], [0, 0, 0, 1, 1], f"d{k}", a) for k, (p, a) in enumerate(zip(prompts, "246", strict=True))]
    tasks = [type("T", (), {"id": i})() for i in ("a", "b", "c", "e")]
    guidance = GroupGuidance(demos, tasks, lambda ts, texts: [1.0] * len(texts),
                             lambda r, c, ref: failed_groups(r, c, ref, settings), with_reference=True)
    kept = [_row(prompts[0], 0, "a", 0.0), _row(prompts[0], 0, "a", 0.0),   # all failed, V_ref 0: injected
            _row(prompts[1], 1, "b", 1.0), _row(prompts[1], 1, "b", 0.0),   # one success: left alone
            _row(prompts[2], 2, "c", 0.0), _row(prompts[2], 2, "c", 0.0),   # all failed but V_ref 0.5: left alone
            _row([5, 5, 5], 3, "e", 0.0)]                                   # no demonstration for this prompt
    return guidance, kept, demos, [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.0]


def test_an_all_failed_group_has_its_last_sample_replaced_by_the_ground_truth():
    guidance, kept, demos, baseline = _guidance(FailedGroupSettings())
    out, base, metrics = guidance.apply(kept, baseline)
    assert len(out) == len(kept) and base == baseline  # the group keeps its size and its V_ref
    assert out[0] is kept[0] and out[2:] == kept[2:]
    injected = out[1]
    assert injected.demonstration and injected.token_ids == demos[0].token_ids
    assert (injected.group_id, injected.task_id, injected.reward) == (0, "a", 1.0)
    assert metrics == {"demonstrations/rows": 1.0, "demonstrations/replaced": 1.0, "demonstrations/reward": 1.0}


def test_added_instead_of_replacing_and_any_reference_value():
    guidance, kept, demos, baseline = _guidance(FailedGroupSettings(replace=False, max_reference_value=None))
    out, base, metrics = guidance.apply(kept, baseline)
    assert out[:7] == kept and [(r.group_id, r.task_id) for r in out[7:]] == [(0, "a"), (2, "c")]
    assert base == [*baseline, 0.0, 0.5]  # each added row carries its group's baseline
    assert metrics["demonstrations/rows"] == 2.0 and metrics["demonstrations/replaced"] == 0.0


def test_recipe_names_the_rule_and_its_settings():
    cfg = load_config(None, ["demonstrations.guidance={name: failed_groups, replace: false}"])
    assert cfg.demonstrations.guidance == "failed_groups" and cfg.demonstrations.guidance.settings.replace is False
    assert load_config(None, []).demonstrations.guidance == "every_group"
    with pytest.raises(ConfigError, match="replace"):
        load_config(None, ["demonstrations.guidance={name: failed_groups, replace: 3}"])
    with pytest.raises(ConfigError, match="no_such_rule"):
        load_config(None, ["demonstrations.guidance=no_such_rule"])


@pytest.mark.learning
def test_pvpo_with_ground_truth_injection_runs_through_the_loop(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, [
        f"output_dir={tmp_path}", "train.steps=2", "rollout.prompts_per_step=16", "rollout.group_size=4",
        "task.heldout_size=20", "eval.every=0", "eval.final_samples=0", "log.report=false", "checkpoint.every=0",
        "train.time_limit_s=0", "algo.advantage={name: pvpo, value_samples: 2}", "algo.policy_loss=luffy",
        "demonstrations.path=task", "demonstrations.mix=true", "demonstrations.placement=in_group",
        "demonstrations.guidance={name: failed_groups, max_reference_value: null}",
        "algo.skip_equal_reward_groups=false"])
    rows = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert all(m["demonstrations/replaced"] == m["demonstrations/rows"] for m in rows)
    assert sum(m["demonstrations/replaced"] for m in rows) > 0  # the tiny base fails whole groups of 2-digit sums
