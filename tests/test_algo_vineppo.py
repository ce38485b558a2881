"""VinePPO's advantage (algo/vineppo.py) against hand-computed values."""

from __future__ import annotations

import torch

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.context import Context
from reinforge.algo.vineppo import VineSettings, step_values, vineppo_advantage


def _batch():
    """Row 0: prompt of 2, three generated tokens, states before each (V = 0.5, 0.25, 1.0), R = 1.
    Row 1: prompt of 1, four tokens, states before tokens 1 and 3 (V = 0.5, 0.0), R = 0.
    Row 2: prompt of 2, two tokens, no estimated state, R = 1."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.float32)
    values = torch.tensor([[0, 0, 0.5, 0.25, 1.0], [0, 0.5, 0, 0.0, 0], [0, 0, 0, 0, 0]])
    states = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 0, 1, 0], [0, 0, 0, 0, 0]])
    rewards = torch.tensor([1.0, 0.0, 1.0])
    return rewards, mask, values, states


def test_step_advantage_is_the_td_of_the_mc_values():
    rewards, mask, values, states = _batch()
    adv = vineppo_advantage(rewards, mask, VineSettings(whiten=False), values, states)
    expected = torch.tensor([
        [0, 0, 0.25 - 0.5, 1.0 - 0.25, 1.0 - 1.0],    # V(s_1) - V(s_0), V(s_2) - V(s_1), R - V(s_2)
        [0, 0.0 - 0.5, 0.0 - 0.5, 0.0 - 0.0, 0.0 - 0.0],  # step 0 = tokens 1-2, step 1 = tokens 3-4 (R = 0)
        [0, 0, 1.0, 1.0, 0],                          # no state: A = R
    ])
    torch.testing.assert_close(adv, expected)


def test_values_before_and_after_each_token():
    rewards, mask, values, states = _batch()
    before, after = step_values(rewards, mask, values, states)
    assert before[0, 2:].tolist() == [0.5, 0.25, 1.0] and after[0, 2:].tolist() == [0.25, 1.0, 1.0]
    assert before[1, 1:].tolist() == [0.5, 0.5, 0.0, 0.0] and after[1, 1:].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_step_advantages_telescope_to_r_minus_the_prompt_value():
    """Summed once per step, the advantages of a completion are R - V(s_0) (gamma = 1)."""
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(1, 12)
    states = torch.zeros(1, 12)
    states[0, [0, 3, 4, 9]] = 1
    values = torch.rand(1, 12, generator=g) * states
    adv = vineppo_advantage(torch.tensor([1.0]), mask, VineSettings(whiten=False), values, states)
    per_step = adv[0, [0, 3, 4, 9]].sum()
    torch.testing.assert_close(per_step, 1.0 - values[0, 0])


def test_whitening_is_over_the_batch_tokens():
    rewards, mask, values, states = _batch()
    raw = vineppo_advantage(rewards, mask, VineSettings(whiten=False), values, states)
    white = vineppo_advantage(rewards, mask, VineSettings(), values, states)
    live = raw[mask != 0].double()
    mean, std = live.mean(), live.std(unbiased=False)
    torch.testing.assert_close(white[mask != 0].double(), (live - mean) / (std + 1e-6), rtol=1e-5, atol=1e-6)
    assert (white[mask == 0] == 0).all()


def test_the_registered_estimator_declares_its_needs_and_reads_the_context():
    assert {"state_values", "ungrouped"} <= ADVANTAGES.needs("vineppo")
    rewards, mask, values, states = _batch()
    ctx = Context(mask=mask, rewards=rewards, state_values=values, state_mask=states)
    adv = ADVANTAGES.call("vineppo", ctx, VineSettings(whiten=False))
    torch.testing.assert_close(adv, vineppo_advantage(rewards, mask, VineSettings(whiten=False), values, states))
    bare = ADVANTAGES.call("vineppo", Context(mask=mask, rewards=rewards), VineSettings(whiten=False))
    torch.testing.assert_close(bare, rewards[:, None] * mask)  # no values given: A_t = R
