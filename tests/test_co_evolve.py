"""The co-evolving reward model (rewards/co_evolve.py, Cooper): its pairs, its updates, its state, and a
run that trains it on the policy's samples and resumes it exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from resume_fixtures import straight_and_resumed
from safetensors.torch import load_file
from test_reward_model import build

from reinforge.config import load_config
from reinforge.rewards.co_evolve import CoEvolvingRewardModel
from reinforge.rewards.imported import resolve_verifier
from reinforge.rewards.reward_model import RewardModelScorer
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Task

A, B, C = Task("a", "1+1=", "2"), Task("b", "2+2=", "4"), Task("c", "3+3=", "6")


def co_rm(tok, **kw) -> CoEvolvingRewardModel:
    scorer = RewardModelScorer(build("llama", tok), tok, transform=kw.pop("transform", "none"))
    return CoEvolvingRewardModel(scorer, resolve_verifier("exact_match"), **kw)


def test_pairs_set_a_correct_sample_over_a_wrong_one_per_prompt(tiny_tokenizer) -> None:
    rm = co_rm(tiny_tokenizer, pairs_per_group=2)
    tasks = [A] * 4 + [B] * 2 + [C] * 3
    texts = ["2", "3", "2", "5"] + ["4", "4"] + ["6", "1", "9"]
    pairs = rm.pairs(tasks, texts)
    assert [p[0].id for p in pairs] == ["a", "a", "c", "c"]  # b: all right, no pair
    assert {(p[1], p[2]) for p in pairs if p[0] is A} <= {("2", "3"), ("2", "5")}
    assert sorted((p[1], p[2]) for p in pairs if p[0] is C) == [("6", "1"), ("6", "9")]  # both wrong ones
    assert co_rm(tiny_tokenizer).pairs([C, C, C], ["6", "1", "1"]) == [(C, "6", "1")]  # one by default


def test_an_update_per_batch_of_pairs_raises_the_correct_samples_score(tiny_tokenizer) -> None:
    rm = co_rm(tiny_tokenizer, lr=1e-3, batch_size=2)
    scorer = rm.scorer
    gap = lambda: scorer.score([A], ["2"])[0] - scorer.score([A], ["3"])[0]  # noqa: E731
    before = gap()
    metrics = rm.observe([A, A, B, B, C, C], ["2", "3", "4", "7", "6", "6"])  # pairs from a and b; c: none
    assert metrics["co_evolve_pairs"] == 2 and metrics["co_evolve_updates"] == 1 and rm.buffer == []
    assert 0 <= metrics["co_evolve_accuracy"] <= 1 and metrics["co_evolve_loss"] > 0
    for _ in range(20):
        rm.update([(A, "2", "3"), (A, "2", "3")])
    assert gap() > before + 1.0
    assert not scorer.model.training
    assert rm.observe([A, A, A], ["2", "3", "9"]) == {"co_evolve_pairs": 1.0, "co_evolve_updates": 21.0}
    assert len(rm.buffer) == 1  # waits for a second pair


def test_reference_rewards_are_scored_again_after_an_update(tiny_tokenizer) -> None:
    rm = co_rm(tiny_tokenizer, lr=1e-3, batch_size=1, transform="par")
    rm.scorer.score([A], ["3"])
    old = rm.scorer.reference_scores["a"]
    rm.observe([A, A], ["2", "3"])
    assert rm.scorer.reference_scores == {}
    rm.scorer.score([A], ["3"])
    assert rm.scorer.reference_scores["a"] != old


def test_the_state_restores_the_model_the_optimizer_and_the_buffer_exactly(tiny_tokenizer) -> None:
    rm = co_rm(tiny_tokenizer, lr=1e-3, batch_size=2)
    rm.observe([A, A, B, B, C, C], ["2", "3", "4", "7", "6", "1"])
    state = copy.deepcopy(rm.state_dict())
    again = co_rm(tiny_tokenizer, lr=1e-3, batch_size=2)
    again.load_state_dict(state)
    assert again.buffer == rm.buffer and again.counts == rm.counts
    batch = ([A, A, A, B, B], ["2", "3", "5", "4", "8"])
    assert again.observe(*batch) == rm.observe(*batch)
    for k, v in rm.scorer.model.state_dict().items():
        assert torch.equal(v, again.scorer.model.state_dict()[k]), k


def _cfg(tmp_path, name: str, *extra: str):
    return load_config("rlhf_arithmetic", [
        f"output_dir={tmp_path}", f"name={name}", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "task.heldout_size=16", "train.time_limit_s=0", "eval.final_samples=0", "log.report=false",
        "reward.terms.0.reward_model.co_evolve={verifier: exact_match, lr: 1.0e-4, batch_size: 2}",
        "reward.terms.0.reward_model.transform=par", "train.steps=4", "checkpoint.every=2", *extra])


@pytest.mark.slow
def test_a_run_trains_the_reward_model_on_its_samples_and_resumes_it_exactly(tmp_path, monkeypatch) -> None:
    straight, resumed = straight_and_resumed(monkeypatch, lambda name: _cfg(tmp_path, name, "eval.every=2"))
    rows = [r for r in read_jsonl(straight.run_dir / "metrics.jsonl") if "reward/co_evolve_pairs/rm" in r]
    assert len(rows) == 4 and rows[-1]["reward/co_evolve_updates/rm"] > 0
    state = torch.load(straight.run_dir / "checkpoints/step_4/reward.pt", weights_only=False)["rm"]
    assert state["counts"]["pairs"] == sum(r["reward/co_evolve_pairs/rm"] for r in rows)  # the evaluations: none
    assert state["counts"]["updates"] == rows[-1]["reward/co_evolve_updates/rm"]
    start = RewardModelScorer(str(build_dir()), None).model.state_dict()
    assert any(not torch.equal(start[k], v) for k, v in state["model"].items())  # it trained
    again = torch.load(resumed.run_dir / "checkpoints/step_4/reward.pt", weights_only=False)["rm"]
    for k, v in state["model"].items():
        assert torch.equal(v, again["model"][k]), k
    assert again["counts"] == state["counts"] and again["buffer"] == state["buffer"]
    wa = load_file(straight.run_dir / "checkpoints/step_4/model.safetensors")
    wb = load_file(resumed.run_dir / "checkpoints/step_4/model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def build_dir():
    from reinforge.assets import resolve_model_path

    return resolve_model_path("tiny-rm")


def test_a_co_evolving_reward_model_needs_a_synchronous_single_turn_run(tmp_path) -> None:
    from reinforge.errors import ConfigError

    with pytest.raises(ConfigError, match="co_evolve: the reward model learns from the batches the training process"):
        _cfg(tmp_path, "x", "orchestrate.mode=async")


def test_a_sample_the_labeller_fails_on_makes_no_pair(tiny_tokenizer) -> None:
    def labeller(task, text):
        if text == "boom":
            raise ValueError("cannot parse")
        return resolve_verifier("exact_match")(task, text)

    rm = CoEvolvingRewardModel(RewardModelScorer(build("llama", tiny_tokenizer), tiny_tokenizer), labeller)
    assert rm.pairs([A, A, A], ["boom", "2", "3"]) == [(A, "2", "3")]
    assert rm.counts["label_errors"] == 1
