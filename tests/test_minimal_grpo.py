"""examples/minimal_grpo.py against the framework: its advantages are the ``grpo`` estimator's, its loss
is ``ppo_clip`` + ``token_mean``, and its update equals ``Learner.update`` under the default recipe on the
same batch, to 1e-6 on every weight and on the loss (a small random Llama with tiny-base's architecture
and vocabulary, in float64: tests/numerics.py). The batch's sampling log-probs are zeros: the default
recipe never reads them (no mismatch correction; pi_old is the learner's own)."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import torch
from numerics import float64_model

from reinforge.algo.advantage_estimators import GroupNormSettings, grpo_advantage
from reinforge.algo.aggregation import AggNorm, token_mean
from reinforge.algo.policy_losses import PPOClipSettings, ppo_clip_loss
from reinforge.config import load_config
from reinforge.learn.learner import Learner
from reinforge.orchestrate.episodes import build_batch
from reinforge.types import Trajectory

_spec = importlib.util.spec_from_file_location(
    "minimal_grpo", Path(__file__).resolve().parents[1] / "examples" / "minimal_grpo.py")
mg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mg)

G = 4
PROMPTS = [[1, 5, 6, 14, 7, 8, 16], [1, 12, 14, 9, 16], [1, 13, 10, 14, 6, 4, 16]]  # <bos>12+34=, 8+5=, 96+20=
COMPLETIONS = [  # G per prompt; 2 = <eos>; a row without it was cut at max_new_tokens
    [[8, 10, 2], [8, 9, 2], [8, 10, 2], [5, 5, 5, 5, 5, 5, 5, 5]],
    [[5, 7, 2], [5, 7, 2], [5, 8, 2], [2]],  # every reward 0: the group is dropped
    [[5, 5, 10, 2], [5, 5, 10, 2], [5, 5, 6, 2], [5, 2]],
]
REWARDS = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]


def _trajectories() -> list[Trajectory]:
    return [Trajectory(token_ids=p + c, loss_mask=[0] * len(p) + [1] * len(c), logprobs=[0.0] * (len(p) + len(c)),
                       version=0, group_id=g, task_id=str(g), reward=r, finish_reason="stop")
            for g, p in enumerate(PROMPTS) for c, r in zip(COMPLETIONS[g], REWARDS[g], strict=True)]


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def _small_llama() -> torch.nn.Module:
    """tiny-base's architecture and vocabulary (Llama, tied embeddings) at a fifth of its width, 2 layers,
    random weights, float64: the same code paths as tiny-base (shared-prefix forward included), ~10x faster."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from reinforge.assets import resolve_model_path

    config = LlamaConfig.from_pretrained(resolve_model_path("tiny-base"))
    config.update({"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "num_key_value_heads": 2, "head_dim": 32})
    torch.manual_seed(0)
    return float64_model(LlamaForCausalLM(config))


def _both_updates(*overrides: str) -> tuple[float, float, dict[str, float]]:
    """(max |theta_example - theta_learner| after the update, the example's loss, the learner's metrics)."""
    cfg = load_config(None, ["model.dtype=float64", *overrides])  # the default recipe
    base = _small_llama()
    learner = Learner.for_run(copy.deepcopy(base), cfg)
    batch, _ = build_batch(_trajectories(), cfg.algo, pad_id=0)
    assert learner.shared_prefix is not None  # the default recipe's training forward (each prompt computed once)
    metrics = learner.update(batch)

    model = copy.deepcopy(base).train()
    t = cfg.train
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    rewards = torch.tensor(REWARDS).view(-1)
    adv = mg.group_advantages(rewards, G)
    keep = [i for i in range(len(rewards)) if rewards.view(-1, G)[i // G].std() > 0]
    ex = mg.make_batch([PROMPTS[i // G] for i in keep], [COMPLETIONS[i // G][i % G] for i in keep], adv[keep], 0)
    if t.epochs > 1:  # pi_old: one no-grad pass before the first step
        with torch.no_grad():
            ex["old_logp"] = mg.sequence_logprobs(model, ex["ids"], ex["attn"])
    loss = sum(mg.update(model, optimizer, ex) for _ in range(t.epochs)) / t.epochs  # its defaults: clip, grad clip
    diff, moved = _max_diff(model, learner.model), _max_diff(model, base)
    assert moved > 1e-5  # the update did move the weights
    return diff, loss, metrics


def test_group_advantages_match_the_grpo_estimator_and_hand_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = mg.group_advantages(rewards, 4)
    a, b = 0.5 / (math.sqrt(1 / 3) + 1e-6), 0.5 / (math.sqrt(1 / 6) + 1e-6)  # unbiased stds (divisor 3), eps 1e-6
    expected = torch.tensor([a, -a, -a, a, 0, 0, b, -b, 0, 0, 0, 0], dtype=torch.float64)
    assert (adv - expected).abs().max() < 1e-12
    mask = torch.ones(12, 3, dtype=torch.float64)  # the estimator returns the mask's dtype (float32 in a batch)
    framework = grpo_advantage(rewards, torch.arange(12) // 4, mask, GroupNormSettings())
    assert (adv[:, None] - framework).abs().max() < 1e-12


def test_grpo_loss_against_hand_values_and_the_framework():
    ratio = torch.tensor([[1.5, 0.5, 1.1, 7.0], [0.5, 1.5, 0.9, 1.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.3, -1.2, -0.7, -2.0]], dtype=torch.float64)
    logp, adv = old + ratio.log(), torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    # A = 1: -min(1.5, 1.2), -min(.5, .8), -min(1.1, 1.1); A = -2: max(1, 1.6), max(3, 2.4), max(1.8, 1.8), 2
    hand = (-1.2 - 0.5 - 1.1 + 1.6 + 3.0 + 1.8 + 2.0) / 7
    assert abs(float(mg.grpo_loss(logp, old, adv, mask)) - hand) < 1e-12
    per_token, _ = ppo_clip_loss(logp, old, adv[:, None] * mask, PPOClipSettings(clip_high=0.28))
    framework = token_mean(per_token, mask, AggNorm.of(mask))
    assert abs(float(mg.grpo_loss(logp, old, adv, mask, 0.2, 0.28) - framework)) < 1e-12


def test_the_example_update_equals_the_learner_update():
    """One step per batch (the default recipe): pi_old is the policy itself, rho = 1, the clip is inactive;
    a different aggregation (e.g. seq_mean_token_mean) fails on the weights and the loss."""
    diff, loss, metrics = _both_updates()
    assert diff < 1e-6 and abs(loss - metrics["loss"]) < 1e-6, (diff, loss, metrics["loss"])
    assert metrics["clip_frac"] == 0.0


def test_the_example_update_equals_the_learner_update_over_two_epochs():
    """Two steps on one batch (``train.epochs=2``): pi_old comes from a no-grad pass before the first step,
    and in the second rho != 1, so the clip range takes part (a clip_low of 0.28 fails on the weights and
    the loss, a clip_high of 0.28 on the loss)."""
    diff, loss, metrics = _both_updates("train.epochs=2", "train.lr=3e-3")  # a larger step: more tokens clipped
    assert diff < 1e-6 and abs(loss - metrics["loss"]) < 1e-6, (diff, loss, metrics["loss"])
    assert metrics["clip_frac"] > 0.1  # the second step has tokens outside [0.8, 1.2]
