"""The KL family: forward-KL estimators (k1_fwd, k3_fwd), APO's DADS weight (kl_dads) and STCR advantage
(grpo_stcr), RAPO's forward KL to a reward-reweighted reference (rapo_kl). Hand values, the exact
forward KL of a small categorical distribution (enumeration and Monte Carlo), gradients, options."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.advantage_estimators import ADVANTAGES, grpo_advantage
from reinforge.algo.aggregation import LOSS_AGG, AggNorm
from reinforge.algo.kl import KL_ESTIMATORS
from reinforge.algo.kl_adaptive import (
    DadsSettings,
    RapoSettings,
    StcrSettings,
    dads_weight,
    grpo_stcr_advantage,
    kl_dads_term,
    rapo_kl_term,
)
from reinforge.algo.objective import LOSS_TERMS, required_inputs
from reinforge.config import config_from_dict, load_config
from reinforge.errors import ConfigError
from reinforge.parts import all_kinds

all_kinds()
D = torch.float64
LN = math.log


def _grad(fn, logp: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp = logp.clone().requires_grad_(True)
    out = fn(logp, ref)
    out.sum().backward()
    return out.detach(), logp.grad


# --- forward-KL estimators ------------------------------------------------------------------------

def test_forward_estimators_hand_values_and_gradients():
    # token 1: pi = 0.5, pi_ref = 0.25 -> rho = 0.5; token 2: pi = 0.2, pi_ref = 0.6 -> rho = 3; token 3: rho = 1
    logp = torch.tensor([[LN(0.5), LN(0.2), LN(0.3)]], dtype=D)
    ref = torch.tensor([[LN(0.25), LN(0.6), LN(0.3)]], dtype=D)
    k1, g1 = _grad(KL_ESTIMATORS.get("k1_fwd"), logp, ref)
    # k1_fwd = rho log rho: 0.5 ln 0.5 = -0.346574, 3 ln 3 = 3.295837, 0; gradient -rho: -0.5, -3, -1
    assert torch.allclose(k1, torch.tensor([[-0.346574, 3.295837, 0.0]], dtype=D), atol=1e-6)
    assert torch.allclose(g1, torch.tensor([[-0.5, -3.0, -1.0]], dtype=D))
    k3, g3 = _grad(KL_ESTIMATORS.get("k3_fwd"), logp, ref)
    # k3_fwd = rho log rho - (rho - 1): 0.153426, 1.295837, 0; gradient 1 - rho: 0.5, -2, 0
    assert torch.allclose(k3, torch.tensor([[0.153426, 1.295837, 0.0]], dtype=D), atol=1e-6)
    assert torch.allclose(g3, torch.tensor([[0.5, -2.0, 0.0]], dtype=D))
    # the gradient pushes log pi up where pi < pi_ref (rho > 1) and down where pi > pi_ref, as k3's does
    _, g_rev = _grad(KL_ESTIMATORS.get("k3"), logp, ref)
    assert torch.allclose(g_rev, g3)


def _categorical():
    theta = torch.tensor([0.3, -1.2, 0.8, 0.0, -0.4], dtype=D, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([-0.5, 0.4, 0.2, 1.1, -2.0], dtype=D), 0)
    return theta, ref


@pytest.mark.parametrize("name", ["k1_fwd", "k3_fwd"])
def test_forward_estimators_equal_the_exact_forward_kl_and_its_gradient_by_enumeration(name):
    theta, ref = _categorical()
    logp = torch.log_softmax(theta, 0)
    exact = (ref.exp() * (ref - logp)).sum()  # KL(pi_ref || pi), summed over the 5 outcomes
    (exact_grad,) = torch.autograd.grad(exact, theta, retain_graph=True)
    est = KL_ESTIMATORS.get(name)(logp, ref)
    expected = (logp.exp().detach() * est).sum()  # E_{x~pi}[estimator], pi held fixed as the sampler
    (expected_grad,) = torch.autograd.grad(expected, theta)
    assert abs(expected.item() - exact.item()) < 1e-12
    assert torch.allclose(expected_grad, exact_grad, atol=1e-12)


def test_differentiating_the_sample_value_alone_would_be_biased():
    """Why the estimators are straight-through: autograd of rho log rho - rho + 1 misses the score term."""
    theta, ref = _categorical()
    logp = torch.log_softmax(theta, 0)
    exact = (ref.exp() * (ref - logp)).sum()
    (exact_grad,) = torch.autograd.grad(exact, theta, retain_graph=True)
    rho = torch.exp(ref - logp)
    naive = (logp.exp().detach() * (rho * torch.log(rho) - rho + 1)).sum()
    (naive_grad,) = torch.autograd.grad(naive, theta)
    assert (naive_grad - exact_grad).abs().max() > 0.05


def test_k3_fwd_monte_carlo_matches_the_exact_forward_kl():
    theta, ref = _categorical()
    logp_all = torch.log_softmax(theta, 0)
    exact = (ref.exp() * (ref - logp_all)).sum()
    (exact_grad,) = torch.autograd.grad(exact, theta, retain_graph=True)
    x = torch.multinomial(logp_all.exp().detach(), 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    est = KL_ESTIMATORS.get("k3_fwd")(logp_all[x], ref[x])
    stderr = est.detach().std() / math.sqrt(len(x))
    assert abs(est.mean().item() - exact.item()) < 4 * stderr.item()  # exact = 0.8226
    assert (est.detach() >= 0).all()  # every sample is non-negative
    (mc_grad,) = torch.autograd.grad(est.mean(), theta)
    assert torch.allclose(mc_grad, exact_grad, atol=0.02)


def test_k3_fwd_is_a_kl_estimator_of_the_config():
    assert load_config(None, ["algo.kl.estimator=k3_fwd", "algo.kl.coef=0.1"]).algo.kl.estimator == "k3_fwd"
    with pytest.raises(ConfigError, match="k3_fwd"):  # the allowed names are listed
        load_config(None, ["algo.kl.estimator=k4"])


# --- APO: DADS ------------------------------------------------------------------------------------

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0], dtype=D)
GROUPS = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)


def test_dads_weight_hand_values():
    w = dads_weight(REWARDS, GROUPS, DadsSettings())
    # group 0: 1 correct of 4, d = 0.75: f = 1 - exp(-e * 0.25) = 0.493165; wrong samples 1
    # group 1: all correct, d = 0: 1 (the code's f(0) = 1); group 2: d = 0.25: f = 1 - exp(-e * 0.75) = 0.869804
    expected = [0.493165, 1, 1, 1, 1, 1, 1, 1, 0.869804, 0.869804, 0.869804, 1]
    assert torch.allclose(w, torch.tensor(expected, dtype=D), atol=1e-6)
    # the threshold decides what is correct: at 2.0 nothing is, every weight is 1
    assert (dads_weight(REWARDS, GROUPS, DadsSettings(correct_threshold=2.0)) == 1).all()
    # a row outside any group (id -1) keeps weight 1
    assert dads_weight(torch.tensor([1.0, 1.0, 0.0], dtype=D), torch.tensor([-1, 0, 0]), DadsSettings())[0] == 1


def test_kl_dads_values_gradient_and_aggregation():
    # 4 rows of one group, 1 correct (d = 0.75, w = 0.493165); 2 tokens each, the last row's 2nd masked
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=D)
    logp = torch.full((4, 2), LN(0.5), dtype=D, requires_grad=True)
    ref = torch.full((4, 2), LN(0.25), dtype=D)  # r = 0.5: k3 = 0.5 - 1 - ln 0.5 = 0.193147, d k3/d log pi = 0.5
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]], dtype=D)
    values, metrics = kl_dads_term(logp, ref, rewards, torch.zeros(4, dtype=torch.long), DadsSettings())
    assert torch.allclose(values[0], torch.full((2,), 0.493165 * 0.193147, dtype=D), atol=1e-6)
    assert torch.allclose(values[1:], torch.full((3, 2), 0.193147, dtype=D), atol=1e-6)
    assert torch.allclose(metrics["kl_ref"], torch.full((4, 2), 0.193147, dtype=D), atol=1e-6)
    assert torch.allclose(metrics["kl_weight"][:, 0], torch.tensor([0.493165, 1, 1, 1], dtype=D), atol=1e-6)
    loss = LOSS_AGG.get("token_mean")(values, mask, AggNorm(num_tokens=7.0, num_seqs=4.0))
    loss.backward()
    # token mean over 7 tokens: d/d log pi = w * 0.5 / 7 on trained tokens, 0 on the masked one
    g = logp.grad
    assert torch.allclose(g[0], torch.full((2,), 0.493165 * 0.5 / 7, dtype=D), atol=1e-7)
    assert torch.allclose(g[1], torch.full((2,), 0.5 / 7, dtype=D))
    assert g[3, 1] == 0


def test_kl_dads_declares_the_reference_and_whole_groups_and_validates_its_options():
    assert LOSS_TERMS.needs("kl_dads") == {"ref_logp", "whole_groups"}
    a = config_from_dict({"preset": "apo"}).algo
    assert {"ref_logp", "whole_groups"} <= required_inputs(a)
    assert a.loss_terms[0].settings().estimator == "k3"
    with pytest.raises(ConfigError, match="algo.loss_terms.0.estimator: unknown KL estimator 'k9'"):
        load_config(None, ["algo.loss_terms=[{name: kl_dads, coef: 0.1, estimator: k9}]"])
    with pytest.raises(ConfigError, match="algo.loss_terms.0.sharpness: Input should be greater than 0"):
        load_config(None, ["algo.loss_terms=[{name: kl_dads, sharpness: 0}]"])


# --- APO: STCR ------------------------------------------------------------------------------------

def test_grpo_stcr_hand_values():
    # group 0: rewards 1, 1, 0, 0 with 2, 4, 6, 2 tokens: the correct ones' mean length is 3;
    # GRPO: mean 0.5, unbiased std sqrt(1/3): A = +-0.866025; the wrong row of 6 tokens exceeds it by 3:
    # v = 2 - exp(-0.1 * 3) = 1.259182, A = -1.090483; the wrong row of 2 tokens is shorter: v = 1.
    # group 1: all wrong (no correct length to compare with): GRPO's 0, whatever the lengths.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=D)
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    lengths = torch.tensor([2, 4, 6, 2, 1, 6])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).to(D)
    cfg = StcrSettings(stcr_rate=0.1)
    adv = grpo_stcr_advantage(rewards, groups, mask, cfg)
    a = 0.866025
    per_row = torch.tensor([a, a, -1.090483, -a, 0.0, 0.0], dtype=D)
    assert torch.allclose(adv, per_row[:, None] * mask, atol=1e-5)
    # kappa = 0 is GRPO exactly
    assert torch.equal(grpo_stcr_advantage(rewards, groups, mask, StcrSettings(stcr_rate=0.0)),
                       grpo_advantage(rewards, groups, mask, StcrSettings()))
    with pytest.raises(ConfigError, match="algo.advantage.stcr_rate: Input should be greater than or equal to 0"):
        load_config(None, ["algo.advantage={name: grpo_stcr, stcr_rate: -1}"])
    assert "grpo_stcr" in ADVANTAGES


# --- RAPO -----------------------------------------------------------------------------------------

def test_rapo_kl_hand_values_and_gradient():
    # pi = 0.5, pi_ref = 0.25 on every token. r = 1: phi = 1, rho = 0.5: k3_fwd = 0.153426, gradient 0.5.
    # r = 0: phi = phi_min = 0.5: log rho = 0.5 ln 0.25 - ln 0.5 = 0, rho = 1: value 0, gradient 0 (pi = sqrt(pi_ref)).
    # r = 0.5: phi = 0.75: log rho = 0.75 ln 0.25 - ln 0.5 = -0.346574, rho = 0.707107:
    #   value 0.707107 * -0.346574 + 0.292893 = 0.047829, gradient 1 - 0.707107 = 0.292893.
    logp = torch.full((3, 2), LN(0.5), dtype=D, requires_grad=True)
    ref = torch.full((3, 2), LN(0.25), dtype=D)
    values, metrics = rapo_kl_term(logp, ref, torch.tensor([1.0, 0.0, 0.5], dtype=D), RapoSettings())
    assert torch.allclose(values[:, 0], torch.tensor([0.153426, 0.0, 0.047829], dtype=D), atol=1e-6)
    assert torch.allclose(metrics["rapo_phi"][:, 0], torch.tensor([1.0, 0.5, 0.75], dtype=D))
    values.sum().backward()
    assert torch.allclose(logp.grad[:, 1], torch.tensor([0.5, 0.0, 0.292893], dtype=D), atol=1e-6)


def test_rapo_kl_pulls_toward_the_normalised_reweighted_reference():
    """Expected gradient (enumeration) = Z * grad KL(pi_ref^phi / Z || pi): the exact direction, scaled by Z."""
    theta, ref = _categorical()
    logp = torch.log_softmax(theta, 0)
    phi = 0.5
    target = torch.log_softmax(phi * ref, 0)  # log(pi_ref^phi / Z)
    z = torch.exp(phi * ref).sum()
    exact = (target.exp() * (target - logp)).sum()
    (exact_grad,) = torch.autograd.grad(exact, theta, retain_graph=True)
    values, _ = rapo_kl_term(logp[None], ref[None], torch.tensor([0.0], dtype=D), RapoSettings(phi_min=phi))
    (grad,) = torch.autograd.grad((logp.exp().detach() * values[0]).sum(), theta)
    assert z > 1
    assert torch.allclose(grad, z * exact_grad, atol=1e-12)


def test_rapo_options_and_preset():
    with pytest.raises(ConfigError, match="algo.loss_terms.0.phi_min: Input should be less than or equal to 1"):
        load_config(None, ["algo.loss_terms=[{name: rapo_kl, phi_min: 1.5}]"])
    a = config_from_dict({"preset": "rapo"}).algo
    assert a.kl.coef == 0 and "ref_logp" in required_inputs(a)  # the reference without the reverse KL
    assert [(t.name, t.coef) for t in a.loss_terms] == [("rapo_kl", 0.04)] and a.entropy_coef == 0.001


# --- in a run -------------------------------------------------------------------------------------

SHORT = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=8",
         "eval.final_samples=0", "eval.every=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0"]


@pytest.mark.slow
def test_apo_run_keeps_groups_whole_in_micro_batches_and_rapo_runs(tmp_path, monkeypatch):
    """APO's accuracy is over whole groups even when the batch is split into mini- and micro-batches."""
    import dataclasses

    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    entry, calls = LOSS_TERMS.entry("kl_dads"), []

    def spy(**kwargs):
        calls.append(kwargs["group_index"].clone())
        return entry.fn(**kwargs)

    monkeypatch.setitem(LOSS_TERMS._entries, "kl_dads", dataclasses.replace(entry, fn=spy))
    cfg = load_config(None, [f"output_dir={tmp_path / 'apo'}", "preset=apo", *SHORT, "train.minibatches=2",
                             "train.micro_batch_tokens=64", "train.shared_prefix=false"])
    result = train(cfg)
    assert len(calls) > 4  # several micro-batches per mini-batch, 2 mini-batches, 2 steps
    for groups in calls:  # every group seen whole: all 4 of its samples
        assert (torch.bincount(groups)[groups.unique()] == 4).all()
    steps = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "train/kl_weight" in m]
    assert len(steps) == 2 and all(0 < m["train/kl_weight"] <= 1 and m["train/kl_ref"] >= 0 for m in steps)
    cfg = load_config(None, [f"output_dir={tmp_path / 'rapo'}", "preset=rapo", *SHORT])
    steps = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "train/rapo_phi" in m]
    assert len(steps) == 2 and all(0.5 <= m["train/rapo_phi"] <= 1 and m["train/kl_fwd"] >= 0 for m in steps)


