"""``train.old_logprobs``: pi_old of the PPO ratio recomputed by a no-grad pass (the default; with one epoch the
first mini-batch's come from its own forward and the pass covers the other rows) or taken from the sampler's
log-probs (``rollout``: no pass; the first mini-batch measures the mismatch instead)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.learn.learner import Learner
from reinforge.models.loading import load_model
from reinforge.orchestrate.episodes import build_batch
from reinforge.types import Trajectory


def _rows() -> list[Trajectory]:
    """Two groups of two rows: a 3-token prompt and a 3-token completion, rewards 1 and 0 in each group."""
    rows = []
    for g, task in enumerate(("a", "b")):
        for r in (1.0, 0.0):
            ids = [1, 2 + g, 3, 4 + int(r), 5, 6]
            rows.append(Trajectory(ids, [0, 0, 0, 1, 1, 1], [0.0] * 6, 0, g, task, reward=r))
    return rows


def _learner(overrides: list[str]) -> tuple[Learner, object]:
    """In float64: the paths compared here run matmuls of other shapes (a mini-batch's rows, or all of them), whose
    float32 rounding differs with the thread count by about 1e-6."""
    cfg = load_config(None, ["train.minibatches=2", "algo.skip_equal_reward_groups=false", "model.dtype=float64",
                             *overrides])
    torch.manual_seed(0)
    return Learner.for_run(load_model("tiny-base", "float64"), cfg, load_model("tiny-base", "float64")), cfg


def _batch(cfg, sampling_logprobs=None):
    batch, _ = build_batch(_rows(), cfg.algo, pad_id=0)
    if sampling_logprobs is not None:
        batch = dataclasses.replace(batch, sampling_logprobs=sampling_logprobs.clone())
    return batch


def _learner_logprobs() -> torch.Tensor:
    """The learner's own log-probs of the rows (the recomputed pi_old), zero off the loss mask (two epochs: the
    pass covers every row)."""
    learner, cfg = _learner(["train.epochs=2"])
    batch = _batch(cfg)
    learner.prepare(batch)
    return batch.old_logprobs


def _count_forwards(learner: Learner, monkeypatch) -> list[int]:
    calls = [0]
    plain = learner.forward.logprobs

    def counted(*args, **kwargs):
        calls[0] += 1
        return plain(*args, **kwargs)

    monkeypatch.setattr(learner.forward, "logprobs", counted)
    return calls


def test_recompute_runs_the_pass_and_rollout_takes_the_samplers_logprobs_without_one(monkeypatch):
    learner_logp = _learner_logprobs()
    mask = _batch(_learner([])[1]).loss_mask
    assert (learner_logp[mask == 0] == 0).all() and (learner_logp[mask > 0] < 0).all()
    sampler = learner_logp + 0.25 * mask + 7.0 * (1 - mask)  # off the mask the sampler's values must not leak in
    recompute, cfg = _learner(["train.epochs=2"])
    calls = _count_forwards(recompute, monkeypatch)
    batch = _batch(cfg, sampler)
    recompute.prepare(batch)
    assert calls[0] == 1 and torch.equal(batch.old_logprobs, learner_logp)
    rollout, cfg = _learner(["train.old_logprobs=rollout"])
    calls = _count_forwards(rollout, monkeypatch)
    batch = _batch(cfg, sampler)
    rollout.prepare(batch)
    assert calls[0] == 0
    torch.testing.assert_close(batch.old_logprobs, learner_logp + 0.25 * mask, rtol=0, atol=1e-6)


def test_rollout_logs_the_mismatch_on_the_first_mini_batch_only(monkeypatch):
    """Sampler log-probs 0.25 above the learner's on every trained token: the mismatch is 0.25 (mean and max),
    measured by the first mini-batch's forward before any step; the second mini-batch, after a step, is not
    counted (its log-probs moved)."""
    learner_logp = _learner_logprobs()
    mask = _batch(_learner([])[1]).loss_mask
    rollout, cfg = _learner(["train.old_logprobs=rollout"])
    out = rollout.update(_batch(cfg, learner_logp + 0.25 * mask))
    assert out["logprob_mismatch"] == pytest.approx(0.25, abs=1e-5)
    assert out["logprob_mismatch_max"] == pytest.approx(0.25, abs=1e-5)
    assert out["updates"] == 2.0 and rollout._compare_sampler is False
    recompute, cfg = _learner([])
    out = recompute.update(_batch(cfg, learner_logp + 0.25 * mask))  # the pass measures it over every row
    assert out["logprob_mismatch"] == pytest.approx(0.25, abs=1e-5)


def test_equal_log_probs_give_the_same_update_either_way():
    """Where the sampler's log-probs are the learner's, both sources train to the same weights."""
    learner_logp = _learner_logprobs()
    weights = []
    for source in ("recompute", "rollout"):
        learner, cfg = _learner([f"train.old_logprobs={source}"])
        learner.update(_batch(cfg, learner_logp))
        weights.append([p.detach().clone() for p in learner.model.parameters()])
    for a, b in zip(*weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_kl_in_the_reward_is_taken_against_the_samplers_log_probs():
    """k1 in the reward: r_t = -beta (log pi_old - log pi_ref); pi_ref is the same weights here, so with the
    sampler 0.25 above the learner every trained token's reward is -0.01 * 0.25."""
    learner_logp = _learner_logprobs()
    overrides = ["train.old_logprobs=rollout", "algo.kl.coef=0.01", "algo.kl.placement=reward",
                 "algo.kl.estimator=k1", "train.minibatches=1"]
    learner, cfg = _learner(overrides)
    batch = _batch(cfg, learner_logp + 0.25 * _batch(cfg).loss_mask)
    learner.prepare(batch)
    expected = -0.01 * 0.25 * batch.loss_mask.to(batch.token_rewards.dtype)
    torch.testing.assert_close(batch.token_rewards, expected, rtol=0, atol=1e-7)


