"""SFT -> reward model -> RL on the tiny models, end to end (docs/rewards.md): the shipped recipes
sft_arithmetic, rm/arithmetic_verify and rlhf_arithmetic chained by their paths, each shortened."""

from __future__ import annotations

import json

import pytest

from reinforge.config import load_config
from reinforge.track.jsonl import read_jsonl

SHORT_RL = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=8",
            "eval.final_samples=0", "eval.every=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0"]


@pytest.mark.slow
def test_sft_then_a_reward_model_then_rl_against_it(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.rewards.reward_model import reference_template
    from reinforge.rm.config import load_rm_config
    from reinforge.rm.train import train_reward_model

    sft = train(load_config("sft_arithmetic", [f"output_dir={tmp_path}", "name=sft", "train.steps=10",
                                               "eval.every=0", "eval.final_samples=0", "checkpoint.every=10",
                                               "task.heldout_size=8", "log.report=false"])).run_dir
    rm = train_reward_model(load_rm_config("arithmetic_verify", [
        f"model.path={sft}", "train.steps=10", "train.batch_size=8", "train.eval_every=0",
        "data.task.heldout_size=8", f"output_dir={tmp_path}", "name=rm"]))
    model_dir = rm.model_dirs[0]
    assert reference_template(model_dir) == " {answer} " and rm.heldout.pairs == 48
    cfg = load_config("rlhf_arithmetic", [f"model.path={sft}", f"reward.terms.0.reward_model.path={model_dir}",
                                          f"output_dir={tmp_path}", "name=rl", *SHORT_RL])
    assert [t.weight for t in cfg.reward.terms] == [1.0, 0.0] and cfg.reward.terms[1].primary
    run = train(cfg).run_dir
    steps = [m for m in read_jsonl(run / "metrics.jsonl") if "train/loss" in m]
    assert len(steps) == 2
    for m in steps:  # the proxy is what is trained on; the gold is measured; the KL from the start is logged
        assert m["reward/mean"] == pytest.approx(m["reward/term/rm"], abs=1e-5)
        assert 0.0 <= m["reward/term/gold"] <= 1.0 and m["train/kl_ref"] >= 0.0
    config = (run / "config.yaml").read_text()
    assert str(sft) in config and str(model_dir) in config
    assert json.loads((tmp_path / "rm" / "eval.json").read_text())["heldout"]["pairs"] == 48
