"""RL-PLUS's hybrid-policy loss (multiple importance sampling, exploration-based advantage) and ReMix's
parts (the KL-Convex term, reincarnation's end of replay), against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.aggregation import AggNorm
from reinforge.algo.context import Context
from reinforge.algo.kl import KL_ESTIMATORS
from reinforge.algo.objective import Objective, Rows, Term
from reinforge.algo.policy_losses import PPOClipSettings, ppo_clip_loss
from reinforge.algo.remix import KLConvexSettings, kl_convex_term
from reinforge.algo.rl_plus import RLPlusSettings, mis_ratio, rl_plus_loss
from reinforge.config import load_config
from reinforge.orchestrate.replay import ReplayBuffer, ReplaySettings
from reinforge.types import Trajectory

P = torch.tensor([[0.5, 0.25], [0.8, 0.4]])  # row 0 sampled, row 1 a demonstration
OLD = torch.tensor([[0.25, 0.25], [0.5, 0.2]])


def test_rl_plus_weighs_external_tokens_by_the_mis_ratio_and_the_exploration_weight():
    logp = torch.log(P).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    loss, metrics = rl_plus_loss(logp, torch.log(OLD), adv, torch.tensor([False, True]), RLPlusSettings())
    # sampled row: ratios 2 and 1 -> -min(2, 1.2) = -1.2 (clipped), -1.
    # external token 1: pi_old 0.5, pi_ext = (0.5 + 1) / 2 = 0.75, denominator 0.5 * 0.5 + 0.5 * 0.75 = 0.625,
    #   r = 0.8 / 0.625 = 1.28, C = (1 - 0.8)^0.5 = sqrt(0.2): L = -1.28 * 2 * sqrt(0.2)
    # external token 2: pi_old 0.2, pi_ext 0.6, denominator 0.1 + 0.3 = 0.4, r = 1, C = sqrt(0.6): L = -2 sqrt(0.6)
    ext = torch.tensor([-1.28 * 2 * math.sqrt(0.2), -2 * math.sqrt(0.6)])
    assert_close(loss, torch.stack([torch.tensor([-1.2, -1.0]), ext]))
    assert_close(metrics["guided/mis_ratio"][0][1], torch.tensor([1.28, 1.0]))
    assert_close(metrics["guided/explore_weight"][0][1], torch.tensor([math.sqrt(0.2), math.sqrt(0.6)]))
    assert_close(metrics["guided/mis_ratio"][1], torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    loss.sum().backward()
    # r is proportional to pi = exp(logp) and C is a constant: d/dlogp (-r A C) = -r A C, the loss itself;
    # the clipped sampled token gets no gradient
    assert_close(logp.grad, torch.stack([torch.tensor([0.0, -1.0]), ext]))


def test_rl_plus_settings_recover_plain_importance_sampling_and_cap_the_ratio():
    logp, old = torch.log(torch.tensor([[0.8]])), torch.log(torch.tensor([[0.2]]))
    # w = 0: r = pi / pi_old = 4; w = 1: r = pi / pi_ext = 0.8 / 0.6
    assert_close(mis_ratio(logp, old, RLPlusSettings(ext_weight=0.0)), torch.tensor([[4.0]]))
    assert_close(mis_ratio(logp, old, RLPlusSettings(ext_weight=1.0)), torch.tensor([[0.8 / 0.6]]))
    assert_close(mis_ratio(logp, old, RLPlusSettings(ext_weight=0.0, max_ratio=3.0)), torch.tensor([[3.0]]))
    # gamma = 0: no exploration weight, L = -r A
    loss, _ = rl_plus_loss(logp, old, torch.ones(1, 1), torch.tensor([True]), RLPlusSettings(gamma=0.0))
    assert_close(loss, torch.tensor([[-0.8 / 0.4]]))  # denominator 0.5 * 0.2 + 0.5 * 0.6 = 0.4


def test_rl_plus_without_demonstrations_is_ppo_clip():
    logp, old, adv = torch.log(P), torch.log(P * 0.9), torch.ones(2, 2)
    a, _ = rl_plus_loss(logp, old, adv, None, RLPlusSettings())
    assert_close(a, ppo_clip_loss(logp, old, adv, PPOClipSettings())[0])


def test_rl_plus_trains_on_in_group_demonstrations_in_one_token_mean():
    logp = torch.log(torch.full((2, 2), 0.5))
    mask, demo, groups = torch.ones(2, 2), torch.tensor([False, True]), torch.tensor([0, 0])
    ctx = Context(mask=mask, logp=logp, old_logp=logp, sampling_logp=logp, advantages=torch.ones(2, 2),
                  demo=demo, group_index=groups)
    obj = Objective("rl_plus", "token_mean", "none", 2.0, load_config(None, []).algo, RLPlusSettings())
    rows = obj.rows(2, demo, groups)
    assert obj.trains_on_guidance and rows.policy.tolist() == [True, True]
    loss, _, _, masks = obj.loss(ctx, AggNorm.of(Rows.mask(rows.policy, mask), rows=rows.policy), [])
    # sampled: -1 per token; external: r = 0.5 / (0.25 + 0.375) = 0.8, C = sqrt(0.5): -0.8 sqrt(0.5); mean of 4
    assert_close(loss, torch.tensor((2 * -1.0 + 2 * -0.8 * math.sqrt(0.5)) / 4))
    assert torch.equal(masks["guided/prob"], Rows.mask(rows.guided, mask))


def test_rl_plus_config_needs_in_group_demonstrations():
    from reinforge.errors import ConfigError

    with pytest.raises(ConfigError, match="placement=in_group"):
        load_config(None, ["algo.policy_loss=rl_plus", "demonstrations.path=task", "demonstrations.mix=true"])
    cfg = load_config(None, ["algo.policy_loss={name: rl_plus, gamma: 1.0}", "demonstrations.path=task",
                             "demonstrations.mix=true", "demonstrations.placement=in_group"])
    assert cfg.algo.policy_loss.settings.gamma == 1.0


def test_kl_convex_mixes_the_kl_to_the_base_and_to_the_precedent_policy():
    logp = torch.log(torch.tensor([[0.5, 0.4]])).requires_grad_(True)
    ref, old = torch.log(torch.tensor([[0.25, 0.4]])), torch.log(torch.tensor([[0.5, 0.2]]))
    values, metrics = kl_convex_term(logp, ref, old, KLConvexSettings(base_weight=0.25))
    # k3 = r - 1 - log r, r = q / pi: to ref r = (0.5, 1) -> (0.5 - 1 + ln 2, 0); to old r = (1, 0.5) -> (0, ln 2 - 0.5)
    k = math.log(2) - 0.5
    assert_close(metrics["kl_convex/ref"], torch.tensor([[k, 0.0]]))
    assert_close(metrics["kl_convex/prev"], torch.tensor([[0.0, k]]))
    assert_close(values, torch.tensor([[0.25 * k, 0.75 * k]]))
    values.sum().backward()
    # d k3 / d log pi = 1 - r: token 1 (ref only): 0.25 * 0.5; token 2 (old only): 0.75 * 0.5
    assert_close(logp.grad, torch.tensor([[0.125, 0.375]]))
    # base_weight 1 is the plain KL term's estimator against the reference
    assert_close(kl_convex_term(logp, ref, old, KLConvexSettings(base_weight=1.0))[0], KL_ESTIMATORS.get("k3")(logp, ref))


def test_kl_convex_is_a_loss_term_on_the_sampled_rows():
    logp = torch.log(torch.tensor([[0.5], [0.5]]))
    ctx = Context(mask=torch.ones(2, 1), logp=logp, old_logp=logp, sampling_logp=logp, advantages=torch.zeros(2, 1),
                  ref_logp=torch.log(torch.tensor([[0.25], [0.5]])))
    obj = Objective("ppo_clip", "token_mean", "none", 2.0, load_config(None, []).algo, PPOClipSettings())
    loss, _, _, _ = obj.loss(ctx, AggNorm.of(torch.ones(2, 1)), [Term("kl_convex", 0.1, KLConvexSettings())])
    # 0.1 * mean(0.5 * (ln 2 - 0.5), 0)
    assert_close(loss, torch.tensor(0.1 * 0.5 * (math.log(2) - 0.5) / 2))
    cfg = load_config(None, ["algo.loss_terms=[{name: kl_convex, coef: 0.01, base_weight: 0.3}]"])
    assert cfg.algo.loss_terms[0].settings().base_weight == 0.3


def _traj(task: str, group: int, reward: float) -> Trajectory:
    return Trajectory([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5], 0, group, task, reward=reward)


def test_replay_until_step_switches_back_to_fresh_samples():
    buf = ReplayBuffer("all", ReplaySettings(capacity=4, replays=2, min_to_replay=1, until_step=3), seed=0)
    buf.add([_traj("a", 0, 1.0)], 1)
    assert len(buf.mix([_traj("a", 0, 0.0)], 2, next_group=1)) == 1  # step 2 < 3: replayed
    buf.add([_traj("a", 0, 0.0)], 2)
    assert buf.mix([_traj("a", 0, 0.0)], 3, next_group=1) == []  # from step 3 on: on-policy
    assert buf.metrics()["replay/samples"] == 0


def _prompts(tmp_path) -> str:
    """Six ``a+b=`` prompts, four trained on: every step draws the same four, so they come back."""
    import json

    path = tmp_path / "six.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": [{"role": "user", "content": f"{i}+1="}],
                                        "answer": str(i + 1)}) + "\n" for i in range(6)))
    return str(path)


def _short(tmp_path, *overrides: str):
    return load_config(None, [f"output_dir={tmp_path}", "train.steps=2", "rollout.prompts_per_step=4",
                              "rollout.group_size=4", "task.heldout_size=20", "eval.every=0", "eval.final_samples=0",
                              "log.report=false", "checkpoint.every=0", "train.time_limit_s=0", *overrides])


@pytest.mark.slow
def test_rl_plus_and_remix_run_through_the_loop(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    plus = train(_short(tmp_path / "p", "algo.policy_loss=rl_plus", "demonstrations.path=task",
                        "demonstrations.mix=true", "demonstrations.placement=in_group",
                        "algo.skip_equal_reward_groups=false"))
    rows = [m for m in read_jsonl(plus.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert all(0 < m["train/guided/mis_ratio"] <= 4 and 0 <= m["train/guided/explore_weight"] <= 1 for m in rows)
    remix = train(_short(tmp_path / "r", "algo.policy_loss=repo", "train.minibatches=2", "train.steps=3",
                         "task.kind=jsonl", f"task.path={_prompts(tmp_path)}", "task.heldout_size=2",
                         "rollout.replay={name: all, capacity: 4, replays: 4, min_to_replay: 1, until_step: 3}",
                         "algo.loss_terms=[{name: kl_convex, coef: 0.01}]", "algo.skip_equal_reward_groups=false"))
    rows = [m for m in read_jsonl(remix.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert all(m["train/kl_convex/ref"] > -1e-6 and m["train/kl_convex/prev"] > -1e-6 for m in rows)  # k3 >= 0, float32
    # step 1: empty buffers; step 2: each of the 4 prompts (drawn again) replays its 4 past samples; step 3: none
    assert [m["replay/samples"] for m in rows] == [0.0, 16.0, 0.0]
