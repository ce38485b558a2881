"""ROVER (algo/rover.py): the next state's uniform-policy value, the loss and its gradient by hand, the
optional clip, pi_old's mean log-probability over the vocabulary from the learner's no-grad pass, and the preset."""

from __future__ import annotations

import math

import pytest
import torch
from test_learner_parts import _rollout_batch

from reinforge.algo.rover import ROVERSettings, clipped_q, next_state_values, rover_loss
from reinforge.config import load_config
from reinforge.learn.learner import Learner
from reinforge.models.loading import load_model
from reinforge.orchestrate.components import build_components

L2, L4, L34 = math.log(0.5), math.log(0.25), math.log(0.75)


def _rows():
    # one sequence of 3 positions over a vocabulary of 2: position 0 untrained (zeros), then pi = (.5, .5), (.25, .75)
    return torch.tensor([[[0.0, 0.0], [L2, L2], [L4, L34]]])


def test_next_state_values_by_hand():
    old_mean = torch.tensor([[0.0, L2, L2]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    # rho 2: gap_t = 2 (mean_a log pi - old mean) m_t = [0, 0, 2 ((L4 + L34) / 2 - L2)] = [0, 0, -0.287682];
    # V_{t+1} at t: [gap_1, gap_2, 0]
    v = next_state_values(_rows(), old_mean, mask, rho=2.0)
    assert v.tolist()[0] == pytest.approx([0.0, -0.287682, 0.0], abs=1e-6)


def test_loss_and_gradient_by_hand():
    logp = torch.tensor([[0.0, L2, L4]], requires_grad=True)
    old = torch.tensor([[0.0, L2, L2]])
    adv = torch.tensor([[0.0, 1.0, 1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    rows = _rows().requires_grad_(True)
    loss, metrics = rover_loss(logp, old, rows, torch.tensor([[0.0, L2, L2]]), adv, mask, ROVERSettings(rho=2.0))
    # Q = 2 (logp - old) = [0, 0, -1.386294]; target = A + V_next = [0, 0.712318, 1]
    # L = [0, 0.712318^2, (-1.386294 - 1)^2] = [0, 0.507397, 5.694401]
    assert loss.tolist()[0] == pytest.approx([0.0, 0.507397, 5.694401], abs=1e-5)
    assert metrics["q"].tolist()[0] == pytest.approx([0.0, 0.0, -1.386294], abs=1e-6)
    loss.sum().backward()
    # dL/dlogp_t = 2 (Q_t - target_t) rho: [0, -2.849272, -9.545177]; the target is a constant: rows get none
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -2.849272, -9.545177], abs=1e-5)
    assert rows.grad is None or torch.all(rows.grad == 0)


def test_on_policy_the_gradient_is_the_policy_gradient():
    logp = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    adv = torch.tensor([[0.5, -2.0]])
    rows = torch.log_softmax(torch.tensor([[[0.1, 0.4], [1.0, -1.0]]]), -1)
    loss, _ = rover_loss(logp, logp.detach(), rows, rows.mean(-1), adv, torch.ones(1, 2), ROVERSettings(rho=1.5))
    loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx((-2 * 1.5 * adv).tolist()[0])  # -2 rho A


def test_the_clip_holds_q_where_the_target_pulls_it_further():
    q = torch.tensor([0.5, -0.5, 0.05, 0.5], requires_grad=True)
    target = torch.tensor([1.0, -1.0, 1.0, 0.0])
    held, mask = clipped_q(q, target, 0.2)
    # log 1.2 = 0.182322, log 0.8 = -0.223144; the last token's target is below Q: not held
    assert held.tolist() == pytest.approx([0.182322, -0.223144, 0.05, 0.5], abs=1e-6)
    assert mask.tolist() == [True, True, False, False]
    held.sum().backward()
    assert q.grad.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_refuses_without_the_vocabulary_fields():
    with pytest.raises(ValueError, match="old_vocab_mean"):
        rover_loss(torch.zeros(1, 2), torch.zeros(1, 2), None, None, torch.zeros(1, 2), torch.ones(1, 2), ROVERSettings())


def test_the_learner_gives_pi_olds_mean_log_probability_over_the_vocabulary(tmp_path):
    cfg = load_config(None, ["preset=rover", f"output_dir={tmp_path}", "rollout.prompts_per_step=2",
                             "rollout.group_size=2", "task.heldout_size=4"])
    c = build_components(load_config(None, [f"output_dir={tmp_path}", "rollout.prompts_per_step=2",
                                            "rollout.group_size=2", "task.heldout_size=4",
                                            "algo.skip_equal_reward_groups=false"]))
    _, batch = _rollout_batch(c)
    learner = Learner.for_run(load_model(cfg.model.path, cfg.model.dtype, cfg.model.device), cfg)
    learner.prepare(batch)
    with torch.no_grad():
        logits = learner.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        expected = torch.log_softmax(logits.float(), -1).mean(-1)
    trained = batch.loss_mask[:, 1:] > 0
    assert batch.old_vocab_mean is not None and trained.any()
    assert torch.allclose(batch.old_vocab_mean[:, 1:][trained], expected[trained], atol=1e-5)
    assert torch.all(batch.old_vocab_mean[:, 1:][~trained] == 0)
    learner.estimate_advantages(batch)
    metrics = learner.update(batch)
    assert metrics["updates"] == 4 and math.isfinite(metrics["loss"])
