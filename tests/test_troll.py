"""TROLL's sparse support, its KL trust-region projection (value and implicit gradient) and its loss,
against hand-computed values."""

import math

import pytest
import torch
from part_calls import call
from torch.testing import assert_close

from reinforge.algo import POLICY_LOSSES
from reinforge.algo.troll import OLD_TOPK_SLOTS, old_support, project, troll_loss

LOG = torch.log


def test_troll_registered_with_its_need():
    entry = POLICY_LOSSES.entry("troll")
    assert "2510.03817" in entry.paper and "old_topk" in entry.needs
    assert {"logp_vocab", "old_topk_logp", "old_topk_index"} <= set(entry.params)


def test_old_support_puts_the_taken_token_first():
    # V = 5, p = [0.05, 0.4, 0.3, 0.15, 0.1]; k = 3 -> top-3 = tokens 1, 2, 3
    dist = LOG(torch.tensor([[0.05, 0.4, 0.3, 0.15, 0.1], [0.05, 0.4, 0.3, 0.15, 0.1]]))
    idx, val = old_support(dist, torch.tensor([2, 4]), k=3)
    # row 0: taken 2 is in the top-3 -> [2, 1, 3]; row 1: taken 4 is not -> it replaces the last (3): [4, 1, 2]
    assert idx.tolist() == [[2, 1, 3], [4, 1, 2]]
    assert_close(val.exp(), torch.tensor([[0.3, 0.4, 0.15], [0.1, 0.4, 0.3]]))
    assert old_support(dist, torch.tensor([0, 0]))[0].shape[-1] == 5  # k capped at V (OLD_TOPK_SLOTS = 32)
    assert OLD_TOPK_SLOTS >= 16


