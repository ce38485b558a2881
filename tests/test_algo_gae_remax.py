"""returns_to_go, token rewards in the advantage estimators, REINFORCE++ token form, ReMax and GAE."""

import math

import pytest
import torch
from part_calls import advantage
from torch.testing import assert_close

from reinforge.algo import ADVANTAGES, gae_advantages_and_returns, outcome_token_rewards, returns_to_go
from reinforge.algo.advantage_estimators import (
    gae_advantage,
    grpo_advantage,
    reinforce_pp_advantage,
    remax_advantage,
)
from reinforge.parts import all_kinds

all_kinds()  # every built-in estimator registered, whichever test modules ran before

OUTCOME = ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "opo", "remax"]

# ----------------------------------------------------------------------------- returns_to_go

# row 0: non-contiguous (multi-turn: position 1 is an environment token), its token reward 2 is ignored
# row 1: zero-length; row 2: prompt token, two generated tokens, padding
TR = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0], [5.0, 1.0, -2.0, 7.0]])
TR_MASK = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])


def test_returns_to_go_discounted_hand_values():
    # gamma 0.5, row 0 over masked tokens (1, 3, 4): G3 = 4, G2 = 3 + 0.5 * 4 = 5, G0 = 1 + 0.5 * 5 = 3.5
    # (the skipped position 1 does not discount); row 2: G2 = -2, G1 = 1 + 0.5 * -2 = 0
    out = returns_to_go(TR, TR_MASK, 0.5)
    expected = torch.tensor([[3.5, 0.0, 5.0, 4.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -2.0, 0.0]])
    assert_close(out, expected)
    assert out.dtype == TR.dtype


def test_returns_to_go_undiscounted_hand_values():
    # gamma 1 (cumulative-sum path): row 0: 4, 3 + 4 = 7, 1 + 7 = 8; row 2: -2, 1 - 2 = -1
    out = returns_to_go(TR, TR_MASK, 1.0)
    expected = torch.tensor([[8.0, 0.0, 7.0, 4.0], [0.0, 0.0, 0.0, 0.0], [0.0, -1.0, -2.0, 0.0]])
    assert_close(out, expected)


def test_returns_to_go_gamma_zero_is_the_reward_itself():
    out = returns_to_go(TR, TR_MASK, 0.0)
    assert_close(out, TR * TR_MASK)


def test_returns_to_go_loop_and_cumsum_paths_agree():
    g = torch.Generator().manual_seed(0)
    tr = torch.randn(5, 9, generator=g, dtype=torch.float64)
    mask = (torch.rand(5, 9, generator=g) > 0.4).to(torch.float64)
    close_to_one = returns_to_go(tr, mask, 1.0 - 1e-12)
    assert_close(returns_to_go(tr, mask, 1.0), close_to_one, atol=1e-9, rtol=0)


# ----------------------------------------------------------------------------- outcome estimators + token rewards


def test_grpo_with_token_rewards_hand_values():
    # rewards [1, 0] in one group, no std scaling: A = [0.5, -0.5]; gamma 0.5
    # row 0 mask [1, 0, 1, 1], tr [1, 2, 3, 4]: rtg [3.5, 0, 5, 4] -> [4.0, 0, 5.5, 4.5]
    # row 1 mask [1, 1, 0, 0], tr [-1, -1, 9, 9]: G1 = -1, G0 = -1 + 0.5 * -1 = -1.5 -> [-2.0, -2.0 + 0.5, 0, 0]
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    tr = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, -1.0, 9.0, 9.0]])
    cfg = dict(scale_by_std=False, gamma=0.5)
    adv = advantage(grpo_advantage, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, None, cfg, token_rewards=tr)
    assert_close(adv, torch.tensor([[4.0, 0.0, 5.5, 4.5], [-2.0, -1.5, 0.0, 0.0]]))
    assert adv.dtype == mask.dtype


# shared batch: groups [0, 0, 1, 1, 2]; row 2 is zero-length, row 4 a singleton group
REWARDS = torch.tensor([1.0, 0.0, 2.0, 3.0, 5.0])
GROUPS = torch.tensor([0, 0, 1, 1, 2])
MASK = torch.tensor(
    [
        [1.0, 1.0, 1.0],
        [0.0, 1.0, 1.0],
        [0.0, 0.0, 0.0],
        [1.0, 0.0, 1.0],
        [1.0, 1.0, 0.0],
    ]
)
TOKEN_R = torch.tensor(
    [
        [0.1, -0.2, 0.3],
        [9.0, 0.5, 0.5],
        [1.0, 1.0, 1.0],
        [-1.0, 9.0, 2.0],
        [0.25, 0.25, 9.0],
    ]
)
BASELINE = torch.tensor([0.5, 0.5, 1.0, 1.0, 4.0])