def test_rows_not_sampled_in_their_training_context_are_refused_with_rollout_log_probs():
    with pytest.raises(ConfigError, match="train.old_logprobs=rollout with demonstrations.path: demonstration rows"):
        load_config(None, ["train.old_logprobs=rollout", "demonstrations.path=task", "demonstrations.mix=true",
                           "algo.loss_terms=[{name: nll, coef: 1.0}]"])
    load_config(None, ["demonstrations.path=task", "demonstrations.mix=true", "algo.loss_terms=[{name: nll, coef: 1.0}]"])
    learner, cfg = _learner(["train.old_logprobs=rollout"])
    batch = _batch(cfg)
    batch = dataclasses.replace(batch, demo=torch.tensor([0.0, 1.0, 0.0, 0.0]))
    with pytest.raises(ConfigError, match="demonstration rows"):
        learner.prepare(batch)
    with pytest.raises(ConfigError, match="with rollout.hints: a hinted row"):
        load_config(None, ["train.old_logprobs=rollout", "rollout.hints={name: ghpo}"])
    with pytest.raises(ConfigError, match="with rollout.group_sampler=noisy_rollout: it trains each sample"):
        load_config(None, ["train.old_logprobs=rollout", "rollout.group_sampler=noisy_rollout"])
    for allowed in (["rollout.hints={name: ghpo}"], ["rollout.group_sampler=noisy_rollout"]):
        load_config(None, allowed)  # recomputed pi_old: accepted
    with pytest.raises(ConfigError, match="demonstrations.path: no part of algo trains on demonstrations"):
        load_config(None, ["train.old_logprobs=rollout", "demonstrations.path=task"])  # the more telling error first


def test_one_epoch_takes_the_first_mini_batchs_pi_old_from_its_own_forward(monkeypatch):
    """Two mini-batches, one epoch: the pass covers the second mini-batch's rows only (the first's are left 0),
    the first mini-batch's forward gives its pi_old, and the update equals one whose pi_old all came from the
    pass (the sampler's log-probs equal to the learner's, ``rollout``: no pass at all)."""
    learner_logp = _learner_logprobs()
    learner, cfg = _learner([])
    calls = _count_forwards(learner, monkeypatch)
    batch = _batch(cfg, learner_logp)
    learner.prepare(batch)
    first = learner._first_minibatch[0]
    rest = torch.tensor([i for i in range(4) if i not in first.tolist()])
    assert calls[0] == 1 and len(first) == 2
    assert (batch.old_logprobs[first] == 0).all()
    torch.testing.assert_close(batch.old_logprobs[rest], learner_logp[rest], rtol=1e-6, atol=1e-6)
    learner.estimate_advantages(batch)
    out = learner.update(batch)
    assert calls[0] == 3 and out["updates"] == 2.0 and learner._first_minibatch is None
    assert out["logprob_mismatch"] == pytest.approx(0.0, abs=1e-5)  # every row measured before a step
    reference, cfg = _learner(["train.old_logprobs=rollout"])
    reference.update(_batch(cfg, learner_logp))
    for a, b in zip(learner.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_pass_covers_every_row_when_pi_old_is_needed_before_the_update():
    """Two epochs (the first mini-batch's rows come back after a step), or the KL in the reward (pi_old before
    the advantages): pi_old of every row from the pass."""
    learner_logp = _learner_logprobs()
    for extra in (["train.epochs=2"], ["algo.kl.coef=0.01", "algo.kl.placement=reward"]):
        learner, cfg = _learner(extra)
        batch = _batch(cfg)
        learner.prepare(batch)
        assert learner._first_minibatch is None
        torch.testing.assert_close(batch.old_logprobs, learner_logp, rtol=0, atol=1e-6)


def test_minibatches_by_groups_keep_each_group_whole_and_its_prompt_computed_once(monkeypatch):
    """``train.minibatch_by=groups``: each mini-batch holds whole groups (one prompt each here), so the shared-prefix
    forward runs one prompt row per mini-batch; by rows the two rows of a mini-batch may come from two groups. The
    first mini-batch still takes its pi_old from its own forward."""
    seen = {"rows": [], "groups": []}
    for split in seen:
        for seed in range(4):
            learner, cfg = _learner([f"train.minibatch_by={split}", f"seed={seed}"])
            plain = learner.forward.logprobs

            def counted(model, mb, *args, _split=split, _plain=plain, **kwargs):
                seen[_split].append(len(torch.unique(mb.group_index)))
                return _plain(model, mb, *args, **kwargs)

            monkeypatch.setattr(learner.forward, "logprobs", counted)
            out = learner.update(_batch(cfg))
            assert out["updates"] == 2.0
    assert set(seen["groups"]) == {1}  # the pass over the second mini-batch and both training forwards
    assert 2 in seen["rows"]
    with pytest.raises(ConfigError, match="train.minibatch_by"):
        load_config(None, ["train.minibatch_by=pairs"])
