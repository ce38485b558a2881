"""The entropy and confidence family against hand-computed values: GTPO, GRPO-S, AEPO (loss and
advantage), ACE, EPO's smoothed entropy term, AEnt's adaptive coefficient; their state across updates
and checkpoints; the learner providing pi_old's entropy to an estimator that needs it."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from part_calls import advantage
from torch.testing import assert_close

from reinforge.algo.entropy import (
    AdaptiveEntropyController,
    AdaptiveEntropySettings,
    ClampedEntropyController,
    ClampedEntropySettings,
    EPOController,
    EPOSettings,
    adaptive_entropy_term,
    clamped_entropy,
    clamped_entropy_term,
    epo_entropy_term,
)
from reinforge.algo.entropy_shaping import (
    ACESettings,
    AEPOAdvantageSettings,
    GTPOSettings,
    ace_grpo_advantage,
    aepo_advantage,
    grpo_s_advantage,
    gtpo_advantage,
)
from reinforge.algo.policy_losses import CEGPPOSettings, ClipSettings, aepo_loss, ce_gppo_loss
from reinforge.config import load_config
from reinforge.errors import ConfigError

D = torch.float64
EPS = 1e-6


def _normalised(values: list[float]) -> list[float]:
    mean, std = statistics.mean(values), statistics.stdev(values)
    return [(v - mean) / (std + EPS) for v in values]


# ------------------------------------------------------------------------------------------ GTPO
def test_gtpo_token_rewards_by_hand():
    # one group, r = [1, 1, 0, 0]: O+ = rows 0, 1 (above the mean 0.5), O- = rows 2, 3; row 1 has one token.
    # position 0: O+ alive d=2, H = 1, 3 -> shares 2*1/4 = 0.5, 2*3/4 = 1.5;
    #             O- alive d=2, 1/H = 1, 0.5 -> shares 2*1/1.5 = 4/3, 2*0.5/1.5 = 2/3
    # position 1: O+ only row 0 (d=1) -> share 1;  O-: 1/H = 0.25, 1 -> 2*0.25/1.25 = 0.4, 2*1/1.25 = 1.6
    # shaped = 1.0 r + 0.1 (+share for O+, -share for O-)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]], dtype=D)
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0], [1.0, 4.0], [2.0, 1.0]], dtype=D)
    shaped = [1.05, 1.1, 1.15, -0.4 / 3, -0.04, -0.2 / 3, -0.16]
    norm = _normalised(shaped)
    expected = torch.tensor([[norm[0], norm[1]], [norm[2], 0.0], [norm[3], norm[4]], [norm[5], norm[6]]], dtype=D)
    got = advantage(gtpo_advantage, rewards, torch.zeros(4, dtype=torch.long), mask, entropy=entropy)
    assert_close(got, expected)


def test_gtpo_groups_are_separate_and_equal_rewards_give_zero():
    mask = torch.ones(4, 2, dtype=D)
    entropy = torch.tensor([[1.0, 2.0], [3.0, 1.0], [0.5, 0.7], [2.0, 2.0]], dtype=D)
    got = advantage(gtpo_advantage, torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), mask,
                    entropy=entropy)
    assert_close(got[:2], torch.zeros(2, 2, dtype=D))  # group 0: equal rewards, no O+/O-
    # group 1 (one row per side, d=1): shares are 1, shaped row 2 = 1.1, row 3 = -0.1 on both tokens
    norm = _normalised([1.1, 1.1, -0.1, -0.1])
    assert_close(got[2:], torch.tensor([norm[:2], norm[2:]], dtype=D))


# ---------------------------------------------------------------------------------------- GRPO-S
def test_grpo_s_sequence_rewards_by_hand():
    # mean entropies 2, 4, 2; O+ = rows 0, 1 (n=2): shares 2*2/6 = 2/3, 2*4/6 = 4/3; O- = row 2 (n=1): share 1
    # shaped = [1 + 0.1*2/3, 1 + 0.1*4/3, 0 - 0.1], then GRPO's group normalisation, broadcast
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=D)
    entropy = torch.tensor([[1.0, 3.0], [4.0, 4.0], [2.0, 7.0]], dtype=D)
    got = advantage(grpo_s_advantage, torch.tensor([1.0, 1.0, 0.0]), torch.zeros(3, dtype=torch.long), mask,
                    entropy=entropy)
    a = _normalised([1 + 0.2 / 3, 1 + 0.4 / 3, -0.1])
    assert_close(got, torch.tensor([[a[0], a[0]], [a[1], a[1]], [a[2], 0.0]], dtype=D))


def test_entropy_weighting_ranks_rows_at_a_position_as_the_paper_says():
    """GTPO compares the rows of a side at the same position: among the correct rows the one with the
    higher entropy there gets more; among the wrong rows the confident (low-entropy) one is penalised more."""
    mask = torch.ones(4, 1, dtype=D)
    entropy = torch.tensor([[0.1], [2.0], [0.1], [2.0]], dtype=D)
    got = advantage(gtpo_advantage, torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long), mask,
                    entropy=entropy, cfg={"alpha2": 0.5})[:, 0]
    assert got[1] > got[0] > 0 > got[3] > got[2]


# ------------------------------------------------------------------------------------------ AEPO
def test_aepo_advantage_by_hand():
    # GRPO: r = [1, 0] -> +-0.5 / (std 0.7071 + eps); root entropies 1 and 2; dH = [0, 1, 2], [0, 0, 2]
    # A_dH = dH normalised over the group's 6 tokens; A = A_acc (1 + 0.3 A_dH)
    mask = torch.ones(2, 3, dtype=D)
    entropy = torch.tensor([[1.0, 2.0, 3.0], [2.0, 2.0, 4.0]], dtype=D)
    got = advantage(aepo_advantage, torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), mask,
                    entropy=entropy)
    acc = 0.5 / (math.sqrt(0.5) + EPS)
    dh = _normalised([0.0, 1.0, 2.0, 0.0, 0.0, 2.0])
    expected = [[acc * (1 + 0.3 * d) for d in dh[:3]], [-acc * (1 + 0.3 * d) for d in dh[3:]]]
    assert_close(got, torch.tensor(expected, dtype=D))


RATIO = torch.tensor([[1.5, 0.5, 1.0, 1.3, 0.5]], dtype=D)
ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]], dtype=D)


def test_aepo_loss_keeps_a_rescaled_gradient_on_the_upper_clip():
    # eps = 0.2 / 0.28. token 0: rho 1.5 > 1.28, A > 0 -> value -1.28 (PPO's), gradient -1.28 (PPO: 0);
    # token 1: rho 0.5 < 0.8, A < 0 -> PPO's clip, value 0.8, gradient 0; token 2: -rho A = -1, gradient -1;
    # token 3: A < 0, rho 1.3: PPO's unclipped 1.3, gradient 1.3; token 4: rho 0.5, A > 0: -0.5, gradient -0.5
    logp = torch.log(RATIO).requires_grad_(True)
    loss, metrics = aepo_loss(logp, torch.zeros(1, 5, dtype=D), ADV, ClipSettings(clip_low=0.2, clip_high=0.28))
    assert_close(loss, torch.tensor([[-1.28, 0.8, -1.0, 1.3, -0.5]], dtype=D))
    loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-1.28, 0.0, -1.0, 1.3, -0.5]], dtype=D))
    assert metrics["clip_high_kept"].tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    assert metrics["clip_frac"].tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]


def test_aepo_loss_gradient_is_ce_gppo_with_beta1_0_beta2_1():
    logp = torch.log(RATIO).requires_grad_(True)
    ours, _ = aepo_loss(logp, torch.zeros(1, 5, dtype=D), ADV, ClipSettings(clip_low=0.2, clip_high=0.28))
    theirs, _ = ce_gppo_loss(logp, torch.zeros(1, 5, dtype=D), ADV,
                             CEGPPOSettings(clip_low=0.2, clip_high=0.28, beta1=0.0, beta2=1.0, dual_clip=0.0))
    (g_ours,) = torch.autograd.grad(ours.sum(), logp, retain_graph=True)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), logp)
    assert_close(g_ours, g_theirs)


# ------------------------------------------------------------------------------------------- ACE
def test_ace_scales_only_the_errors_by_their_confidence_shift():
    # r = [1, 0, 0]: GRPO A = (r - 1/3) / (sqrt(1/3) + eps) = [2/3, -1/3, -1/3] / 0.57735
    # c_i = sum_t (old - ref): row 0: 5 (a correct row: unchanged), row 1: 2, row 2: -3
    # errors: A * (1 + softplus(c)) = A * (1 + 2.126928), A * (1 + 0.048587)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=D)
    old = torch.tensor([[2.0, 3.0], [0.5, 0.5], [-3.0, 9.0]], dtype=D)
    ref = torch.tensor([[0.0, 0.0], [-0.5, -0.5], [0.0, 0.0]], dtype=D)
    got = advantage(ace_grpo_advantage, torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long), mask,
                    old_logp=old, ref_logp=ref)
    s = math.sqrt(1 / 3) + EPS
    a = [2 / 3 / s, -1 / 3 / s * (1 + math.log1p(math.exp(2.0))), -1 / 3 / s * (1 + math.log1p(math.exp(-3.0)))]
    assert_close(got, torch.tensor([[a[0], a[0]], [a[1], a[1]], [a[2], 0.0]], dtype=D))
    plain = advantage(ace_grpo_advantage, torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long), mask,
                      old_logp=old, ref_logp=ref, cfg={"ace_alpha": 0.0})
    assert_close(plain[:, 0], torch.tensor([a[0], -1 / 3 / s, -1 / 3 / s], dtype=D))


# ------------------------------------------------------------------------------------------- EPO
def test_epo_phase_weight_by_hand():
    ctl = EPOController(EPOSettings(horizon=4, lambda_slow=2.0, gamma=3.0))
    expected = {0: 1.0, 2: 1 - 0.2 * (1 - math.exp(-2.0)), 3: 0.8 * math.exp(-1.5), 4: 0.8 * math.exp(-3.0),
                9: 0.8 * math.exp(-3.0)}
    for k, w in expected.items():
        ctl.step = k
        assert ctl.weight() == pytest.approx(w)


def test_epo_term_values_and_gradient_by_hand():
    ctl = EPOController(EPOSettings(horizon=4, lambda_slow=0.0))  # beta = 1 in the first half
    h = torch.tensor([[0.5, 1.0, 1.5]], dtype=D, requires_grad=True)
    values, _ = epo_entropy_term(h, ctl)  # no history yet: the plain bonus
    assert_close(values, -h)
    metrics = ctl.update({"entropy": 1.0})  # H_bar = 1, k = 1
    assert metrics == {"epo/entropy_history": 1.0, "epo/smooth_weight": 1.0}
    # band [0.8, 1.2]: tokens 0 and 2 are out by 0.5 -> values [-0.5 + 0.5, -1, -1.5 + 0.5]
    values, m = epo_entropy_term(h, ctl)
    assert_close(values, torch.tensor([[0.0, -1.0, -1.0]], dtype=D))
    assert m["epo/out_of_band"].tolist() == [[1.0, 0.0, 1.0]]
    (grad,) = torch.autograd.grad(values.sum(), h)
    assert_close(grad, torch.tensor([[-2.0, -1.0, 0.0]], dtype=D))  # below the band: pushed up; above: held


def test_epo_history_is_the_mean_of_past_updates_and_survives_a_round_trip():
    a = EPOController(EPOSettings())
    for h in (1.0, 2.0, 4.5):
        a.update({"entropy": h})
    assert (a.history, a.step) == (2.5, 3)
    b = EPOController(EPOSettings())
    b.load_state_dict(a.state_dict())
    assert (b.history, b.step, b.weight()) == (a.history, a.step, a.weight())
    assert a.update({"entropy": 0.3}) == b.update({"entropy": 0.3})


# ------------------------------------------------------------------------------------------ AEnt
def test_adaptive_entropy_coefficient_by_hand_and_its_round_trip():
    s = AdaptiveEntropySettings(init_coef=1e-3, delta=1e-4, low=0.2, high=1.0, coef_max=1.15e-3)
    ctl = AdaptiveEntropyController(s)
    seen = [ctl.update({"entropy": h})["aent/coef"] for h in (0.1, 0.1, 0.1, 2.0, 0.5)]
    assert seen == pytest.approx([1.1e-3, 1.15e-3, 1.15e-3, 1.05e-3, 1.05e-3])  # up, up (capped), down, hold
    h = torch.tensor([[0.5, 2.0]], dtype=D, requires_grad=True)
    values, _ = adaptive_entropy_term(h, ctl)
    (grad,) = torch.autograd.grad(values.sum(), h)
    assert_close(grad, torch.full((1, 2), -1.05e-3, dtype=D))
    other = AdaptiveEntropyController(s)
    other.load_state_dict(ctl.state_dict())
    assert other.coef == ctl.coef and other.update({"entropy": 0.0}) == ctl.update({"entropy": 0.0})


def test_clamped_entropy_by_hand():
    """pi = (0.5, 0.3, 0.15, 0.05), p = 0.25: floor(0.25 * 4) = 1 token left out, the least probable
    (0.05); q = (0.5, 0.3, 0.15) / 0.95 = (0.526316, 0.315789, 0.157895);
    H^c = 0.526316 * 0.641854 + 0.315789 * 1.152680 + 0.157895 * 1.845827 = 0.337818 + 0.364004 + 0.291446
    = 0.993268 (the full entropy: 0.346574 + 0.361192 + 0.284568 + 0.149787 = 1.142120)."""
    logp = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]], dtype=D)).requires_grad_(True)
    h = clamped_entropy(logp, 0.25)
    assert h.shape == (1, 1) and h.item() == pytest.approx(0.993268, abs=1e-6)
    assert clamped_entropy(logp, 0.0).item() == pytest.approx(1.142120, abs=1e-6)  # p = 0: the full entropy
    (grad,) = torch.autograd.grad(h.sum(), logp)
    assert grad[0, 0, 3].item() == 0.0  # the left-out token gets no gradient
    # dH/dlogp_v for v kept: -q_v (log q_v + H) (re-normalisation shifts all kept log q by one constant,
    # whose gradient sums to zero); the most probable token's is negative: the bonus flattens q.
    q = torch.tensor([0.5, 0.3, 0.15], dtype=D) / 0.95
    assert_close(grad[0, 0, :3], -q * (q.log() + 0.993268), atol=1e-6, rtol=0)
    assert grad[0, 0, 0] < 0 < grad[0, 0, 2]


def test_clamped_entropy_term_follows_its_own_metric():
    ctl = ClampedEntropyController(ClampedEntropySettings(init_coef=1e-3, delta=1e-4, low=0.2, high=1.0))
    logp = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]], dtype=D))
    values, metrics = clamped_entropy_term(logp, ctl)
    assert values.item() == pytest.approx(-1e-3 * metrics["aent/clamped_entropy"].item())
    # the full entropy is inside the band, the clamped one below it: alpha follows the clamped one
    assert ctl.update({"entropy": 0.5, "aent/clamped_entropy": 0.1})["aent/coef"] == pytest.approx(1.1e-3)


# ------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(("override", "field"), [
    ("algo.advantage={name: gtpo, alpha2: -1}", "alpha2"),
    ("algo.advantage={name: ace_grpo, ace_alpha: -0.5}", "ace_alpha"),
    ("algo.advantage={name: aepo, alpha: -0.1}", "alpha"),
    ("algo.policy_loss={name: aepo, clip_high: -0.1}", "clip_high"),
    ("algo.loss_terms=[{name: epo_entropy, kappa_low: 2.0, kappa_high: 1.0}]", "kappa_low"),
    ("algo.loss_terms=[{name: epo_entropy, horizon: 0}]", "horizon"),
    ("algo.loss_terms=[{name: adaptive_entropy, init_coef: 1.0}]", "init_coef"),
    ("algo.loss_terms=[{name: clamped_entropy, clamp_p: 1.0}]", "clamp_p"),
])
def test_bad_options_are_config_errors_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [override])


def test_settings_accept_the_defaults():
    assert GTPOSettings().alpha1 == 1.0 and AEPOAdvantageSettings().alpha == 0.3 and ACESettings().ace_alpha == 1.0


# --------------------------------------------------------------------------------- through the learner
def _components(tmp_path, *overrides):
    from reinforge.orchestrate.components import build_components

    return build_components(load_config(None, [
        f"output_dir={tmp_path}", "rollout.prompts_per_step=2", "rollout.group_size=4", "task.heldout_size=10",
        "train.time_limit_s=0", "algo.skip_equal_reward_groups=false", "eval.final_samples=0", "log.report=false",
        *overrides]))


def _batch(c):
    from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn

    tasks = c.sampler.next_batch(c.cfg.rollout.prompts_per_step)
    _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=3)
    trajs = score_single_turn(tasks, gens, c.cfg.rollout.group_size, c.reward_pool)
    return build_batch(trajs, c.cfg.algo, c.engine.pad_id)[0]


def test_the_learner_gives_the_estimator_pi_old_entropy(tmp_path):
    from reinforge.learn.logprobs import token_logprobs

    c = _components(tmp_path, "algo.advantage=gtpo")
    batch = _batch(c)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])  # spread in both groups
    c.learner.prepare(batch)
    c.learner.estimate_advantages(batch)
    with torch.no_grad():
        _, h = token_logprobs(c.learner.model, batch.input_ids, batch.attention_mask, c.cfg.rollout.temperature,
                              entropy=True)
    expected = advantage(gtpo_advantage, batch.rewards, batch.group_index, batch.loss_mask, entropy=h)
    assert_close(batch.advantages, expected.to(batch.advantages.dtype), rtol=1e-4, atol=1e-5)
    assert batch.old_logprobs is not None  # the entropy came from the pi_old pass, run for it


def test_term_controllers_update_and_round_trip_through_the_learner_checkpoint(tmp_path):
    terms = ("algo.loss_terms=[{name: epo_entropy, coef: 0.01}, "
             "{name: adaptive_entropy, coef: 1.0, low: 5.0, high: 9.0}]")
    c = _components(tmp_path, terms)
    metrics = c.learner.update(_batch(c))
    epo, aent = c.learner.term_controllers[0], c.learner.term_controllers[1]
    assert epo.step == 1 and epo.history == pytest.approx(metrics["entropy"])
    assert aent.coef == pytest.approx(1e-3 + 1e-4)  # entropy below low = 5: alpha grew by delta
    assert metrics["aent/coef"] == aent.coef and "epo/smooth_weight" in metrics and "epo/out_of_band" in metrics
    state = c.learner.state_dict()
    fresh = _components(tmp_path / "b", terms)
    fresh.learner.load_state_dict(state)
    for i in (0, 1):
        assert fresh.learner.term_controllers[i].state_dict() == c.learner.term_controllers[i].state_dict()


def test_the_epo_recipe_trains_on_the_guessing_game(tmp_path):
    """Two tiny steps of the shipped agent_guessing_epo recipe: the EPO term's state moves every update."""
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config("agent_guessing_epo", [
        f"output_dir={tmp_path}", "train.steps=2", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0",
        "log.report=false", "train.time_limit_s=0", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "algo.skip_equal_reward_groups=false"])
    assert cfg.algo.loss_terms[0].name == "epo_entropy" and cfg.env.name == "guessing"
    rows = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2
    assert rows[0]["train/epo/entropy_history"] == pytest.approx(rows[0]["train/entropy"])
    assert rows[1]["train/epo/entropy_history"] == pytest.approx(
        (rows[0]["train/entropy"] + rows[1]["train/entropy"]) / 2)