@pytest.mark.parametrize("name", OUTCOME)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_outcome_estimators_add_returns_to_go(name, gamma):
    fn = ADVANTAGES.get(name)
    cfg = ADVANTAGES.entry(name).make_settings({"gamma": gamma}, name)
    plain = advantage(fn, REWARDS, GROUPS, MASK, None, cfg, baseline=BASELINE)
    with_tr = advantage(fn, REWARDS, GROUPS, MASK, None, cfg, token_rewards=TOKEN_R, baseline=BASELINE)
    assert_close(with_tr - plain, returns_to_go(TOKEN_R, MASK, gamma), atol=1e-6, rtol=0)
    assert (with_tr[MASK == 0] == 0).all() and (with_tr[2] == 0).all()
    assert with_tr.dtype == MASK.dtype
    # zero token rewards change nothing (bit-identical)
    zero_tr = advantage(fn, REWARDS, GROUPS, MASK, None, cfg, token_rewards=torch.zeros_like(TOKEN_R), baseline=BASELINE)
    assert torch.equal(zero_tr, plain)


@pytest.mark.parametrize("name", sorted(ADVANTAGES.names()))
def test_every_estimator_accepts_the_keyword_arguments(name):
    """Every estimator, given every rollout field it may read (per-token log-probs and entropies for
    the ones that declare them, a prompt key per sequence), gives finite advantages, zero off the mask.
    A stateful estimator (its settings declare a ``controller``, e.g. SPO's tracker) gets it as ``cfg``,
    as the learner gives it."""
    values = torch.zeros_like(MASK)
    gen = torch.Generator().manual_seed(0)
    logps = {k: -torch.rand(MASK.shape, generator=gen) * MASK for k in ("old_logp", "ref_logp", "sampling_logp")}
    settings = ADVANTAGES.entry(name).make_settings({}, name)
    controller = getattr(type(settings), "controller", None)
    cfg = controller(settings) if controller is not None else None
    adv = advantage(name, REWARDS, GROUPS, MASK, values, cfg, token_rewards=TOKEN_R, baseline=BASELINE,
                    entropy=torch.rand(MASK.shape, generator=gen) * MASK, prompt_key=GROUPS.clone(), **logps)
    assert adv.shape == MASK.shape and adv.dtype == MASK.dtype
    assert torch.isfinite(adv).all() and (adv[MASK == 0] == 0).all()


@pytest.mark.parametrize("name", ["remax", "gae"])
def test_new_estimators_registered_with_paper_and_docstring(name):
    entry = {e.name: e for e in ADVANTAGES.entries()}[name]
    assert entry.formula.strip() and entry.fn.__doc__
    assert {"remax": "2310.10505", "gae": "1506.02438"}[name] in entry.paper


# ----------------------------------------------------------------------------- reinforce_pp token form

# gamma 1, eps 0.25. rewards [1, 2, 5]
# row 0 mask [1, 1, 0], tr [2, 0, 100]: reward 1 on position 1 -> token rewards [2, 1]: G = [3, 1]
# row 1 mask [1, 0, 1] (non-contiguous), tr [-2, 7, 1]: reward 2 on position 2 -> [-2, ., 3]: G = [1, ., 3]
# row 2 zero-length (its reward 5 is nowhere)
# G over masked tokens = 3, 1, 1, 3: mean 2, population std 1 -> (G - 2) / 1.25 = +-0.8
PP_REWARDS = torch.tensor([1.0, 2.0, 5.0])
PP_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
PP_TR = torch.tensor([[2.0, 0.0, 100.0], [-2.0, 7.0, 1.0], [3.0, 3.0, 3.0]])
PP_GROUPS = torch.tensor([0, 0, 1])


def test_reinforce_pp_token_form_hand_values():
    adv = advantage(
        reinforce_pp_advantage, PP_REWARDS, PP_GROUPS, PP_MASK, None, dict(adv_eps=0.25), token_rewards=PP_TR
    )
    assert_close(adv, torch.tensor([[0.8, -0.8, 0.0], [-0.8, 0.0, 0.8], [0.0, 0.0, 0.0]]), atol=1e-7, rtol=0)
    assert adv.dtype == PP_MASK.dtype


