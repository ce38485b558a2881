"""Demonstrations and the supervised term: the NLL against hand-computed values, assistant-only
masking on real chat templates, bad-data errors, demonstrations kept out of the rollout's
statistics, SFT runs that learn, SFT mixed into RL, and the SFT -> RL model hand-over."""

import json
import math

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.aggregation import AggNorm
from reinforge.algo.context import Context
from reinforge.algo.objective import LOSS_TERMS, Objective, Rows, Term, row_sets
from reinforge.cli import SFT_OVERRIDES
from reinforge.config import load_config
from reinforge.config.demonstrations import DemonstrationColumns
from reinforge.data.demonstrations import chat_demonstration, completion_demonstration, rows_to_demonstrations
from reinforge.data.tabular import table_rows
from reinforge.errors import ConfigError, DataError
from reinforge.models.loading import load_tokenizer
from reinforge.orchestrate.demo_batches import DemonstrationBatches
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl


def _objective(cfg=None) -> Objective:
    cfg = cfg or load_config(None, []).algo
    return Objective("ppo_clip", "token_mean", "none", 0.0, cfg, cfg.policy_loss.settings)


def test_nll_is_minus_log_prob_averaged_over_demonstration_tokens_only():
    # rows 0, 1 sampled (advantage 1), row 2 a demonstration with tokens of p = 0.5 and 0.25
    logp = torch.log(torch.tensor([[0.9, 0.8], [0.7, 0.6], [0.5, 0.25]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    demo = torch.tensor([False, False, True])
    ctx = Context(mask=mask, logp=logp, old_logp=logp, sampling_logp=logp, advantages=torch.ones(3, 2), demo=demo)
    rows = row_sets(3, demo)
    sampled, demos = Rows.mask(rows.sampled, mask), Rows.mask(rows.demos, mask)
    norm, demo_norm = AggNorm.of(sampled, rows=rows.sampled), AggNorm.of(demos, rows=rows.demos)
    assert (norm.num_tokens, demo_norm.num_tokens, norm.num_seqs, demo_norm.num_seqs) == (3.0, 2.0, 2.0, 1.0)
    loss, pg, metrics, masks = _objective().loss(ctx, norm, [Term("nll", 0.5)], demo_norm)
    # ppo_clip with ratio 1 and A = 1: -1 per sampled token, token mean -1; nll: (ln 2 + ln 4) / 2
    expected_nll = (math.log(2) + math.log(4)) / 2
    assert_close(pg, torch.tensor(-1.0))
    assert_close(loss, torch.tensor(-1.0 + 0.5 * expected_nll))
    assert torch.equal(masks["nll"], demos) and torch.equal(masks["clip_frac"], sampled)
    assert float((metrics["nll"] * demos).sum() / demos.sum()) == pytest.approx(expected_nll)


def test_nll_gradient_reaches_demonstration_tokens_only():
    logits = torch.zeros(2, 3, 4, requires_grad=True)
    targets = torch.tensor([[1, 2, 3], [0, 1, 2]])
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    demo = torch.tensor([True, False])
    ctx = Context(mask=mask, logp=logp, old_logp=logp.detach(), sampling_logp=logp.detach(),
                  advantages=torch.zeros(2, 3), demo=demo)
    rows = row_sets(2, demo)
    loss, *_ = _objective().loss(ctx, AggNorm.of(Rows.mask(rows.sampled, mask)), [Term("nll", 1.0)],
                                 AggNorm.of(Rows.mask(rows.demos, mask)))
    loss.backward()
    grad = logits.grad.abs().sum(-1)
    assert grad[0, 0] == 0 and (grad[0, 1:] > 0).all()  # the prompt token of the demonstration: no gradient
    assert (grad[1] == 0).all()  # the sampled row has advantage 0: no policy gradient, no nll
    assert LOSS_TERMS.needs("nll") == frozenset({"demonstrations"})


def test_assistant_only_masking_on_a_multi_turn_chat_template():
    tok = load_tokenizer("tiny-agent")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "bc"}]
    ids, mask = chat_demonstration(tok, messages, "x")
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tok.decode(trained) == "yo" + tok.eos_token + "bc" + tok.eos_token
    full = tok.apply_chat_template(messages, tokenize=False)
    assert tok.decode(ids) == full and sum(mask) == len(trained)


def test_prompt_completion_rows_match_the_rollout_prompt_and_end_with_eos():
    tok = load_tokenizer("tiny-base")
    prompt = [{"role": "user", "content": "12+34="}]
    ids, mask = completion_demonstration(tok, prompt, "46", "x")
    chat_ids, chat_mask = chat_demonstration(tok, [*prompt, {"role": "assistant", "content": "46"}], "x")
    assert (ids, mask) == (chat_ids, chat_mask)  # this template renders both forms alike
    assert [tok.decode([i]) for i, m in zip(ids, mask, strict=True) if m] == ["4", "6", tok.eos_token]


def test_bad_demonstration_rows_name_file_and_line(tmp_path):
    tok = load_tokenizer("tiny-base")
    cols = DemonstrationColumns()
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n" + json.dumps({"question": "x"}) + "\n")
    with pytest.raises(DataError, match=r"d.jsonl:2: a demonstration needs a 'messages' column or 'prompt' and "
                                        r"'completion'; the row has \['question'\]"):
        rows_to_demonstrations(table_rows(path), tok, cols)
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + "\n")
    with pytest.raises(DataError, match="d.jsonl:1: no assistant message"):
        rows_to_demonstrations(table_rows(path), tok, cols)
    path.write_text(json.dumps({"prompt": "1+1=", "completion": ""}) + "\n")
    with pytest.raises(DataError, match="d.jsonl:1: completion must be a non-empty string"):
        rows_to_demonstrations(table_rows(path), tok, cols)


