"""The learner's algorithm plumbing on the tiny model: KL placement, adaptive KL, entropy bonus,
mismatch correction, critic (warm-up, values), micro-batch invariance; and the data-side pieces
(overlong shaping, dynamic sampling, ReMax's greedy baseline)."""

import copy

import pytest
import torch
from numerics import assert_all_exact, float64_model

from reinforge.algo.kl import kl_k1
from reinforge.algo.returns import returns_to_go
from reinforge.config import load_config
from reinforge.learn.critic import ValueModel
from reinforge.learn.learner import Learner
from reinforge.orchestrate.components import build_components
from reinforge.orchestrate.episodes import (
    build_batch,
    generate_single_turn,
    groups_with_spread,
    score_single_turn,
    shape_rewards,
)
from reinforge.orchestrate.loop import Loop
from reinforge.types import Trajectory


def _cfg(tmp_path, *overrides):
    return load_config(None, [
        f"output_dir={tmp_path}", "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=20",
        "train.time_limit_s=0", "algo.skip_equal_reward_groups=false", "eval.final_samples=0", "log.report=false",
        *overrides,
    ])


def _rollout_batch(c, seed=1):
    cfg = c.cfg
    tasks = c.sampler.next_batch(cfg.rollout.prompts_per_step)
    _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=seed)
    trajs = score_single_turn(tasks, gens, cfg.rollout.group_size, c.reward_pool)
    batch, _ = build_batch(trajs, cfg.algo, c.engine.pad_id)
    return trajs, batch


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _changed(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_kl_in_reward_adds_token_returns_to_the_advantage(tmp_path):
    c = build_components(_cfg(tmp_path, "algo.kl.coef=0.5", "algo.kl.placement=reward", "algo.kl.estimator=k1",
                              "algo.advantage=rloo"))
    with torch.no_grad():  # move the reference away from the policy so the KL is not zero
        for p in c.learner.ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    _, batch = _rollout_batch(c)
    metrics = c.learner.update(batch)
    mask = batch.loss_mask
    kl = kl_k1(batch.old_logprobs, batch.ref_logprobs) * mask
    assert kl.abs().sum() > 0
    plain = load_config(None, ["algo.advantage=rloo"]).algo
    from reinforge.algo.advantage_estimators import rloo_advantage

    outcome = rloo_advantage(batch.rewards, batch.group_index, mask, plain.advantage.settings)
    expected = outcome + returns_to_go(-0.5 * kl, mask, 1.0)
    torch.testing.assert_close(batch.advantages, expected.float(), atol=1e-5, rtol=1e-5)
    assert metrics["kl_ref"] == pytest.approx(float(kl.sum() / mask.sum()), rel=1e-4)


def test_adaptive_kl_coefficient_moves_toward_target(tmp_path):
    c = build_components(_cfg(tmp_path, "algo.kl.coef=0.1", "algo.kl.target=1e-6", "algo.kl.horizon=1000",
                              "train.lr=1e-3", "rollout.prompts_per_step=8", "rollout.group_size=8"))
    _, batch = _rollout_batch(c)
    assert batch.rewards.min() < batch.rewards.max()
    c.learner.update(batch)  # step 1: policy == reference, KL 0 < target -> coefficient shrinks by 20% x 64/1000
    shrunk = 0.1 * (1 - 0.2 * 64 / 1000)
    assert c.learner.kl_ctl.value == pytest.approx(shrunk)
    _, batch = _rollout_batch(c, seed=2)
    m = c.learner.update(batch)
    assert m["kl_ref"] > 1e-6 and m["kl_coef"] == pytest.approx(shrunk * (1 + 0.2 * 64 / 1000))  # KL > target
    fixed = build_components(_cfg(tmp_path, "algo.kl.coef=0.1"))
    _, batch = _rollout_batch(fixed)
    assert fixed.learner.update(batch)["kl_coef"] == 0.1


def test_entropy_bonus_raises_entropy_without_reward_signal(tmp_path):
    """All advantages zero (equal rewards): only the entropy bonus moves the policy, and upward."""
    c = build_components(_cfg(tmp_path, "algo.entropy_coef=1.0", "train.lr=3e-3", "algo.advantage=rloo"))
    _, batch = _rollout_batch(c)
    batch.rewards = torch.zeros_like(batch.rewards)
    before = c.learner.update(copy.deepcopy(batch))["entropy"]
    after = c.learner.update(copy.deepcopy(batch))["entropy"]
    assert after > before + 1e-3
    off = build_components(_cfg(tmp_path, "algo.advantage=rloo"))
    _, batch = _rollout_batch(off)
    batch.rewards = torch.zeros_like(batch.rewards)
    weights = _params(off.learner.model)
    off.learner.update(batch)
    assert not _changed(weights, off.learner.model)  # no reward spread, no bonus: no update at all


@pytest.mark.parametrize("mode", ["token_tis", "seq_tis", "token_mask", "seq_mask"])
def test_mismatch_correction_is_applied_and_reported(tmp_path, mode):
    c = build_components(_cfg(tmp_path, f"algo.mismatch.mode={mode}", "algo.mismatch.cap=1.5"))
    _, batch = _rollout_batch(c)
    sign = torch.where(torch.arange(len(batch)) % 2 == 0, 1.0, -1.0)[:, None]
    batch.sampling_logprobs = batch.sampling_logprobs - sign * batch.loss_mask  # ratio learner/sampler: e or 1/e
    m = c.learner.update(batch)
    assert m["logprob_mismatch"] == pytest.approx(1.0, abs=1e-3)
    assert m["mismatch/mismatch_k3"] > 0.1
    assert m["mismatch/is_corrected"] > 0.2
    none = build_components(_cfg(tmp_path))
    _, batch = _rollout_batch(none)
    m = none.learner.update(batch)
    assert m["mismatch/is_corrected"] == 0 and m["mismatch/is_weight"] == pytest.approx(1.0, abs=1e-4)


def test_value_model_alignment_and_zero_init(tiny_model):
    vm = ValueModel(tiny_model)
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 0]])
    values = vm(ids, (ids != 0).long())
    assert values.shape == (2, 4) and torch.equal(values, torch.zeros(2, 4))
    torch.nn.init.normal_(vm.head.weight)
    v = vm(ids, (ids != 0).long())
    assert torch.all(v[:, 0] == 0) and v[:, 1:].abs().sum() > 0
    # value of token t depends only on tokens < t: changing token 3 leaves columns 0..3 unchanged
    ids2 = ids.clone()
    ids2[0, 3] = 4
    torch.testing.assert_close(vm(ids2, (ids2 != 0).long())[0, :4], v[0, :4])