def test_projection_onto_the_kl_ball():
    # pi = [0.9, 0.1], pi_old uniform: KL(pi || pi_old) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.368064 > eps = 0.05.
    # pi~ ~ pi^s (s = 1/(1+eta)) with ln 2 - H(pi~) = 0.05 -> pi~_0 = 0.656782, s = ln(0.656782/0.343218)/ln 9
    # = 0.295366 -> eta = 1/s - 1 = 2.385635
    a, b = LOG(torch.tensor([[0.9, 0.1]], dtype=torch.float64)), LOG(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    log_q, eta = project(a, b, 0.05)
    assert log_q[0, 0].exp().item() == pytest.approx(0.656782, abs=1e-6)
    assert eta.item() == pytest.approx(2.385635, abs=1e-5)
    kl = (log_q.exp() * (log_q - b)).sum().item()
    assert kl == pytest.approx(0.05, abs=1e-9)


def test_projection_inside_the_bound_is_the_identity():
    # pi = [0.55, 0.45] vs uniform: KL = 0.55 ln 1.1 + 0.45 ln 0.9 = 0.005008 <= 0.05 -> eta = 0, pi~ = pi
    a, b = LOG(torch.tensor([[0.55, 0.45]])), LOG(torch.tensor([[0.5, 0.5]]))
    log_q, eta = project(a, b, 0.05)
    assert eta.item() == 0.0
    assert_close(log_q, a)


def test_projection_gradient_is_the_implicit_one():
    # finite differences of the exact projection (re-solved at every perturbed point) against autograd
    b = torch.log_softmax(torch.tensor([[0.3, -0.2, 0.1, -1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64), -1)
    x = torch.tensor([[2.0, -1.0, 0.5, -2.0], [1.5, 0.2, -0.7, 0.1]], dtype=torch.float64, requires_grad=True)

    def f(logits: torch.Tensor) -> torch.Tensor:
        return project(torch.log_softmax(logits, -1), b, 0.05)[0]

    assert (project(torch.log_softmax(x, -1), b, 0.05)[1] > 0).all()  # both rows are projected
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6)


def test_troll_loss_values():
    # one sequence, two tokens, V = 3. Token 0: pi = pi_old -> ratio 1, no projection: L = -A = -1.
    # Token 1: on S = {0, 1} (token 2 outside the support, top_k = 2): pi = [0.9, 0.1], pi_old = [0.5, 0.5]
    # (renormalised over S) -> pi~_0 = 0.656782, ratio = 0.656782 / 0.5 = 1.313563,
    # KL(pi || pi~) = 0.9 ln(0.9/0.656782) + 0.1 ln(0.1/0.343218) = 0.160219; A = -2:
    # L = 2 * 1.313563 + 1.0 * 0.160219 = 2.787345
    vocab = LOG(torch.tensor([[[0.2, 0.3, 0.5], [0.72, 0.08, 0.2]]]))
    old_idx = torch.zeros(1, 2, OLD_TOPK_SLOTS, dtype=torch.long)
    old_val = torch.zeros(1, 2, OLD_TOPK_SLOTS)
    old_idx[0, 0, :2], old_val[0, 0, :2] = torch.tensor([1, 2]), LOG(torch.tensor([0.3, 0.5]))
    old_idx[0, 1, :2], old_val[0, 1, :2] = torch.tensor([0, 1]), LOG(torch.tensor([0.25, 0.25]))
    loss, metrics = call(POLICY_LOSSES, troll_loss, {"top_k": 2, "kl_bound": 0.05}, logp_vocab=vocab,
                         old_topk_logp=old_val, old_topk_index=old_idx, advantages=torch.tensor([[1.0, -2.0]]),
                         mask=torch.ones(1, 2))
    assert loss[0, 0].item() == pytest.approx(-1.0, abs=1e-6)
    assert loss[0, 1].item() == pytest.approx(2 * 1.313563 + 0.160219, abs=1e-5)
    assert metrics["troll/projected_frac"].tolist() == [[0.0, 1.0]]
    assert metrics["troll/kl_old"][0, 1].item() == pytest.approx(0.9 * math.log(1.8) + 0.1 * math.log(0.2), abs=1e-6)


def test_troll_off_the_mask_is_zero_and_finite():
    vocab = torch.zeros(1, 2, 3, requires_grad=True)  # rows of zeros off the mask, as the learner gives them
    loss, _ = call(POLICY_LOSSES, troll_loss, {"top_k": 2}, logp_vocab=vocab,
                   old_topk_logp=torch.zeros(1, 2, OLD_TOPK_SLOTS), old_topk_index=torch.zeros(1, 2, OLD_TOPK_SLOTS,
                   dtype=torch.long), advantages=torch.tensor([[1.0, 1.0]]), mask=torch.tensor([[0.0, 0.0]]))
    loss.sum().backward()
    assert torch.equal(loss, torch.zeros(1, 2)) and torch.isfinite(vocab.grad).all()


@pytest.mark.slow
def test_the_learner_records_pi_olds_support_and_trains(tmp_path):
    # one batch of the demo task through the learner: pi_old's pass records the support (the taken token in
    # slot 0, its log-prob the old log-prob of the taken token), then two updates with the projection
    from test_learner_parts import _rollout_batch

    from reinforge.config import load_config
    from reinforge.learn.learner import Learner
    from reinforge.models.loading import load_model
    from reinforge.orchestrate.components import build_components

    overrides = [f"output_dir={tmp_path}", "rollout.prompts_per_step=2", "rollout.group_size=2",
                 "task.heldout_size=4", "algo.skip_equal_reward_groups=false"]
    cfg = load_config(None, [*overrides, "algo.policy_loss=troll", "train.minibatches=2"])
    _, batch = _rollout_batch(build_components(load_config(None, overrides)))
    learner = Learner.for_run(load_model(cfg.model.path, cfg.model.dtype, cfg.model.device), cfg)
    learner.prepare(batch)
    trained = batch.loss_mask > 0
    assert batch.old_topk_index is not None and batch.old_topk_index.shape[-1] == OLD_TOPK_SLOTS
    assert torch.equal(batch.old_topk_index[..., 0][trained], batch.input_ids[trained])
    assert torch.allclose(batch.old_topk_logp[..., 0][trained], batch.old_logprobs[trained], atol=1e-5)
    learner.estimate_advantages(batch)
    metrics = learner.update(batch)
    assert metrics["updates"] == 2 and math.isfinite(metrics["loss"])


def test_troll_slots_no_token_fills_are_out_of_the_support():
    # V = 2 < top_k = 4: slots 2, 3 hold PAD_LOGP (as pi_old's pass leaves them) and index 0; the support is
    # {1, 0}: pi = pi_old = [0.25, 0.75] on it -> ratio 1, no projection, L = -A = -1 (token 0's mass not doubled)
    from reinforge.algo.troll import PAD_LOGP

    vocab = LOG(torch.tensor([[[0.75, 0.25]]])).requires_grad_(True)
    old_idx = torch.zeros(1, 1, OLD_TOPK_SLOTS, dtype=torch.long)
    old_val = torch.full((1, 1, OLD_TOPK_SLOTS), PAD_LOGP)
    old_idx[0, 0, :2], old_val[0, 0, :2] = torch.tensor([1, 0]), LOG(torch.tensor([0.25, 0.75]))
    loss, metrics = call(POLICY_LOSSES, troll_loss, {"top_k": 4}, logp_vocab=vocab, old_topk_logp=old_val,
                         old_topk_index=old_idx, advantages=torch.tensor([[1.0]]), mask=torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.0, abs=1e-6) and metrics["troll/kl_old"].item() == pytest.approx(0.0)
    loss.sum().backward()
    # d/d log pi(v) of -pi_S(1)/pi_old(1) on S = {1, 0}: -(1/0.25) * 0.25 * ([v = 1] - pi_S(v)):
    # token 0: -(0 - 0.75) = 0.75, token 1: -(1 - 0.25) = -0.75 (the projection loss has no gradient at pi~ = pi)
    assert_close(vocab.grad, torch.tensor([[[0.75, -0.75]]]), atol=1e-6, rtol=0)