def test_reinforce_pp_token_form_discounted():
    # gamma 0.5: row 0 G1 = 1, G0 = 2 + 0.5 = 2.5; row 1 G2 = 3, G0 = -2 + 0.5 * 3 = -0.5
    # G = 2.5, 1, -0.5, 3: mean 1.5, deviations 1, -0.5, -2, 1.5, population var 7.5 / 4 = 1.875
    adv = advantage(
        reinforce_pp_advantage, PP_REWARDS, PP_GROUPS, PP_MASK, None, dict(adv_eps=1e-6, gamma=0.5), token_rewards=PP_TR
    )
    s = math.sqrt(1.875) + 1e-6
    expected = torch.tensor([[1.0 / s, -0.5 / s, 0.0], [-2.0 / s, 0.0, 1.5 / s], [0.0, 0.0, 0.0]])
    assert_close(adv, expected, atol=1e-6, rtol=0)


def test_reinforce_pp_token_form_empty_batch_is_zero():
    adv = advantage(
        reinforce_pp_advantage, PP_REWARDS, PP_GROUPS, torch.zeros(3, 3), None, None, token_rewards=PP_TR
    )
    assert torch.isfinite(adv).all() and torch.count_nonzero(adv).item() == 0


# ----------------------------------------------------------------------------- remax


def test_remax_hand_values_and_masking():
    # A = r - b = [1 - 0.5, 0 - 0.5, 0.5 - 0.5]; row 1 zero-length; groups are ignored
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    adv = advantage(
        remax_advantage, torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1]), mask, None, None,
        baseline=torch.tensor([0.5, 0.5, 0.5]),
    )
    assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # a group of one still has a baseline: r = 3, b = 1 -> 2
    one = advantage(
        remax_advantage, torch.tensor([3.0]), torch.tensor([0]), torch.ones(1, 2), None, None, baseline=torch.tensor([1.0])
    )
    assert_close(one, torch.tensor([[2.0, 2.0]]))


def test_remax_with_token_rewards():
    # A = 1 - 0.25 = 0.75; tr [0.5, -1] over mask [1, 1], gamma 1: rtg [-0.5, -1] -> [0.25, -0.25]
    adv = advantage(
        remax_advantage, torch.tensor([1.0]), torch.tensor([0]), torch.ones(1, 2), None, None,
        token_rewards=torch.tensor([[0.5, -1.0]]), baseline=torch.tensor([0.25]),
    )
    assert_close(adv, torch.tensor([[0.25, -0.25]]))


def test_remax_requires_baseline():
    with pytest.raises(ValueError, match="baseline"):
        advantage(remax_advantage, torch.tensor([1.0]), torch.tensor([0]), torch.ones(1, 2), None, None)
    with pytest.raises(ValueError, match="shape"):
        advantage(
            remax_advantage, torch.tensor([1.0]), torch.tensor([0]), torch.ones(1, 2), None, None, baseline=torch.ones(2)
        )


# ----------------------------------------------------------------------------- gae

GAE_R = torch.tensor([[0.0, 0.0, 1.0], [0.2, 5.0, 1.0], [1.0, 1.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
GAE_V = torch.tensor([[0.5, 0.6, 0.7], [0.5, 9.0, 0.7], [1.0, 1.0, 1.0], [0.0, 0.5, 0.0]], dtype=torch.float64)
GAE_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)


def test_gae_hand_values_gamma_09_lambda_08():
    # gamma lam = 0.72
    # row 0: t2: delta = 1 - 0.7 = 0.3, A = 0.3, R = 1.0
    #        t1: delta = 0.9 * 0.7 - 0.6 = 0.03, A = 0.03 + 0.72 * 0.3 = 0.246, R = 0.846
    #        t0: delta = 0.9 * 0.6 - 0.5 = 0.04, A = 0.04 + 0.72 * 0.246 = 0.21712, R = 0.71712
    # row 1 (position 1 skipped: its reward 5 and value 9 are ignored, no discount across it):
    #        t2: A = 0.3, R = 1.0; t0: delta = 0.2 + 0.9 * 0.7 - 0.5 = 0.33, A = 0.33 + 0.72 * 0.3 = 0.546
    # row 2: zero-length -> zeros; row 3: single token: delta = 2 - 0.5 = 1.5 = A, R = 2
    adv, ret = gae_advantages_and_returns(GAE_R, GAE_V, GAE_MASK, 0.9, 0.8)
    assert_close(
        adv,
        torch.tensor([[0.21712, 0.246, 0.3], [0.546, 0.0, 0.3], [0.0, 0.0, 0.0], [0.0, 1.5, 0.0]], dtype=torch.float64),
        atol=1e-12, rtol=0,
    )
    assert_close(
        ret,
        torch.tensor([[0.71712, 0.846, 1.0], [1.046, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0]], dtype=torch.float64),
        atol=1e-12, rtol=0,
    )


def test_gae_lambda_one_is_monte_carlo_and_lambda_zero_is_td0():
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t; row 0: 1 - V = [0.5, 0.4, 0.3], R = 1
    adv, ret = gae_advantages_and_returns(GAE_R, GAE_V, GAE_MASK, 1.0, 1.0)
    assert_close(adv[0], torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64))
    assert_close(ret[0], torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64))
    # row 1: t2: 1 - 0.7 = 0.3; t0: 0.2 + 1 - 0.5 = 0.7
    assert_close(adv[1], torch.tensor([0.7, 0.0, 0.3], dtype=torch.float64))
    # lam = 0: A_t = delta_t; row 0 with gamma 0.9: [0.04, 0.03, 0.3]
    adv0, _ = gae_advantages_and_returns(GAE_R, GAE_V, GAE_MASK, 0.9, 0.0)
    assert_close(adv0[0], torch.tensor([0.04, 0.03, 0.3], dtype=torch.float64), atol=1e-12, rtol=0)