def test_critic_warmup_trains_only_the_critic_first(tmp_path):
    c = build_components(_cfg(tmp_path, "preset=ppo", "algo.critic.warmup_steps=1", "algo.kl.coef=0"))
    assert c.learner.critic is not None
    _, batch = _rollout_batch(c)
    policy, critic = _params(c.learner.model), _params(c.learner.critic.model)
    m = c.learner.update(batch)
    assert not _changed(policy, c.learner.model) and _changed(critic, c.learner.critic.model)
    assert m["updates"] == 0 and m["critic/value_loss"] > 0
    _, batch = _rollout_batch(c, seed=2)
    m = c.learner.update(batch)
    assert _changed(policy, c.learner.model) and m["updates"] == c.cfg.train.minibatches == 4
    assert batch.returns is not None and "critic/explained_variance" in m


def test_critic_state_round_trips(tmp_path):
    c = build_components(_cfg(tmp_path, "preset=ppo"))
    _, batch = _rollout_batch(c)
    c.learner.update(batch)
    state = copy.deepcopy(c.learner.state_dict())
    other = build_components(_cfg(tmp_path, "preset=ppo"))
    other.learner.load_state_dict(state)
    for a, b in zip(c.learner.critic.model.parameters(), other.learner.critic.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert other.learner.kl_ctl.value == c.learner.kl_ctl.value


@pytest.mark.numerics
@pytest.mark.filterwarnings(r"ignore:Seems like `optimizer.step\(\)` has been overridden")
@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_learner_gradient_does_not_depend_on_micro_batching(tmp_path, preset):
    """One micro-batch vs several (token budget) give the same policy gradient (float64, tests/numerics.py)."""
    grads = []
    for budget in (100_000, 40):
        c = build_components(_cfg(tmp_path, f"preset={preset}", f"train.micro_batch_tokens={budget}",
                                  "train.minibatches=1", "train.shared_prefix=false", "model.dtype=float64"))
        float64_model(c.learner.model)
        if c.learner.critic is not None:
            float64_model(c.learner.critic.model)
        _, batch = _rollout_batch(c)
        captured: dict = {}
        model = c.learner.model
        c.learner.optimizer.step = lambda captured=captured, model=model: captured.update(
            g=[p.grad.clone() for p in model.parameters() if p.grad is not None])
        c.learner.update(batch)
        grads.append(captured["g"])
    assert_all_exact(grads[1], grads[0])


def _traj(group, reward, n_gen, finish="stop"):
    return Trajectory(token_ids=[1, 2] + [3] * n_gen, loss_mask=[0, 0] + [1] * n_gen, logprobs=[0.0] * (2 + n_gen),
                      version=0, group_id=group, task_id=str(group), reward=reward, finish_reason=finish)


def test_soft_overlong_penalty_and_filter_on_trajectories():
    algo = load_config(None, ["algo.reward_shapers=[{name: overlong_penalty, buffer: 0.25}, "
                              "{name: overlong_filter}]"]).algo
    trajs = [_traj(0, 1.0, 6), _traj(0, 1.0, 7), _traj(0, 1.0, 8, "length")]
    shape_rewards(trajs, algo.reward_shapers, max_new_tokens=8)  # buffer = 2: penalty starts after 6 tokens
    assert [t.reward for t in trajs] == [1.0, 0.5, 0.0]
    assert [t.truncated for t in trajs] == [False, False, True]
    assert [t.trainable for t in trajs] == [True, True, False]
    batch, _ = build_batch(trajs, algo, pad_id=0)
    assert batch.loss_mask.sum(-1).tolist() == [6, 7, 0]


def test_groups_with_spread_and_remax_baseline_in_batch():
    trajs = [_traj(0, 1.0, 2), _traj(0, 1.0, 3), _traj(3, 0.0, 2), _traj(3, 1.0, 2)]
    assert groups_with_spread(trajs) == {3}
    algo = load_config(None, ["algo.skip_equal_reward_groups=true"]).algo
    batch, stats = build_batch(trajs, algo, pad_id=0, baseline=[1.0, 1.0, 0.0, 0.0])
    assert batch.baseline.tolist() == [0.0, 0.0] and batch.rewards.tolist() == [0.0, 1.0]
    assert (stats.groups, stats.groups_kept, stats.sequences_kept) == (2, 1, 2)


def test_dynamic_sampling_fills_the_batch_with_spread_groups(tmp_path):
    cfg = _cfg(tmp_path, "preset=dapo", "rollout.prompts_per_step=6", "algo.dynamic_sampling_max_rounds=5")
    c = build_components(cfg)
    loop = Loop(c, tmp_path, 0, 10)
    rollout = loop.source.collect(step=1)
    kept_groups = {t.group_id for t in rollout.kept}
    assert len(kept_groups) == 6 or rollout.rounds == 5
    assert kept_groups <= groups_with_spread(rollout.sampled)
    assert len(rollout.sampled) == rollout.rounds * 6 * 4
    assert len({t.group_id for t in rollout.sampled}) == rollout.rounds * 6  # group ids never collide
    capped = build_components(_cfg(tmp_path, "preset=dapo", "rollout.prompts_per_step=6",
                                   "algo.dynamic_sampling_max_rounds=1"))
    assert Loop(capped, tmp_path, 0, 10).source.collect(step=1).rounds == 1


def test_remax_collects_one_greedy_baseline_per_prompt(tmp_path):
    c = build_components(_cfg(tmp_path, "preset=remax"))
    rollout = Loop(c, tmp_path, 0, 10).source.collect(step=1)
    assert rollout.baseline is not None and len(rollout.baseline) == len(rollout.kept) == 16
    for g in range(4):  # one value per group, and it is a reward of this task
        assert len({b for t, b in zip(rollout.kept, rollout.baseline, strict=True) if t.group_id == g}) == 1
    batch, _ = build_batch(rollout.kept, c.cfg.algo, c.engine.pad_id, rollout.baseline)
    c.learner.update(batch)
    expected = (batch.rewards - batch.baseline)[:, None] * batch.loss_mask
    torch.testing.assert_close(batch.advantages, expected)


def test_gae_without_critic_is_refused(tmp_path, tiny_model):
    from reinforge.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a critic"):
        Learner.for_run(tiny_model, _cfg(tmp_path, "preset=ppo"))
