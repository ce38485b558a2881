"""Preference objectives: DPO / IPO against hand-computed values, pairs from ranks, whole groups in
mini- and micro-batches (a split batch updates exactly as the unsplit one), preference data, and
short runs of offline DPO."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.aggregation import LOSS_AGG, AggNorm
from reinforge.algo.preference import DPOSettings, IPOSettings, dpo_loss, ipo_loss, pair_rows
from reinforge.config import load_config
from reinforge.data.preferences import rows_to_pairs, wrong_answer
from reinforge.data.tabular import table_rows
from reinforge.errors import ConfigError, DataError
from reinforge.learn.packing import group_micro_batches, group_order
from reinforge.models.loading import load_tokenizer


def test_pair_rows_takes_the_first_best_and_first_worst_of_each_group_with_a_spread():
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.2, 0.9, 0.2])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2])  # group 1: all equal, no pair
    chosen, rejected = pair_rows(rewards, groups)
    assert chosen.tolist() == [1, 7] and rejected.tolist() == [0, 6]


def _pair_batch():
    # group 0: rows 0 (reward 1) and 1 (reward 0); group 1: rows 2 (reward 0), 3 (1), 4 (0.5)
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 1.0], [0.5, 1.0], [1.0, 0.5], [0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5], [0.5, 1.0], [0.5, 1.0], [0.5, 0.5], [0.5, 0.5]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    return logp, ref, mask, torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 1, 1, 1])


def test_dpo_hand_values_and_the_mean_over_pairs():
    logp, ref, mask, rewards, groups = _pair_batch()
    logp.requires_grad_(True)
    loss, metrics = dpo_loss(logp, ref, mask, rewards, groups, DPOSettings(beta=0.5))
    # pair 0: s_0 = ln 2, s_1 = ln(1/2) -> h = 2 ln 2; pair 1 (rows 3 over 2): s_3 = ln 2, s_2 = 0 -> h = ln 2
    l0, l1 = -math.log(1 / (1 + math.exp(-0.5 * 2 * math.log(2)))), -math.log(1 / (1 + math.exp(-0.5 * math.log(2))))
    per_row = (loss * mask).sum(-1)
    # each pair's two rows carry (group size / 2) x its loss; row 4 is in no pair
    assert_close(per_row, torch.tensor([l0, l0, 1.5 * l1, 1.5 * l1, 0.0]))
    agg = LOSS_AGG.get("seq_mean_token_sum")(loss, mask, AggNorm.of(mask))
    assert_close(agg, torch.tensor((2 * l0 + 3 * l1) / 5))  # equal-size groups would make it the plain pair mean
    margin, rows = metrics["preference/margin"]
    assert_close(margin[:, 0], torch.tensor([math.log(2), math.log(2), 0.5 * math.log(2), 0.5 * math.log(2), 0.0]))
    assert rows[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    agg.backward()
    g = logp.grad
    assert (g[0] < 0).all() and g[1, 0] > 0 and g[3].lt(0).all() and g[2].gt(0).all()  # chosen up, rejected down
    assert g[1, 1] == 0 and (g[4] == 0).all()  # outside the mask, outside a pair


def test_label_smoothing_and_ipo_hand_values():
    logp, ref, mask, rewards, groups = _pair_batch()
    h0 = 2 * math.log(2)
    smooth, _ = dpo_loss(logp, ref, mask, rewards, groups, DPOSettings(beta=1.0, label_smoothing=0.25))
    expected = -0.75 * math.log(1 / (1 + math.exp(-h0))) - 0.25 * math.log(1 / (1 + math.exp(h0)))
    assert_close((smooth * mask).sum(-1)[0], torch.tensor(expected))
    ipo, _ = ipo_loss(logp, ref, mask, rewards, groups, IPOSettings(tau=0.5))
    assert_close((ipo * mask).sum(-1)[:2], torch.tensor([(h0 - 1.0) ** 2] * 2))


def test_groups_stay_whole_in_mini_and_micro_batches():
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 4, 4])
    order = group_order(groups, torch.Generator().manual_seed(0))
    assert sorted(order.tolist()) == list(range(10))
    runs = [g for i, g in enumerate(groups[order].tolist()) if i == 0 or g != groups[order][i - 1]]
    assert sorted(runs) == [0, 1, 2, 3, 4]  # each group's rows are consecutive
    lengths = torch.tensor([3, 3, 2, 2, 2, 5, 1, 1, 4, 4])
    micro = group_micro_batches(lengths, groups, budget_tokens=8)
    assert sorted(i for m in micro for i in m) == list(range(10))
    for m in micro:
        members = set(groups[m].tolist())
        assert all(set(torch.nonzero(groups == g).flatten().tolist()) <= set(m) for g in members)
    assert micro[0] == [0, 1]  # adding group 1 would make 5 rows x 3 > 8


def _dpo_learner_and_batch(tmp_path, *overrides):
    from reinforge.orchestrate.components import build_components
    from reinforge.orchestrate.demo_batches import preference_batches
    from reinforge.orchestrate.episodes import build_batch

    cfg = load_config(None, [f"output_dir={tmp_path}", "algo.policy_loss=dpo", "algo.loss_agg=seq_mean_token_sum",
                             "preferences.path=task", "preferences.per_step=6", "task.heldout_size=20",
                             "train.time_limit_s=0", "eval.final_samples=0", "log.report=false", *overrides])
    c = build_components(cfg)
    rollout = preference_batches(c, None).collect(1)
    batch, _ = build_batch(rollout.kept, cfg.algo, c.engine.pad_id)
    return c.learner, batch


def test_a_split_batch_updates_exactly_as_the_whole_one(tmp_path):
    """Micro-batches of a pair or two, and three mini-batches, against one of each: same pair
    grouping, and with one mini-batch the same gradient to float tolerance."""
    whole, batch = _dpo_learner_and_batch(tmp_path / "a", "train.micro_batch_tokens=100000")
    split, _ = _dpo_learner_and_batch(tmp_path / "b", "train.micro_batch_tokens=20")
    assert len(split._micro_batches(batch)) >= 3 and len(whole._micro_batches(batch)) == 1
    grads = {}

    def record(name, learner):
        def hook(*_):
            grads[name] = torch.cat([p.grad.flatten() for p in learner.model.parameters() if p.grad is not None])
        return hook

    for name, learner in (("whole", whole), ("split", split)):
        learner.optimizer.register_step_pre_hook(record(name, learner))
        metrics = learner.update(copy.deepcopy(batch))
    assert metrics["preference/accuracy"] >= 0 and "preference/margin" in metrics
    assert_close(grads["split"], grads["whole"], rtol=1e-4, atol=1e-7)
    three, _ = _dpo_learner_and_batch(tmp_path / "c", "train.minibatches=3")
    minis = three._minibatch_rows(batch, len(batch), 3)
    assert len(minis) == 3 and sorted(torch.cat(minis).tolist()) == list(range(len(batch)))
    for rows in minis:  # a pair is never split across optimizer steps
        ids = batch.group_index[rows].tolist()
        assert all(ids.count(g) == 2 for g in ids)


def test_preference_rows_and_their_errors(tmp_path):
    tok = load_tokenizer("tiny-base")
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n"
                    + json.dumps({"prompt": "2+2=", "chosen": "4"}) + "\n")
    from reinforge.config.demonstrations import PreferenceColumns

    with pytest.raises(DataError, match=r"pairs.jsonl:2: .*missing \['rejected'\]"):
        rows_to_pairs(table_rows(str(path), None), tok, PreferenceColumns())
    path.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "2"}) + "\n")
    with pytest.raises(DataError, match="pairs.jsonl:1: chosen and rejected are the same"):
        rows_to_pairs(table_rows(str(path), None), tok, PreferenceColumns())
    path.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n")
    [(chosen, rejected)] = rows_to_pairs(table_rows(str(path), None), tok, PreferenceColumns())
    assert (chosen.reward, rejected.reward, chosen.demonstration) == (1.0, 0.0, True)
    assert chosen.token_ids[:-2] == rejected.token_ids[:-2] and tok.decode(chosen.token_ids[-2:-1]) == "2"
    assert wrong_answer("46", "t1") == wrong_answer("46", "t1") != "46"
    assert {int(wrong_answer("46", f"t{i}")) - 46 for i in range(60)} == {1, -1, 10, -10, 2, -2}
    with pytest.raises(DataError, match="task t9: .*whole-number"):
        wrong_answer("x=3", "t9")


def test_config_rules_for_preferences():
    with pytest.raises(ConfigError, match="does not learn from pairs"):
        load_config(None, ["preferences.path=task"])
    dpo = ["algo.policy_loss=dpo", "preferences.path=task"]
    with pytest.raises(ConfigError, match="one source of given rows"):
        load_config(None, [*dpo, "demonstrations.path=task", "algo.loss_terms=[{name: nll, coef: 1.0}]"])
    with pytest.raises(ConfigError, match="orchestrate.mode=sync"):
        load_config(None, [*dpo, "orchestrate.mode=async"])
    assert load_config(None, ["preset=online_dpo"]).algo.policy_loss.settings.beta == 0.1


def test_offline_dpo_raises_held_out_accuracy(tmp_path):
    from reinforge.orchestrate.run import train

    cfg = load_config("dpo_arithmetic", [f"output_dir={tmp_path}", "train.steps=20", "task.heldout_size=200",
                                         "eval.every=0", "eval.final_samples=0", "log.report=false",
                                         "checkpoint.every=0", "train.time_limit_s=0"])
    result = train(cfg)
    assert result.heldout_after >= result.heldout_before + 0.05, (result.heldout_before, result.heldout_after)


@pytest.mark.slow
def test_online_dpo_runs_asynchronously(tmp_path):
    """The online_dpo preset with rollout workers sampling ahead: pairs from stale samples train."""
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, ["preset=online_dpo", "orchestrate.mode=async", f"output_dir={tmp_path}", "train.steps=3",
                             "rollout.prompts_per_step=8", "task.heldout_size=20", "eval.every=0",
                             "eval.final_samples=0", "log.report=false", "checkpoint.every=0", "train.time_limit_s=0"])
    result = train(cfg)
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 3 and all("train/preference/accuracy" in m and m["train/loss"] > 0 for m in rows)
