"""Tiny end-to-end runs of the sync loop on the shipped model: resume exactness, learning, errors."""

import json

import pytest
import torch
from resume_fixtures import straight_and_resumed
from safetensors.torch import load_file

from reinforge.config import load_config
from reinforge.errors import ConfigError, ReinforgeError, TrainingDiverged
from reinforge.orchestrate.run import train
from reinforge.orchestrate.step_metrics import CollapseDetector, TruncationDetector
from reinforge.track import provenance
from reinforge.track.jsonl import read_jsonl

TIMING = ("time/", "perf/", "memory/")  # wall-clock and resident memory vary between runs


def _cfg(tmp_path, name, *overrides):
    return load_config(None, [
        f"output_dir={tmp_path}", f"name={name}", "rollout.prompts_per_step=8", "rollout.group_size=4",
        "task.heldout_size=100", "train.time_limit_s=0", "eval.final_samples=0", "log.report=false", *overrides,
    ])


def _untimed(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


@pytest.mark.parametrize("algo", [
    (),
    # critic + its optimizer, adaptive KL controller, KL in the reward, dynamic sampling: all resumed exactly
    ("preset=ppo", "algo.kl.target=0.001", "algo.dynamic_sampling=true", "algo.reward_shapers=[{name: overlong_penalty, buffer: 0.25}]"),
], ids=["grpo", "ppo_adaptive_kl_dynamic"])
def test_resume_is_exact(tmp_path, monkeypatch, algo):
    """6 steps straight == 3 steps, a kill, and a resume (cosine schedule, 2 epochs x 2 mini-batches)."""
    common = (*algo, "train.steps=6", "eval.every=3", "checkpoint.every=3", "train.minibatches=2",
              "train.epochs=2", "train.lr_schedule=cosine")
    straight, resumed = straight_and_resumed(monkeypatch, lambda name: _cfg(tmp_path, name, *common), kill_at=3)
    assert resumed.steps == 6 and resumed.heldout_before is None
    sessions = provenance.read(resumed.run_dir)  # the start and the resume, each with its provenance
    assert len(sessions) == 2 and sessions[1]["resumed_from_step"] == 3
    a = _untimed(read_jsonl(straight.run_dir / "metrics.jsonl"))
    b = _untimed(read_jsonl(resumed.run_dir / "metrics.jsonl"))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4, 5, 6]
    assert a == b
    wa = load_file(straight.run_dir / "checkpoints/step_6/model.safetensors")
    wb = load_file(resumed.run_dir / "checkpoints/step_6/model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # the PPO machinery really ran: several updates, old log-probs recomputed, ratios moved
    assert a[-1]["train/updates"] == 4.0 and a[-1]["train/approx_kl_old"] > 0
    if algo:
        assert a[-1]["train/kl_coef"] != 0.01 and "train/critic/value_loss" in a[-1]


def test_checkpoints_are_pruned_and_config_saved(tmp_path):
    result = train(_cfg(tmp_path, "ck", "train.steps=4", "checkpoint.every=1", "checkpoint.keep=2", "eval.every=0",
                        "eval.final_samples=16", "log.report=true", "log.sinks=[tensorboard]"))
    names = sorted(p.name for p in (result.run_dir / "checkpoints").iterdir())
    assert names == ["step_3", "step_4"]
    assert load_config(result.run_dir / "config.yaml").train.steps == 4
    assert (result.run_dir / "reward.png").stat().st_size > 1000
    final = json.loads((result.run_dir / "eval.json").read_text())  # the default recipe's final_samples: 16
    assert set(final) == {"before", "after"}
    assert final["before"]["greedy_accuracy"] == pytest.approx(read_jsonl(result.run_dir / "metrics.jsonl")[0]
                                                              ["eval/heldout_acc"])
    assert set(final["after"]["pass_at_k"]) == {"1", "2", "4", "8", "16"} and final["after"]["policy_version"] > 0
    by_carries = final["after"]["breakdown"]["difficulty"]  # arithmetic's difficulty: column carries
    assert set(by_carries) == {"0", "1", "2"} and sum(g["prompts"] for g in by_carries.values()) == 100
    assert "mean@16" in by_carries["1"]
    assert (result.run_dir / "passk.png").stat().st_size > 1000
    html = (result.run_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and "pass@16" in html  # the loop ends with the report
    assert f"difficulty = 1 <small>({int(by_carries['1']['prompts'])} prompts)</small>" in html
    assert list((result.run_dir).glob("**/events.out.tfevents.*"))  # the tensorboard sink was written
    samples = read_jsonl(result.run_dir / "samples.jsonl")
    assert len(samples) == 4 * 4 and {"prompt", "completion", "reward"} <= samples[0].keys()
    with pytest.raises(ConfigError, match="already exists"):
        train(_cfg(tmp_path, "ck", "train.steps=1"))


def test_final_evaluations_share_their_sampling_seed_and_leave_training_alone(tmp_path):
    """eval.json's before and after sample from the same seed: a policy that did not move (lr so small
    that no fp32 weight changes) scores exactly the same, samples included; and the evaluations do not
    change what training samples."""
    common = ["train.steps=2", "eval.every=0", "task.heldout_size=24", "train.lr=1e-30", "algo.kl.coef=0"]
    result = train(_cfg(tmp_path, "crn", *common, "eval.final_samples=4"))
    final = json.loads((result.run_dir / "eval.json").read_text())
    before, after = final["before"], final["after"]
    assert after["policy_version"] == 2 and 0 < before["mean_at_n"] < 1  # sampled, not all right or all wrong
    for key in ("mean_at_n", "pass_at_k", "maj_at_k", "pass_curve"):
        assert before[key] == after[key], key
    plain = train(_cfg(tmp_path, "no-final-eval", *common))
    assert _untimed(read_jsonl(plain.run_dir / "metrics.jsonl")) == _untimed(read_jsonl(result.run_dir / "metrics.jsonl"))


@pytest.mark.slow
def test_grpo_improves_heldout_accuracy(tmp_path):
    """40 GRPO steps on the tiny model raise held-out greedy accuracy clearly above the base."""
    result = train(_cfg(
        tmp_path, "learn", "train.steps=40", "train.lr=1e-4", "rollout.prompts_per_step=16",
        "rollout.group_size=8", "task.heldout_size=300", "eval.every=0", "checkpoint.every=0",
    ))
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    assert result.heldout_before is not None
    assert result.heldout_after >= result.heldout_before + 0.08, (result.heldout_before, result.heldout_after)
    rewards = [m["reward/mean"] for m in metrics if "reward/mean" in m]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10
    assert max(m.get("train/logprob_mismatch", 0) for m in metrics) < 1e-4


def test_nan_loss_stops_with_step_and_statistics(tmp_path, monkeypatch):
    import dataclasses

    from reinforge.algo.policy_losses import POLICY_LOSSES

    real = POLICY_LOSSES.get("ppo_clip")

    def broken(logp, old_logp, advantages, cfg):  # the context fields ppo_clip reads
        loss, metrics = real(logp, old_logp, advantages, cfg)
        return loss * float("nan"), metrics

    monkeypatch.setitem(POLICY_LOSSES._entries, "ppo_clip", dataclasses.replace(POLICY_LOSSES.entry("ppo_clip"),
                                                                                 fn=broken))
    with pytest.raises(TrainingDiverged, match=r"step 1: the loss is nan.*sequences.*Hint"):
        train(_cfg(tmp_path, "nan", "train.steps=2", "eval.every=0"))


def test_bad_inputs_give_one_clear_message(tmp_path):
    with pytest.raises(ConfigError, match="model.path"):
        train(_cfg(tmp_path, "m", "model.path=/nonexistent/model"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n{oops\n")
    with pytest.raises(ReinforgeError, match=r"bad.jsonl:2"):
        train(_cfg(tmp_path, "j", "task.kind=jsonl", f"task.path={bad}", "task.heldout_size=1"))
    with pytest.raises(ReinforgeError, match="no config.yaml"):
        train(resume=tmp_path / "nothing-here")


def test_collapse_is_reported_once_and_saturation_is_not():
    d = CollapseDetector(patience=3)
    flat = {"groups/spread_frac": 0.0, "reward/mean": 0.0}
    assert d.update({"step": 1, **flat}) is None
    assert d.update({"step": 2, "groups/spread_frac": 0.5, "reward/mean": 0.3}) is None  # spread resets the count
    assert [d.update({"step": s, **flat}) for s in (3, 4)] == [None, None]
    msg = d.update({"step": 5, **flat})
    assert msg is not None and "step 5" in msg and "3 steps" in msg and "collapsed" in msg
    assert d.update({"step": 6, **flat}) is None  # said once
    solved = CollapseDetector(patience=2)
    assert all(solved.update({"step": s, "groups/spread_frac": 0.0, "reward/mean": 1.0}) is None for s in range(5))


def test_answers_cut_at_the_token_limit_are_reported_once_naming_the_limit():
    d = TruncationDetector(max_new_tokens=8, patience=3)
    cut = {"response/truncated_frac": 0.95}
    assert [d.update({"step": s, **cut}) for s in (1, 2)] == [None, None]
    assert d.update({"step": 3, "response/truncated_frac": 0.5}) is None  # answers that end reset the count
    assert [d.update({"step": s, **cut}) for s in (4, 5)] == [None, None]
    msg = d.update({"step": 6, **cut})
    assert msg is not None and "step 6" in msg and "rollout.max_new_tokens=8" in msg and "95%" in msg
    assert d.update({"step": 7, **cut}) is None  # said once
    assert d.update({"step": 8}) is None  # a step with nothing sampled


def test_kl_penalty_loads_reference_and_is_reported(tmp_path):
    result = train(_cfg(tmp_path, "kl", "train.steps=3", "eval.every=0", "algo.kl.coef=0.5", "train.lr=3e-4",
                        "algo.skip_equal_reward_groups=false"))
    rows = [r for r in read_jsonl(result.run_dir / "metrics.jsonl") if "train/kl_ref" in r]
    assert len(rows) == 3
    assert rows[0]["train/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == reference
    assert rows[-1]["train/kl_ref"] > 1e-5  # after updates the policy has moved away
    assert rows[-1]["train/loss"] != rows[-1]["train/pg_loss"]
    no_kl = train(_cfg(tmp_path, "nokl", "train.steps=1", "eval.every=0"))
    assert "train/kl_ref" not in read_jsonl(no_kl.run_dir / "metrics.jsonl")[-1]
