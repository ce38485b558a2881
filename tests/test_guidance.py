"""Off-policy guidance inside RL: LUFFY's mixed-policy loss (expert traces in the rollout groups),
CHORD's token-weighted SFT term and its mu schedule (``algo.mixing``), against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.aggregation import AggNorm
from reinforge.algo.context import Context
from reinforge.algo.guidance import LuffySettings, luffy_loss
from reinforge.algo.mixing import MIXING, ChordSettings, chord_mu
from reinforge.algo.objective import Objective, Rows, Term, row_sets
from reinforge.config import load_config
from reinforge.data.demonstrations import completion_demonstration, demonstration
from reinforge.errors import ConfigError, DataError
from reinforge.models.loading import load_tokenizer
from reinforge.orchestrate.demo_batches import GroupGuidance
from reinforge.types import Trajectory

P = torch.tensor([[0.5, 0.25], [0.8, 0.4]])  # row 0 sampled, row 1 a demonstration


def _objective(policy_loss: str = "luffy", mismatch: str = "none") -> Objective:
    cfg = load_config(None, []).algo
    settings = LuffySettings() if policy_loss == "luffy" else cfg.policy_loss.settings
    return Objective(policy_loss, "token_mean", mismatch, 2.0, cfg, settings)


def test_luffy_shapes_the_demonstration_tokens_and_clips_the_sampled_ones():
    logp = torch.log(P).requires_grad_(True)
    old = torch.log(torch.tensor([[0.25, 0.25], [0.1, 0.1]]))  # row 0: ratios 2 and 1; row 1: not used
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    loss, metrics = luffy_loss(logp, old, adv, torch.tensor([False, True]), LuffySettings(gamma=0.1))
    # sampled: -min(2 * 1, 1.2 * 1) = -1.2 (clipped), -1 (ratio 1); demonstration: -A p / (p + 0.1)
    expected = torch.tensor([[-1.2, -1.0], [-2 * 0.8 / 0.9, -2 * 0.4 / 0.5]])
    assert_close(loss, expected)
    assert_close(metrics["clip_frac"][0], torch.tensor([1.0, 0.0]))  # the objective averages it over sampled rows
    prob, rows = metrics["guided/prob"]  # averaged over the demonstration's tokens only
    assert_close(prob[1], torch.tensor([0.8, 0.4]))
    assert_close(rows, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    loss.sum().backward()
    # d/dlogp of -A f(p) = -A * gamma * p / (p + gamma)^2; the clipped token gets none
    assert_close(logp.grad, torch.tensor([[0.0, -1.0], [-2 * 0.1 * 0.8 / 0.81, -2 * 0.1 * 0.4 / 0.25]]))
    assert_close(metrics["guided/shaping_weight"][0][1], torch.tensor([0.1 * 0.8 / 0.81, 0.1 * 0.4 / 0.25]))


def test_luffy_without_demonstrations_is_ppo_clip():
    logp, old, adv = torch.log(P), torch.log(P * 0.9), torch.ones(2, 2)
    a, _ = luffy_loss(logp, old, adv, None, LuffySettings())
    from reinforge.algo.policy_losses import PPOClipSettings, ppo_clip_loss

    assert_close(a, ppo_clip_loss(logp, old, adv, PPOClipSettings())[0])


def test_luffy_aggregates_sampled_and_guided_tokens_in_one_token_mean():
    # rows: 0 sampled (group 0), 1 demonstration in group 0 (guided), 2 demonstration in a group of its own
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    demo, groups = torch.tensor([False, True, True]), torch.tensor([0, 0, -1])
    sampling = logp - 1.0  # a large sampler mismatch: token_tis would weigh the sampled tokens by min(e, 2) = 2
    ctx = Context(mask=mask, logp=logp, old_logp=logp, sampling_logp=sampling, advantages=torch.ones(3, 2),
                  demo=demo, group_index=groups)
    obj = _objective(mismatch="token_tis")
    rows = obj.rows(3, demo, groups)
    assert rows.guided.tolist() == [False, True, False] and rows.policy.tolist() == [True, True, False]
    norm = AggNorm.of(Rows.mask(rows.policy, mask), rows=rows.policy)
    loss, pg, metrics, masks = obj.loss(ctx, norm, [])
    # (2 sampled tokens * -1 * weight 2 + 1 guided token * -0.5/0.6 * weight 1) / 3 tokens
    assert_close(loss, torch.tensor((2 * -2.0 - 0.5 / 0.6) / 3))
    assert torch.equal(masks["guided/prob"], Rows.mask(rows.guided, mask))
    assert torch.equal(masks["clip_frac"], Rows.mask(rows.sampled, mask))


def test_ppo_clip_leaves_demonstrations_in_groups_to_their_terms():
    assert not _objective("ppo_clip").trains_on_guidance
    rows = _objective("ppo_clip").rows(2, torch.tensor([False, True]), torch.tensor([0, 0]))
    assert rows.guided.tolist() == [False, False] and rows.demos.tolist() == [False, True]


def test_nll_phi_weighs_each_expert_token_by_p_times_one_minus_p():
    logp = torch.log(torch.tensor([[0.5, 0.9]])).requires_grad_(True)
    mask, demo = torch.ones(1, 2), torch.tensor([True])
    ctx = Context(mask=mask, logp=logp, old_logp=logp.detach(), sampling_logp=logp.detach(),
                  advantages=torch.zeros(1, 2), demo=demo, group_index=torch.tensor([-1]))
    obj = _objective("ppo_clip")
    loss, _, metrics, _ = obj.loss(ctx, AggNorm.of(torch.zeros(1, 2)), [Term("nll_phi", 1.0)], AggNorm.of(mask))
    # (0.25 ln 2 + 0.09 * -ln 0.9) / 2
    assert_close(loss, torch.tensor((0.25 * math.log(2) - 0.09 * math.log(0.9)) / 2))
    assert_close(metrics["phi"], torch.tensor([[0.25, 0.09]]))
    loss.backward()
    assert_close(logp.grad, torch.tensor([[-0.25 / 2, -0.09 / 2]]))  # phi is a constant: d/dlogp = -phi / 2


def test_chord_mu_schedule_hand_values():
    cfg = ChordSettings(mu_peak=0.9, mu_valley=0.05, warmup_steps=10, decay_steps=100)
    # the schedule's clock is step - 1: warm-up 0 -> 0.9 over 10 steps, cosine to 0.05 over 100
    assert chord_mu(1, cfg) == 0.0
    assert chord_mu(6, cfg) == pytest.approx(0.45)
    assert chord_mu(11, cfg) == pytest.approx(0.9)
    assert chord_mu(61, cfg) == pytest.approx(0.05 + 0.85 * 0.5)  # half way: cos(pi/2) = 0
    assert chord_mu(111, cfg) == pytest.approx(0.05) and chord_mu(500, cfg) == pytest.approx(0.05)
    assert MIXING.get("chord")(61, cfg) == pytest.approx((1 - 0.475, 0.475))
    assert MIXING.get("sum")(7, None) == (1.0, 1.0)
    with pytest.raises(ValueError, match="mu_valley"):
        ChordSettings(mu_peak=0.1, mu_valley=0.2)


def test_mixing_weighs_the_rl_side_and_the_demonstration_side():
    logp = torch.log(torch.tensor([[0.5], [0.5]]))
    mask, demo = torch.ones(2, 1), torch.tensor([False, True])
    ctx = Context(mask=mask, logp=logp, old_logp=logp, sampling_logp=logp, advantages=torch.ones(2, 1), demo=demo,
                  group_index=torch.tensor([0, -1]))
    rows = row_sets(2, demo)
    norms = AggNorm.of(Rows.mask(rows.sampled, mask)), AggNorm.of(Rows.mask(rows.demos, mask))
    loss, pg, *_ = _objective("ppo_clip").loss(ctx, norms[0], [Term("nll", 1.0)], norms[1], weights=(0.3, 0.7))
    assert_close(pg, torch.tensor(-1.0))
    assert_close(loss, torch.tensor(0.3 * -1.0 + 0.7 * math.log(2)))


def test_config_ties_luffy_to_in_group_demonstrations():
    luffy = ["algo.policy_loss=luffy", "demonstrations.path=task", "demonstrations.mix=true"]
    with pytest.raises(ConfigError, match="set demonstrations.placement=in_group"):
        load_config(None, luffy)
    with pytest.raises(ConfigError, match="does not train on demonstrations in a group"):
        load_config(None, ["demonstrations.path=task", "demonstrations.mix=true", "demonstrations.placement=in_group",
                           "algo.loss_terms=[{name: nll, coef: 1.0}]"])
    with pytest.raises(ConfigError, match="set demonstrations.mix=true"):
        load_config(None, ["algo.policy_loss=luffy", "demonstrations.path=task", "demonstrations.placement=in_group"])
    with pytest.raises(ConfigError, match="set demonstrations.path"):
        load_config(None, ["algo.policy_loss=luffy"])
    cfg = load_config(None, [*luffy, "demonstrations.placement=in_group", "algo.mixing={name: chord, mu_peak: 0.5}"])
    assert cfg.algo.mixing.settings.mu_peak == 0.5


def _sampled(prompt: list[int], group: int, task_id: str) -> Trajectory:
    return Trajectory(token_ids=[*prompt, 7, 8], loss_mask=[0] * len(prompt) + [1, 1], logprobs=[0.0] * (len(prompt) + 2),
                      version=0, group_id=group, task_id=task_id)


def test_group_guidance_adds_each_groups_demonstration_scored_by_the_verifier():
    tok = load_tokenizer("tiny-base")
    demos = [demonstration(*completion_demonstration(tok, p, a, "x"), f"d{k}", a)
             for k, (p, a) in enumerate([("1+1=", "2"), ("2+2=", "5")])]
    prompts = [d.token_ids[: d.loss_mask.index(1)] for d in demos]
    tasks = [type("T", (), {"id": i})() for i in ("a", "b", "c")]
    scored = []

    def score(ts, texts):
        scored.append(([t.id for t in ts], texts))
        return [1.0 if text == "2" else 0.0 for text in texts]

    guidance = GroupGuidance(demos, tasks, score)
    kept = [_sampled(prompts[0], 0, "a"), _sampled(prompts[0], 0, "a"), _sampled(prompts[1], 1, "b"),
            _sampled([5, 5, 5], 2, "c")]  # group 2's prompt has no demonstration
    out, baseline, metrics = guidance.apply(kept, None)
    assert out[:4] == kept and baseline is None
    rows = out[4:]  # added after the sampled rows (the default rule: every group)
    assert [(r.group_id, r.task_id, r.reward, r.demonstration) for r in rows] == [(0, "a", 1.0, True), (1, "b", 0.0, True)]
    assert metrics == {"demonstrations/rows": 2.0, "demonstrations/replaced": 0.0, "demonstrations/reward": 0.5}
    assert scored == [(["a", "b"], ["2", "5"])]
    assert rows[0].token_ids == demos[0].token_ids
    chat = demonstration([1, 2], [0, 1], "chat.jsonl:3")
    with pytest.raises(DataError, match="chat.jsonl:3"):
        GroupGuidance([chat], tasks, score)


def _short(tmp_path, recipe: str, *overrides: str):
    from reinforge.config import load_config

    return load_config(recipe, [f"output_dir={tmp_path}", "train.steps=2", "rollout.prompts_per_step=4",
                                "rollout.group_size=4", "task.heldout_size=20", "eval.every=0", "eval.final_samples=0",
                                "log.report=false", "checkpoint.every=0", "train.time_limit_s=0", *overrides])


def test_luffy_and_chord_recipes_run_through_the_loop(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    luffy = train(_short(tmp_path / "l", "luffy_arithmetic", "algo.skip_equal_reward_groups=false"))
    rows = [m for m in read_jsonl(luffy.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [m["demonstrations/rows"] for m in rows] == [4.0, 4.0]  # one expert row per group
    assert all(m["demonstrations/reward"] == 1.0 and 0 < m["train/guided/prob"] < 1 for m in rows)
    chord = train(_short(tmp_path / "c", "chord_mu_arithmetic", "demonstrations.per_step=4",
                         "algo.mixing={name: chord, mu_peak: 0.8, mu_valley: 0.1, warmup_steps: 0, decay_steps: 1}"))
    rows = [m for m in read_jsonl(chord.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [m["train/mixing/w_demo"] for m in rows] == pytest.approx([0.8, 0.1])  # step 1 at the peak, then the floor
    assert all(m["train/nll"] > 0 for m in rows)
    phi = train(_short(tmp_path / "p", "chord_phi_arithmetic", "demonstrations.per_step=4"))
    rows = [m for m in read_jsonl(phi.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert all(m["train/mixing/w_demo"] == pytest.approx(0.1) and 0 < m["train/phi"] <= 0.25 for m in rows)
