"""V-trace (IMPALA, arXiv:1802.01561): hand-computed targets and advantages, the on-policy case against
GAE(lambda=1), truncation by rho_bar / c_bar, episode ends, the registered estimator and its settings."""

import math

import pytest
import torch
from part_calls import advantage
from torch.testing import assert_close

from reinforge.algo import ADVANTAGES, gae_advantages_and_returns
from reinforge.algo.returns import episode_rows
from reinforge.algo.vtrace import vtrace_returns
from reinforge.errors import ConfigError
from reinforge.parts import all_kinds

all_kinds()

D = torch.float64
R = torch.tensor([[1.0, 0.0, 2.0]], dtype=D)
V = torch.tensor([[0.5, 1.0, 1.5]], dtype=D)
ONES = torch.ones(1, 3, dtype=D)
LOG_RHOS = torch.log(torch.tensor([[2.0, 0.5, 1.0]], dtype=D))


def test_vtrace_hand_values():
    # gamma 0.9, rho_bar = c_bar = 1, ratios pi/mu = [2, 0.5, 1] -> rho = c = [1, 0.5, 1]; the row ends
    # after s = 2 (terminal: V_3 = 0, v_3 - V_3 = 0).
    # s=2: delta = 1 * (2 + 0 - 1.5) = 0.5;              v_2 = 1.5 + 0.5 = 2.0
    # s=1: delta = 0.5 * (0 + 0.9*1.5 - 1.0) = 0.175;    v_1 = 1.0 + 0.175 + 0.9*0.5*(2.0 - 1.5) = 1.4
    # s=0: delta = 1 * (1 + 0.9*1.0 - 0.5) = 1.4;        v_0 = 0.5 + 1.4 + 0.9*1*(1.4 - 1.0) = 2.26
    # A_s = rho_s (r_s + gamma v_{s+1} - V_s): A_0 = 1 + 0.9*1.4 - 0.5 = 1.76, A_1 = 0.5 (0.9*2 - 1) = 0.4,
    # A_2 = 2 - 1.5 = 0.5
    vs, adv = vtrace_returns(R, V, LOG_RHOS, ONES, 0.9)
    assert_close(vs, torch.tensor([[2.26, 1.4, 2.0]], dtype=D))
    assert_close(adv, torch.tensor([[1.76, 0.4, 0.5]], dtype=D))


def test_vtrace_truncation_levels_hand_values():
    # rho_bar = c_bar = 3 (no truncation of the ratio 2): rho = c = [2, 0.5, 1]
    # s=2 as before: v_2 = 2.0;  s=1 as before: v_1 = 1.4 (its ratio 0.5 is below any bar)
    # s=0: delta = 2 * 1.4 = 2.8; v_0 = 0.5 + 2.8 + 0.9*2*(1.4 - 1.0) = 4.02; A_0 = 2 * (1 + 1.26 - 0.5) = 3.52
    vs, adv = vtrace_returns(R, V, LOG_RHOS, ONES, 0.9, rho_bar=3.0, c_bar=3.0)
    assert_close(vs, torch.tensor([[4.02, 1.4, 2.0]], dtype=D))
    assert_close(adv, torch.tensor([[3.52, 0.4, 0.5]], dtype=D))
    # rho_bar 3 but c_bar 1: delta_0 = 2.8, c_0 = 1 -> v_0 = 0.5 + 2.8 + 0.9*(0.4) = 3.66
    vs, _ = vtrace_returns(R, V, LOG_RHOS, ONES, 0.9, rho_bar=3.0, c_bar=1.0)
    assert vs[0, 0].item() == pytest.approx(3.66)


@pytest.mark.parametrize("bar", [1.0, 2.5])
def test_vtrace_on_policy_is_gae_lambda_one(bar):
    """All ratios 1, no clipping: v_s is the TD(1) return (GAE(1)'s return), A_s GAE(1)'s advantage."""
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(4, 7, generator=g, dtype=D), torch.randn(4, 7, generator=g, dtype=D)
    mask = (torch.rand(4, 7, generator=g) > 0.3).to(D)  # non-contiguous rows: skipped positions
    vs, adv = vtrace_returns(r, v, torch.zeros_like(r), mask, 0.97, rho_bar=bar, c_bar=bar)
    gae_adv, gae_ret = gae_advantages_and_returns(r, v, mask, 0.97, 1.0)
    assert_close(vs, gae_ret)
    assert_close(adv, gae_adv)
    # and with lam < 1 in V-trace's traces (c_s = lam), v_s is GAE(lam)'s return
    vs, _ = vtrace_returns(r, v, torch.zeros_like(r), mask, 0.97, lam=0.9)
    assert_close(vs, gae_advantages_and_returns(r, v, mask, 0.97, 0.9)[1])


def test_vtrace_with_episode_ends_in_time_major_data():
    # one environment, 4 steps, an episode ending after step 1; gamma 0.5, on-policy.
    # episode 1 (steps 0, 1; terminal): v_1 = r_1 = 1, v_0 = r_0 + 0.5 v_1 = 2 + 0.5 = 2.5
    # episode 2 (steps 2, 3; cut by the rollout end, gamma V(x_4) = 0.5 * 4 = 2 folded into r_3):
    # v_3 = 3 + 2 = 5, v_2 = 0 + 0.5 * 5 = 2.5
    rewards = torch.tensor([[2.0, 1.0, 0.0, 3.0 + 0.5 * 4.0]], dtype=D)
    values = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=D)
    ends = torch.tensor([[False, True, False, True]])
    row, col, n, width = episode_rows(ends)
    assert (n, width) == (2, 2) and row.tolist() == [[0, 0, 1, 1]] and col.tolist() == [[0, 1, 0, 1]]
    lay = torch.zeros(n, width, dtype=D)
    r_rows, v_rows, m_rows = lay.clone(), lay.clone(), lay.clone()
    r_rows[row, col], v_rows[row, col], m_rows[row, col] = rewards, values, 1.0
    vs, _ = vtrace_returns(r_rows, v_rows, torch.zeros_like(r_rows), m_rows, 0.5)
    assert_close(vs[row, col], torch.tensor([[2.5, 1.0, 2.5, 5.0]], dtype=D))


