"""Presets exercise the mechanism they are named for: with several mini-batch updates per rollout
batch the importance ratio moves away from 1 after the first update, so each preset's clip (or cap)
binds, and no two presets update the policy the same way on one batch."""

import copy
import dataclasses
import itertools

import pytest
import torch
from test_learner_parts import _rollout_batch

from reinforge.algo.objective import required_inputs
from reinforge.config import load_config, preset_names
from reinforge.learn.critic import build_critic
from reinforge.learn.learner import Learner
from reinforge.models.loading import load_model
from reinforge.orchestrate.components import build_components

DEMO_SCALE = ["rollout.prompts_per_step=16", "rollout.group_size=8", "task.heldout_size=20", "train.time_limit_s=0",
              "eval.final_samples=0", "log.report=false"]
CLIPPED_PRESETS = ["dapo", "gspo", "cispo", "ppo", "reinforce_pp", "bapo", "dcpo", "aspo", "m2po", "gtpo", "grpo_s", "aepo"]


@pytest.fixture(scope="module")
def demo_batch(tmp_path_factory):
    """One rollout batch of the demo's shape (16 prompts x 8 samples), every group kept, with a
    per-sequence baseline so that ReMax's estimator has one and a prompt key per group so that DCPO's SAS has one."""
    out = tmp_path_factory.mktemp("presets")
    c = build_components(load_config(None, [f"output_dir={out}", "algo.skip_equal_reward_groups=false", *DEMO_SCALE]))
    _, batch = _rollout_batch(c)
    assert batch.rewards.min() < batch.rewards.max()
    return dataclasses.replace(batch, baseline=torch.full_like(batch.rewards, 0.5), prompt_key=batch.group_index.clone())


def _learner(name: str, tmp_path) -> Learner:
    """The preset's learner on tiny-base, every preset from the same initial weights."""
    cfg = load_config(None, [f"preset={name}", f"output_dir={tmp_path}", *DEMO_SCALE])
    torch.manual_seed(0)
    needs = required_inputs(cfg.algo)
    policy = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device)
    ref = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device) if "ref_logp" in needs else None
    critic = build_critic(cfg.model.path, cfg.algo.critic, cfg.model.dtype, cfg.model.device) if "values" in needs else None
    return Learner.for_run(policy, cfg, ref, critic)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors if t is not None]).clone()


def _sampled_by_an_older_policy(batch):
    """The batch with its sampling log-probs moved off the current policy's by a fixed pattern (at most
    0.1 nats a token), as if an older policy had sampled it."""
    sampling = batch.sampling_logprobs
    shift = 0.1 * torch.sin(torch.arange(sampling.numel(), dtype=sampling.dtype)).view_as(sampling)
    return dataclasses.replace(batch, sampling_logprobs=sampling + shift)


def _update_recording_gradients(learner: Learner, batch) -> tuple[dict[str, float], list[torch.Tensor]]:
    """``learner.update(batch)`` and the policy's flattened gradient at every optimizer step."""
    grads: list[torch.Tensor] = []
    learner.optimizer.register_step_pre_hook(
        lambda *_: grads.append(_flat(p.grad for p in learner.model.parameters())))
    return learner.update(copy.deepcopy(batch)), grads


@pytest.mark.parametrize("name", CLIPPED_PRESETS)
def test_preset_takes_several_updates_and_its_clip_binds(name, demo_batch, tmp_path):
    learner = _learner(name, tmp_path)
    assert learner.train_cfg.minibatches >= 4
    metrics, grads = _update_recording_gradients(learner, demo_batch)
    assert metrics["updates"] == len(grads) == learner.train_cfg.minibatches
    # The first mini-batch has ratio 1 exactly (pi_old = pi), so a positive mean over the update
    # means the clip acted on a later mini-batch.
    assert metrics["clip_frac"] > 0, metrics


def test_no_two_presets_update_the_policy_the_same_way(demo_batch, tmp_path):
    """Pairwise over every preset: the weights after the update differ, and where two presets take
    the same number of optimizer steps, so do their gradients (dapo and cispo differ only where a
    token is clipped; gspo and grpo only where the sequence ratio is). The batch's sampling log-probs
    are an older policy's, as for rows an asynchronous run or a replay buffer brings: repo (grpo with its
    ratio to the policy that sampled each row) differs from grpo only there."""
    batch = _sampled_by_an_older_policy(demo_batch)
    grads, weights = {}, {}
    for name in preset_names():
        learner = _learner(name, tmp_path)
        grads[name] = _update_recording_gradients(learner, batch)[1]
        weights[name] = _flat(learner.model.parameters())
    for a, b in itertools.combinations(sorted(grads), 2):
        assert not torch.allclose(weights[a], weights[b], rtol=0, atol=1e-7), f"{a} and {b} update alike"
        if len(grads[a]) == len(grads[b]):
            diff = max(float((x - y).abs().max()) for x, y in zip(grads[a], grads[b], strict=True))
            scale = max(float(x.abs().max()) for x in grads[a])
            assert diff > 1e-3 * scale, f"{a} and {b} produce the same gradients on one batch"


def test_batch_statistics_see_the_whole_minibatch(demo_batch, tmp_path):
    """BAPO's clip bounds and M2PO's mask are computed over the micro-batch the loss is called on: at
    demo scale the whole rollout batch (so each of its mini-batches) fits in one micro-batch, so they
    are the mini-batch's statistics."""
    learner = _learner("m2po", tmp_path)
    assert len(learner._micro_batches(demo_batch)) == 1, learner.train_cfg.micro_batch_tokens