def test_config_requires_demonstrations_and_a_term_for_them():
    with pytest.raises(ConfigError, match="set demonstrations.path"):
        load_config(None, ["algo.loss_terms=[{name: nll, coef: 1.0}]"])
    with pytest.raises(ConfigError, match="demonstrations.path: no part of algo trains on demonstrations"):
        load_config(None, ["demonstrations.path=task"])
    with pytest.raises(ConfigError, match="no rollout to run asynchronously"):
        load_config(None, [*SFT_OVERRIDES, "demonstrations.path=task", "orchestrate.mode=async"])


def test_demonstration_order_depends_on_seed_and_step_only():
    tok = load_tokenizer("tiny-base")
    demos = [completion_demonstration(tok, f"{i}+0=", str(i), "x") for i in range(5)]
    from reinforge.data.demonstrations import demonstration

    rows = [demonstration(ids, mask, f"t{i}") for i, (ids, mask) in enumerate(demos)]
    source = DemonstrationBatches(rows, per_step=3, seed=0)
    first = [[t.task_id for t in source.rows(s)] for s in (1, 2, 3, 4)]
    again = DemonstrationBatches(rows, per_step=3, seed=0)
    assert [[t.task_id for t in again.rows(s)] for s in (4, 2)] == [first[3], first[1]]  # any order of calls
    assert sorted(first[0] + first[1][:2]) == [f"t{i}" for i in range(5)]  # an epoch is a permutation
    assert all(t.demonstration and t.group_id == -(k + 1) for k, t in enumerate(source.rows(1)))


def _cfg(tmp_path, name, *overrides, recipe=None):
    return load_config(recipe, [f"output_dir={tmp_path}", f"name={name}", "task.heldout_size=200", "eval.every=0",
                                "eval.final_samples=0", "log.report=false", "train.time_limit_s=0",
                                "checkpoint.every=0", *overrides])


@pytest.mark.slow
def test_sft_lowers_the_nll_and_raises_held_out_accuracy_and_rl_starts_from_it(tmp_path):
    """The shipped recipe pair, shortened: sft_arithmetic (60 steps), then grpo_after_sft from it."""
    sft = train(_cfg(tmp_path, "sft", "train.steps=60", "train.lr_schedule=constant", "checkpoint.every=60",
                     recipe="sft_arithmetic"))
    nll = [m["train/nll"] for m in read_jsonl(sft.run_dir / "metrics.jsonl") if "train/nll" in m]
    assert sum(nll[-10:]) / 10 < 0.7 * nll[0]  # step 1's is measured before any update (0.75 -> ~0.37 here)
    assert sft.heldout_after >= sft.heldout_before + 0.08, (sft.heldout_before, sft.heldout_after)
    # a run directory as model.path means its latest checkpoint: RL starts where SFT ended
    rl = train(_cfg(tmp_path, "rl", f"model.path={sft.run_dir}", "train.steps=1", "rollout.prompts_per_step=2",
                    "rollout.group_size=2", recipe="grpo_after_sft"))
    assert rl.heldout_before == pytest.approx(sft.heldout_after)


def test_demonstrations_mixed_into_rl_are_trained_by_nll_and_left_out_of_the_advantages(tmp_path):
    cfg = _cfg(tmp_path, "mix", "demonstrations.path=task", "demonstrations.mix=true", "demonstrations.per_step=4",
               "algo.loss_terms=[{name: nll, coef: 0.1}]", "algo.advantage=reinforce_pp", "algo.skip_equal_reward_groups=false",
               "rollout.prompts_per_step=4", "rollout.group_size=4", "train.steps=2")
    from reinforge.orchestrate.components import build_components
    from reinforge.orchestrate.episodes import build_batch
    from reinforge.orchestrate.loop import local_batches

    c = build_components(cfg)
    collector = c.make_collector()
    source = local_batches(c, collector)  # the demonstrations join through their stage
    rollout = source.collect(1)
    batch, _ = build_batch(rollout.kept, cfg.algo, c.engine.pad_id, rollout.baseline)
    assert int(batch.demo.sum()) == 4 and len(batch) == 16 + 4
    c.learner.prepare(batch)
    c.learner.estimate_advantages(batch)
    adv = batch.advantages
    assert (adv[batch.demo] == 0).all()
    # the sampled rows' advantages are REINFORCE++'s over the sampled rows alone
    sampled = ~batch.demo
    from part_calls import advantage

    from reinforge.algo.advantage_estimators import reinforce_pp_advantage

    alone = advantage(reinforce_pp_advantage, batch.rewards[sampled], batch.group_index[sampled],
                      batch.loss_mask[sampled], None, {})
    assert_close(adv[sampled], alone.to(adv.dtype))
    metrics = c.learner.update(batch)
    assert metrics["nll"] > 0
    collector.close()
    source.close()