def test_episode_rows_several_environments():
    ends = torch.tensor([[True, False, True], [False, False, True], [True, True, True]])
    row, col, n, width = episode_rows(ends)
    # env 0: [0] [1 2] -> rows 0, 1; env 1: [0 1 2] -> row 2; env 2: three rows of one step: 3, 4, 5
    assert row.tolist() == [[0, 1, 1], [2, 2, 2], [3, 4, 5]]
    assert col.tolist() == [[0, 0, 1], [0, 1, 2], [0, 0, 0]]
    assert (n, width) == (6, 3)


def test_registered_vtrace_estimator_reads_the_context():
    # an LLM batch of one sequence, prompt token then three generated tokens; outcome reward 2 on the last;
    # token rewards [1, 0, 0]: per-token rewards [1, 0, 2] as R above. target pi_old, behaviour mu (sampling):
    # ratios [2, 0.5, 1] -> the hand values of test_vtrace_hand_values (gamma 0.9)
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=D)
    values = torch.tensor([[9.0, 0.5, 1.0, 1.5]], dtype=D)
    old = torch.tensor([[0.0, math.log(0.8), math.log(0.2), math.log(0.5)]], dtype=D)
    sampling = torch.tensor([[0.0, math.log(0.4), math.log(0.4), math.log(0.5)]], dtype=D)
    token_rewards = torch.tensor([[5.0, 1.0, 0.0, 0.0]], dtype=D)
    adv = advantage("vtrace", torch.tensor([2.0], dtype=D), torch.zeros(1, dtype=torch.long), mask, values,
                    {"gamma": 0.9}, old_logp=old, sampling_logp=sampling, token_rewards=token_rewards)
    assert_close(adv, torch.tensor([[0.0, 1.76, 0.4, 0.5]], dtype=D))
    assert ADVANTAGES.needs("vtrace") == {"values", "old_logp", "sampling_logp"}
    # no gradient flows into the critic or the policy through the advantages
    grad_values, grad_old = values.clone().requires_grad_(), old.clone().requires_grad_()
    adv = advantage("vtrace", torch.tensor([2.0], dtype=D), torch.zeros(1, dtype=torch.long), mask, grad_values,
                    {"gamma": 0.9}, old_logp=grad_old, sampling_logp=sampling, token_rewards=token_rewards)
    assert not adv.requires_grad
    # without the behaviour policy's log-probs mu = pi: on-policy, GAE(1)'s advantages
    on = advantage("vtrace", torch.tensor([2.0], dtype=D), torch.zeros(1, dtype=torch.long), mask, values,
                   {"gamma": 0.9}, old_logp=old, token_rewards=token_rewards)
    r_tok = torch.tensor([[0.0, 1.0, 0.0, 2.0]], dtype=D)
    assert_close(on, gae_advantages_and_returns(r_tok, values, mask, 0.9, 1.0)[0])
    with pytest.raises(ValueError, match="needs values"):
        advantage("vtrace", torch.tensor([2.0], dtype=D), torch.zeros(1, dtype=torch.long), mask, None, {})


@pytest.mark.parametrize(("option", "value"), [("rho_bar", 0.0), ("c_bar", -1.0), ("lam", 1.5), ("gamma", 2.0)])
def test_vtrace_settings_are_validated(option, value):
    with pytest.raises(ConfigError, match=option):
        ADVANTAGES.entry("vtrace").make_settings({option: value}, "algo.advantage")


def test_a_recipe_names_vtrace_with_its_options():
    from reinforge.algo.objective import required_inputs
    from reinforge.config import config_from_dict

    cfg = config_from_dict({"algo": {"advantage": {"name": "vtrace", "rho_bar": 2.0}}})
    assert {"values", "old_logp", "sampling_logp"} <= required_inputs(cfg.algo)  # the loop builds a critic
    assert cfg.algo.advantage == "vtrace" and cfg.algo.advantage.settings.rho_bar == 2.0
    with pytest.raises(ConfigError, match="algo.advantage.c_bar"):
        config_from_dict({"algo": {"advantage": {"name": "vtrace", "c_bar": 0}}})


@pytest.mark.slow
def test_vtrace_trains_in_the_llm_loop(tmp_path, monkeypatch):
    """The loop provides what vtrace declares: a critic's values, pi_old's log-probs and the engine's."""
    import reinforge.algo.vtrace as vtrace_module
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    seen = []
    real = vtrace_module.vtrace_returns

    def spy(rewards, values, log_rhos, mask, *args, **kwargs):
        seen.append(float(log_rhos[mask != 0].abs().max()))
        return real(rewards, values, log_rhos, mask, *args, **kwargs)

    monkeypatch.setattr(vtrace_module, "vtrace_returns", spy)
    short = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=8",
             "eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0", "eval.every=0"]
    result = train(load_config(None, [f"output_dir={tmp_path}", *short, "algo.advantage=vtrace",
                                      "algo.policy_loss=reinforce"]))
    records = result.metrics()
    assert len(seen) == 2 and all(math.isfinite(x) for x in seen)
    trained = [r for r in records if "train/pg_loss" in r]
    assert len(trained) == 2 and all(math.isfinite(r["train/pg_loss"]) for r in trained)
    assert all("train/critic/value_loss" in r for r in trained)  # the critic vtrace declared was built
