"""Sequence and problem weights and the scheduled KL weight against hand-computed values: EGSW's
entropy-guided softmax weights, MGPO's MaxEnt-guided group weights, GRPO-D's dynamic KL term and its
clock across updates and checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
from part_calls import advantage
from torch.testing import assert_close

from reinforge.algo.advantage_estimators import ADVANTAGES, grpo_advantage
from reinforge.algo.aggregation import LOSS_AGG, AggNorm
from reinforge.algo.entropy_shaping import EGSWSettings, egsw_advantage
from reinforge.algo.kl_adaptive import KLScheduleController, KLScheduleSettings, kl_dynamic_term
from reinforge.algo.maxent_weighting import MGPOSettings, maxent_deviation, mgpo_advantage
from reinforge.algo.objective import LOSS_TERMS, required_inputs
from reinforge.config import load_config
from reinforge.errors import ConfigError

D = torch.float64
LN = math.log


# ------------------------------------------------------------------------------------------ EGSW
def test_egsw_weights_by_hand():
    # group 0: r = [1, 0]: mean 0.5, unbiased std sqrt(0.5): A = +-0.5 / (0.707107 + 1e-6) = +-0.707106
    # mean entropies: row 0 (1 + 3) / 2 = 2, row 1 only its first token = 1; alpha 0.5, P 1:
    # scores 0.707106 + 1 = 1.707106 and -0.707106 + 0.5 = -0.207106;
    # w_0 = 2 e^1.707106 / (e^1.707106 + e^-0.207106) = 1.742983, w_1 = 2 - w_0 = 0.257017
    # A' = 1.742983 * 0.707106 = 1.232473 and -0.257017 * 0.707106 = -0.181738
    # group 1: equal rewards, A = 0 whatever the weights
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]], dtype=D)
    entropy = torch.tensor([[1.0, 3.0], [1.0, 9.0], [5.0, 0.1], [0.2, 0.3]], dtype=D)
    got = advantage(egsw_advantage, rewards, groups, mask, entropy=entropy, cfg={"egsw_alpha": 0.5})
    expected = torch.tensor([[1.232473, 1.232473], [-0.181738, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=D)
    assert_close(got, expected, atol=1e-6, rtol=0)


def test_egsw_temperature_and_alpha_zero_by_hand():
    # r = [1, 1, 0]: GRPO A = [0.577349, 0.577349, -1.154699]; alpha 0, P 2: e^(A/2) normalised to mean 1:
    # w = [1.239352, 1.239352, 0.521297], A' = [0.715539, 0.715539, -0.601941]
    mask = torch.ones(3, 1, dtype=D)
    got = advantage(egsw_advantage, torch.tensor([1.0, 1.0, 0.0]), torch.zeros(3, dtype=torch.long), mask,
                    entropy=torch.tensor([[4.0], [0.0], [1.0]], dtype=D), cfg={"egsw_alpha": 0.0, "temperature": 2.0})
    assert_close(got[:, 0], torch.tensor([0.715539, 0.715539, -0.601941], dtype=D), atol=1e-6, rtol=0)


def test_egsw_at_a_high_temperature_is_grpo_and_reads_the_entropy():
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 0, 1, 1])
    mask = torch.ones(5, 3, dtype=D)
    entropy = torch.rand(5, 3, dtype=D, generator=torch.Generator().manual_seed(0))
    got = advantage(egsw_advantage, rewards, groups, mask, entropy=entropy, cfg={"temperature": 1e9})
    assert_close(got, advantage(grpo_advantage, rewards, groups, mask))
    assert ADVANTAGES.needs("egsw") == {"entropy"} and EGSWSettings().temperature == 1.0


# ------------------------------------------------------------------------------------------ MGPO
def test_maxent_deviation_by_hand():
    # D(0.5) = 0; D(0) = D(1) = ln 2 (0 ln 0 = 0); D(0.25) = 0.25 ln 0.5 + 0.75 ln 1.5 = 0.130812
    got = maxent_deviation(torch.tensor([0.5, 0.0, 1.0, 0.25, 0.75]))
    assert_close(got, torch.tensor([0.0, LN(2), LN(2), 0.130812, 0.130812], dtype=D), atol=1e-6, rtol=0)


def test_mgpo_weights_each_group_by_its_accuracy():
    # group 0: 1 of 4 correct, p = 0.25: GRPO A = [1.5, -0.5, -0.5, -0.5] (std 0.5, eps 1e-6),
    #   lambda 2: w = exp(-2 * 0.130812) = 0.769800
    # group 1: 1 of 2 correct, p = 0.5: w = 1, A = GRPO's +-0.707106
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    mask = torch.tensor([[1, 1]] * 5 + [[1, 0]], dtype=D)
    got = advantage(mgpo_advantage, rewards, groups, mask, cfg={"mgpo_lambda": 2.0})
    a = 1.5 / 1.000002  # 0.5 / (0.5 + 1e-6) scaled
    w = 0.769800
    row = torch.tensor([w * a, -w * a / 3, -w * a / 3, -w * a / 3, 0.707106, -0.707106], dtype=D)
    assert_close(got, row[:, None] * mask, atol=1e-6, rtol=0)


def test_mgpo_lambda_zero_is_grpo_and_the_threshold_decides_correctness():
    rewards, groups, mask = torch.tensor([0.9, 0.2, 0.2, 0.2]), torch.zeros(4, dtype=torch.long), torch.ones(4, 1)
    assert_close(advantage(mgpo_advantage, rewards, groups, mask, cfg={"mgpo_lambda": 0.0}),
                 advantage(grpo_advantage, rewards, groups, mask))
    # threshold 1.0: nothing correct, p = 0, w = 2^-1 = 0.5; threshold 0.5: p = 0.25 -> w = 0.877367
    grpo = advantage(grpo_advantage, rewards, groups, mask)
    assert_close(advantage(mgpo_advantage, rewards, groups, mask), 0.5 * grpo)
    got = advantage(mgpo_advantage, rewards, groups, mask, cfg={"correct_threshold": 0.5})
    assert_close(got, math.exp(-0.130812) * grpo, atol=1e-6, rtol=0)
    assert MGPOSettings().mgpo_lambda == 1.0


# ---------------------------------------------------------------------------------------- GRPO-D
def test_kl_schedule_by_hand():
    # linear from 0.01 to 0.05 over 4 updates: 0.01, 0.02, 0.03, 0.04, 0.05, then it stays
    ctl = KLScheduleController(KLScheduleSettings(beta_start=0.01, beta_end=0.05, horizon=4))
    seen = []
    for _ in range(6):
        seen.append(ctl.beta())
        assert ctl.update({}) == {"kl_dynamic/beta": ctl.beta()}
    assert seen == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05, 0.05])
    # cosine 0 -> 0.1 over 4: (1 - cos(pi x)) / 2 at x = 1/4, 1/2, 3/4 = 0.146447, 0.5, 0.853553
    cos = KLScheduleController(KLScheduleSettings(beta_start=0.0, beta_end=0.1, horizon=4, shape="cosine"))
    seen = []
    for _ in range(5):
        seen.append(cos.beta())
        cos.update({})
    assert seen == pytest.approx([0.0, 0.0146447, 0.05, 0.0853553, 0.1], abs=1e-7)
    # a falling schedule is allowed too (beta_end < beta_start)
    down = KLScheduleController(KLScheduleSettings(beta_start=0.1, beta_end=0.0, horizon=2))
    down.update({})
    assert down.beta() == pytest.approx(0.05)


def test_kl_dynamic_term_values_gradient_and_round_trip():
    # pi = 0.5, pi_ref = 0.25: k3 = 0.5 - 1 - ln 0.5 = 0.193147, d k3 / d log pi = 1 - 0.5 = 0.5
    # after 2 of 4 updates (0 -> 0.08, linear): beta = 0.04; token mean over 3 tokens
    ctl = KLScheduleController(KLScheduleSettings(beta_start=0.0, beta_end=0.08, horizon=4))
    ctl.update({})
    ctl.update({})
    logp = torch.full((2, 2), LN(0.5), dtype=D, requires_grad=True)
    ref = torch.full((2, 2), LN(0.25), dtype=D)
    values, metrics = kl_dynamic_term(logp, ref, ctl)
    assert_close(values, torch.full((2, 2), 0.04 * 0.193147, dtype=D), atol=1e-7, rtol=0)
    assert_close(metrics["kl_ref"], torch.full((2, 2), 0.193147, dtype=D), atol=1e-6, rtol=0)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=D)
    LOSS_AGG.get("token_mean")(values, mask, AggNorm(num_tokens=3.0, num_seqs=2.0)).backward()
    assert_close(logp.grad, torch.tensor([[0.04 * 0.5 / 3] * 2, [0.04 * 0.5 / 3, 0.0]], dtype=D))
    fresh = KLScheduleController(ctl.settings)
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.step == 2 and fresh.beta() == pytest.approx(0.04)


def test_kl_dynamic_declares_the_reference_and_validates_its_options():
    assert LOSS_TERMS.needs("kl_dynamic") == {"ref_logp"}
    algo = load_config(None, ["algo.loss_terms=[{name: kl_dynamic, beta_end: 0.1, horizon: 50}]"]).algo
    assert "ref_logp" in required_inputs(algo)
    assert algo.loss_terms[0].settings().horizon == 50
    for bad, field in (("horizon: 0", "horizon"), ("shape: step", "shape"), ("estimator: k9", "estimator"),
                       ("beta_start: -1", "beta_start")):
        with pytest.raises(ConfigError, match=field):
            load_config(None, [f"algo.loss_terms=[{{name: kl_dynamic, {bad}}}]"])


def test_kl_dynamic_clock_moves_through_the_learner_and_its_checkpoint(tmp_path):
    from reinforge.orchestrate.components import build_components
    from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn

    def components(path):
        return build_components(load_config(None, [
            f"output_dir={path}", "rollout.prompts_per_step=2", "rollout.group_size=4", "task.heldout_size=10",
            "train.time_limit_s=0", "algo.skip_equal_reward_groups=false", "eval.final_samples=0",
            "log.report=false", "algo.loss_terms=[{name: kl_dynamic, beta_start: 0.0, beta_end: 0.1, horizon: 4}]"]))

    c = components(tmp_path)
    tasks = c.sampler.next_batch(c.cfg.rollout.prompts_per_step)
    _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=3)
    batch = build_batch(score_single_turn(tasks, gens, c.cfg.rollout.group_size, c.reward_pool), c.cfg.algo,
                        c.engine.pad_id)[0]
    metrics = c.learner.update(batch)
    ctl = c.learner.term_controllers[0]
    assert ctl.step == 1 and metrics["kl_dynamic/beta"] == pytest.approx(0.025)
    assert metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # first update: pi = pi_ref
    fresh = components(tmp_path / "b")
    fresh.learner.load_state_dict(c.learner.state_dict())
    assert fresh.learner.term_controllers[0].step == 1


def test_kl_dynamic_stays_on_the_inputs_device():
    ctl = KLScheduleController(KLScheduleSettings(beta_start=0.01))
    values, metrics = kl_dynamic_term(torch.zeros(2, 3, device="meta"), torch.zeros(2, 3, device="meta"), ctl)
    assert values.device.type == metrics["kl_ref"].device.type == "meta"
