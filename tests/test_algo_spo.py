"""SPO (arXiv:2509.13232): the per-prompt value tracker and the batch-normalised advantage, against
hand-computed values; the tracker through the learner's checkpoint."""

from __future__ import annotations

import pytest
import torch
from part_calls import advantage

from reinforge.algo.spo import SPOSettings, ValueTracker, spo_advantage
from reinforge.config import AlgoConfig, load_config


def test_tracker_hand_computed_constant_rho():
    t = ValueTracker(SPOSettings(rho=0.5))
    assert t.values([7]) == [0.5]  # the prior
    t.observe([7], [1.0])  # alpha = 0.5 * 0.5 + 1 = 1.25, beta = 0.5 * 0.5 + 0 = 0.25
    assert t.alpha[7] == 1.25 and t.beta[7] == 0.25 and t.values([7]) == [pytest.approx(1.25 / 1.5)]
    t.observe([7, 7], [0.0, 1.0])  # one forgetting step, both rewards: alpha = 0.625 + 1, beta = 0.125 + 1
    assert t.alpha[7] == 1.625 and t.beta[7] == 1.125


def test_kl_rho_reads_the_drift_since_the_last_visit():
    s = SPOSettings(rho_mode="kl", d_half=0.1, rho_min=0.1, rho_max=0.96)
    t = ValueTracker(s)
    t.observe([1], [1.0])
    assert t.rho(1) == 0.96  # no drift yet: 2^0 = 1, clipped to rho_max
    assert t.update({"approx_kl_old": 0.1})["spo/drift"] == pytest.approx(0.1)
    t.update({"approx_kl_old": 0.1})
    assert t.rho(1) == pytest.approx(0.25)  # D = 0.2 = 2 half-lives
    t.observe([1], [0.0])
    assert t.rho(1) == 0.96  # visited again: the drift since is 0


def test_spo_advantage_hand_computed_group_size_one():
    t = ValueTracker(SPOSettings(rho=1.0, normalize=False))
    mask = torch.ones(3, 2)
    keys = torch.tensor([1, 2, 3])
    adv = advantage(spo_advantage, torch.tensor([1.0, 0.0, 1.0]), torch.arange(3), mask, cfg=t, prompt_key=keys)
    assert adv[:, 0].tolist() == [0.5, -0.5, 0.5]  # r - 0.5 (the prior), before the update
    adv = advantage(spo_advantage, torch.tensor([1.0, 1.0, 0.0]), torch.arange(3), mask, cfg=t, prompt_key=keys)
    # v after one visit: (0.5 + r) / 2 = [0.75, 0.25, 0.75]
    assert adv[:, 1].tolist() == [0.25, 0.75, -0.75]
    t2 = ValueTracker(SPOSettings(rho=1.0))  # normalised: (A - mean) / (population std + eps)
    adv = advantage(spo_advantage, torch.tensor([1.0, 0.0, 1.0]), torch.arange(3), mask, cfg=t2, prompt_key=keys)
    a = torch.tensor([0.5, -0.5, 0.5], dtype=torch.float64)
    want = (a - a.mean()) / (((a - a.mean()) ** 2).mean().sqrt() + 1e-6)
    assert adv[:, 0].tolist() == pytest.approx(want.tolist(), rel=1e-6)


def test_spo_needs_its_tracker_and_keeps_every_group():
    with pytest.raises(ValueError, match="ValueTracker"):
        advantage(spo_advantage, torch.ones(2), torch.arange(2), torch.ones(2, 1), prompt_key=torch.arange(2))
    with pytest.raises(ValueError, match="skip_equal_reward_groups"):
        AlgoConfig(advantage="spo")
    with pytest.raises(ValueError, match="rho_min"):
        AlgoConfig(advantage={"name": "spo", "rho_min": 0.9, "rho_max": 0.5}, skip_equal_reward_groups=False)


@pytest.mark.slow
def test_the_tracker_round_trips_through_the_learner_checkpoint(tmp_path):
    from reinforge.orchestrate.components import build_components
    from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn

    def components(path):
        return build_components(load_config(None, [
            f"output_dir={path}", "rollout.prompts_per_step=4", "rollout.group_size=1", "task.heldout_size=10",
            "train.time_limit_s=0", "algo.advantage=spo", "algo.skip_equal_reward_groups=false",
            "eval.final_samples=0", "log.report=false"]))

    c = components(tmp_path / "a")
    tasks = c.sampler.next_batch(4)
    _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=3)
    trajs = score_single_turn(tasks, gens, 1, c.reward_pool)
    for t, r in zip(trajs, [1.0, 0.0, 1.0, 0.0], strict=True):
        t.reward = r
    batch = build_batch(trajs, c.cfg.algo, c.engine.pad_id)[0]
    assert batch.prompt_key is not None and len(batch) == 4
    metrics = c.learner.update(batch)
    assert metrics["spo/prompts_tracked"] == len({t.id for t in tasks}) and "spo/rho" in metrics
    state = c.learner.state_dict()
    fresh = components(tmp_path / "b")
    fresh.learner.load_state_dict(state)
    assert fresh.learner.advantage_controller.state_dict() == c.learner.advantage_controller.state_dict()
    again = build_batch(trajs, c.cfg.algo, c.engine.pad_id)[0]
    twin = build_batch(trajs, c.cfg.algo, c.engine.pad_id)[0]
    for learner, b in ((c.learner, again), (fresh.learner, twin)):
        learner.prepare(b)
        learner.estimate_advantages(b)
    torch.testing.assert_close(again.advantages, twin.advantages)