def test_ace_through_the_learner_loads_a_reference_and_at_the_start_scales_errors_by_1_plus_ln2(tmp_path):
    """Before any update the policy is the reference: c_i = 0 for every row, softplus(0) = ln 2, so
    each error's GRPO advantage is multiplied by 1 + ln 2 and the correct rows keep theirs."""
    from reinforge.algo.advantage_estimators import grpo_advantage

    c = _components(tmp_path, "algo.advantage=ace_grpo")
    assert c.learner.ref_model is not None
    batch = _batch(c)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    c.learner.prepare(batch)
    c.learner.estimate_advantages(batch)
    plain = advantage(grpo_advantage, batch.rewards, batch.group_index, batch.loss_mask).to(batch.advantages.dtype)
    scale = torch.where(batch.rewards < torch.tensor([0.5] * 4 + [0.75] * 4), 1 + math.log(2), 1.0)
    assert_close(batch.advantages, plain * scale[:, None].to(plain.dtype), rtol=1e-4, atol=1e-5)
    assert math.isfinite(c.learner.update(batch)["loss"])


def test_the_clamped_entropy_term_gets_the_vocabulary_rows_and_moves_alpha(tmp_path):
    terms = "algo.loss_terms=[{name: clamped_entropy, coef: 1.0, low: 5.0, high: 9.0, clamp_p: 0.3}]"
    c = _components(tmp_path, terms)
    metrics = c.learner.update(_batch(c))
    assert 0 < metrics["aent/clamped_entropy"] < metrics["entropy"] + 1e-6  # fewer tokens, less entropy
    assert c.learner.term_controllers[0].coef == pytest.approx(1e-3 + 1e-4) == metrics["aent/coef"]