def test_kl_measure_logs_the_kl_from_the_start_and_changes_nothing(tmp_path):
    """algo.kl.measure with coef 0: train/kl_ref is logged (positive once the policy moves), and the
    policy's weights after training are those of the same run without it (nothing penalised)."""
    from safetensors.torch import load_file

    from reinforge.algo.objective import loss_terms, required_inputs
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    measured = load_config(None, ["algo.kl.measure=true"]).algo
    assert "ref_logp" in required_inputs(measured) and [t.coef for t in loss_terms(measured) if t.name == "kl"] == [0.0]
    weights, logs = {}, {}
    for name, extra in (("plain", []), ("measured", ["algo.kl.measure=true"])):
        cfg = load_config(None, [f"output_dir={tmp_path}", f"name={name}", *SHORT, "checkpoint.every=2", *extra])
        run_dir = train(cfg).run_dir
        weights[name] = load_file(str(run_dir / "checkpoints" / "step_2" / "model.safetensors"))
        logs[name] = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in m]
    assert all("train/kl_ref" not in m for m in logs["plain"])
    kls = [m["train/kl_ref"] for m in logs["measured"]]
    assert len(kls) == 2 and kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 0
    for key, value in weights["plain"].items():
        assert torch.equal(value, weights["measured"][key]), key
