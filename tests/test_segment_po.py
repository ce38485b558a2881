"""Segment Policy Optimization (SPO-chain, ``segment_po``): cutpoint partition at low-probability tokens,
segment advantages from Monte Carlo boundary values, the probability mask and the whitening, against
hand-computed values."""

from __future__ import annotations

import math

import torch

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.context import Context
from reinforge.algo.segment_po import SegmentPOSettings
from reinforge.config import load_config
from reinforge.orchestrate.state_values import CutSettings, cut_points, cut_settings

PROBS = [0.95, 0.5, 0.99, 0.3, 0.2, 0.8]  # sampling probabilities of a 6-token completion
LOGPS = [math.log(p) for p in PROBS]


def _decode(ids, **_):
    return "x" * len(ids)


def test_cutpoints_are_the_low_probability_tokens_every_interval():
    gen = [10] * 6
    # p < 0.9 at tokens 1, 3, 4, 5: every one starts a segment, or every 2nd / 3rd counting from the first
    assert cut_points(gen, _decode, CutSettings(9, "low_prob", 1, 20, 0.9, 1), LOGPS) == [1, 3, 4, 5]
    assert cut_points(gen, _decode, CutSettings(9, "low_prob", 1, 20, 0.9, 2), LOGPS) == [1, 4]
    assert cut_points(gen, _decode, CutSettings(9, "low_prob", 1, 20, 0.9, 3), LOGPS) == [1, 5]
    assert cut_points(gen, _decode, CutSettings(9, "low_prob", 1, 20, 0.5, 1), LOGPS) == [3, 4]  # p < 0.5
    assert cut_points(gen, _decode, CutSettings(9, "low_prob", 1, 1, 0.9, 1), LOGPS) == [1]  # max_cuts
    # a low-probability first token counts as a cutpoint (the prompt's state, always estimated): with
    # p = 0.5, 0.95, 0.3, 0.4 the cutpoints are 0, 2, 3 and every 2nd is 0, 3
    first = [math.log(p) for p in (0.5, 0.95, 0.3, 0.4)]
    assert cut_points([10] * 4, _decode, CutSettings(9, "low_prob", 1, 20, 0.9, 2), first) == [3]


def test_the_loop_reads_the_cutpoint_settings():
    cfg = load_config(None, ["algo.advantage={name: segment_po, cut_interval: 3, prob_threshold: 0.8, rollouts: 4}",
                             "algo.skip_equal_reward_groups=false"])
    assert cut_settings(cfg.algo) == CutSettings(4, "low_prob", 1, 25, 0.8, 3)


def _segment_po(**settings):
    # boundaries (interval 3) at tokens 1 and 5: V(s_0) = 0.5 (the prompt), V(s_1) = 0.25, V(s_5) = 1.0; R = 0
    values = torch.tensor([[0.5, 0.25, 0.0, 0.0, 0.0, 1.0]])
    where = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]])
    ctx = Context(mask=torch.ones(1, 6), rewards=torch.tensor([0.0]), sampling_logp=torch.tensor([LOGPS]),
                  state_values=values, state_mask=where)
    return ADVANTAGES.call("segment_po", ctx, SegmentPOSettings(adv_eps=1e-12, **settings))[0]


def test_segment_advantages_under_the_probability_mask_hand_values():
    # segments [0,1): 0.25 - 0.5 = -0.25; [1,5): 1.0 - 0.25 = 0.75; [5,6): R - 1.0 = -1.0
    plain = _segment_po(prob_mask=False, whiten=False)
    assert torch.allclose(plain, torch.tensor([-0.25, 0.75, 0.75, 0.75, 0.75, -1.0]))
    # the mask keeps the tokens with p < 0.9 (1, 3, 4, 5)
    masked = _segment_po(whiten=False)
    assert torch.allclose(masked, torch.tensor([0.0, 0.75, 0.0, 0.75, 0.75, -1.0]))
    # whitened over the kept tokens 0.75, 0.75, 0.75, -1.0: mean 0.3125, unbiased std sqrt(2.296875 / 3) = 0.875
    # -> 0.4375 / 0.875 = 0.5 and -1.3125 / 0.875 = -1.5; the masked tokens stay 0
    assert torch.allclose(_segment_po(), torch.tensor([0.0, 0.5, 0.0, 0.5, 0.5, -1.5]))


def test_without_values_every_token_gets_the_outcome():
    ctx = Context(mask=torch.tensor([[1.0, 1.0, 0.0]]), rewards=torch.tensor([1.0]),
                  sampling_logp=torch.tensor([[math.log(0.5), math.log(0.5), 0.0]]))
    adv = ADVANTAGES.call("segment_po", ctx, SegmentPOSettings(whiten=False))
    assert adv.tolist() == [[1.0, 1.0, 0.0]]
    assert {"state_values", "sampling_logp"} <= set(ADVANTAGES.entry("segment_po").needs)