def test_gae_function_no_gradient_and_dtype():
    values = GAE_V.to(torch.float32).requires_grad_(True)
    adv, ret = gae_advantages_and_returns(GAE_R, values, GAE_MASK, 0.9, 0.8)
    assert not adv.requires_grad and not ret.requires_grad
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32


# gae estimator, gamma = lam = 1 (A_t = return-to-go - V_t):
# row 0 mask [1, 1, 0], tr [0.5, -0.5, 9], r = 1 -> token rewards [0.5, 0.5]: G = [1, 0.5];
#       V [-1, 0.5, 7] -> A = [2, 0]
# row 1 mask [0, 1, 1], tr [3, 0, 0], r = 0 -> G = [., 0, 0]; V [1, -2, 0] -> A = [., 2, 0]
# row 2 zero-length (r = 5, values arbitrary) -> 0
# masked A = 2, 0, 2, 0: mean 1, population std 1 -> whitened with eps 0.25: +-0.8
E_REWARDS = torch.tensor([1.0, 0.0, 5.0])
E_MASK = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
E_TR = torch.tensor([[0.5, -0.5, 9.0], [3.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
E_V = torch.tensor([[-1.0, 0.5, 7.0], [1.0, -2.0, 0.0], [3.0, 3.0, 3.0]])


def test_gae_estimator_unscaled_and_whitened():
    groups = torch.tensor([0, 1, 2])
    raw = advantage(
        gae_advantage, E_REWARDS, groups, E_MASK, E_V, dict(gamma=1.0, lam=1.0, scale_by_std=False), token_rewards=E_TR
    )
    assert_close(raw, torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    assert raw.dtype == E_MASK.dtype
    white = advantage(
        gae_advantage, E_REWARDS, groups, E_MASK, E_V, dict(gamma=1.0, lam=1.0, adv_eps=0.25), token_rewards=E_TR
    )
    assert_close(white, torch.tensor([[0.8, -0.8, 0.0], [0.0, 0.8, -0.8], [0.0, 0.0, 0.0]]), atol=1e-7, rtol=0)


def test_gae_estimator_without_token_rewards_puts_reward_on_last_token():
    # gamma 0.5, lam 1, V = 0: A_t = 0.5^(steps to the last masked token) * r
    # row 0: [0.25, 0.5, 1] * 4; row 1 (mask [1, 0, 1]): [0.5 * 2, 0, 2]
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    adv = advantage(
        gae_advantage, torch.tensor([4.0, 2.0]), torch.tensor([0, 0]), mask, torch.zeros(2, 3),
        dict(gamma=0.5, lam=1.0, scale_by_std=False),
    )
    assert_close(adv, torch.tensor([[1.0, 2.0, 4.0], [1.0, 0.0, 2.0]]))


def test_gae_estimator_requires_values_and_handles_empty_batch():
    with pytest.raises(ValueError, match="values"):
        advantage(gae_advantage, E_REWARDS, torch.tensor([0, 1, 2]), E_MASK, None, None)
    adv = advantage(gae_advantage, E_REWARDS, torch.tensor([0, 1, 2]), torch.zeros(3, 3), E_V, None)
    assert torch.isfinite(adv).all() and torch.count_nonzero(adv).item() == 0


def test_outcome_token_rewards_places_reward_on_last_masked_token():
    # row 0 mask [1, 1, 0]: [tr0, tr1 + 1]; row 1 mask [1, 0, 1]: [tr0, 0, tr2 + 2] (tr1 = 7 ignored); row 2 empty
    out = outcome_token_rewards(PP_REWARDS, PP_MASK, PP_TR)
    assert out.dtype == torch.float64
    assert_close(out, torch.tensor([[2.0, 1.0, 0.0], [-2.0, 0.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
    bare = outcome_token_rewards(PP_REWARDS, PP_MASK)
    assert_close(bare, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
