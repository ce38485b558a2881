"""Methods for vision-language policies (docs/vision.md): PAPO's loss term and its masked-picture forward,
NoisyRollout's group sampler, the grounding rewards and the shapes ``box`` question; each against values
computed by hand, and each for one step through the loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reinforge.algo.objective import Term
from reinforge.algo.perception import (
    PapoSettings,
    mask_patches,
    papo_term,
    perception_kl,
)
from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.learn.perception import masked_fields, vision_patch
from reinforge.rewards.grounding import box_hit, box_iou, box_iou_threshold, iou, parse_box
from reinforge.rollout.noisy_rollout import (
    NoisyRollout,
    NoisyRolloutSettings,
    diffusion_noise,
    sigmoid_anneal,
)
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.types import Task

pytest.importorskip("PIL.Image")


# --- PAPO -------------------------------------------------------------------------------------------------------


def test_perception_kl_is_k3_of_the_masked_to_clean_ratio():
    logp, masked = torch.log(torch.tensor([0.5, 0.2])), torch.log(torch.tensor([0.25, 0.2]))
    # r = 0.25 / 0.5 = 0.5: 0.5 - log 0.5 - 1 = 0.1931472; equal probabilities: 0
    torch.testing.assert_close(perception_kl(logp, masked), torch.tensor([0.1931472, 0.0]), rtol=0, atol=1e-6)


def test_papo_term_values_and_gradients_by_hand():
    logp = torch.log(torch.tensor([[0.5]])).requires_grad_()
    masked = torch.log(torch.tensor([[0.25]])).requires_grad_()
    entropy, masked_entropy = torch.tensor([[1.0]], requires_grad=True), torch.tensor([[2.0]], requires_grad=True)
    values, metrics = papo_term(logp, masked, entropy, masked_entropy, PapoSettings())
    # -0.01 * 0.1931472 + 0.03 * (1 + 2) = 0.0880685
    torch.testing.assert_close(values, torch.tensor([[0.0880685]]), rtol=0, atol=1e-7)
    values.sum().backward()
    # d(-gamma KL)/d masked_logp = -gamma (r - 1) = 0.005; d/d logp = -gamma (1 - r) = -0.005; entropies: eta
    torch.testing.assert_close(masked.grad, torch.tensor([[0.005]]))
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.005]]))
    assert entropy.grad.item() == pytest.approx(0.03) and masked_entropy.grad.item() == pytest.approx(0.03)
    assert metrics["papo/kl_prc"].item() == pytest.approx(0.1931472, abs=1e-6)
    capped, _ = papo_term(logp, masked, entropy, masked_entropy, PapoSettings(cap=0.1, eta=0.0))
    assert capped.item() == pytest.approx(-0.001)  # -0.01 * min(0.193, 0.1)


def test_papo_settings_reject_bad_values_naming_the_field():
    with pytest.raises(ConfigError, match="mask_ratio"):
        load_config(None, ["algo.loss_terms=[{name: papo, mask_ratio: 0}]"]).algo.loss_terms[0].settings()
    assert load_config(None, ["algo.loss_terms=[{name: papo}]"]).algo.loss_terms[0].settings().gamma == 0.01


def test_mask_patches_masks_whole_patches_in_the_given_share():
    pixels = torch.ones(2, 3, 4, 4)
    out = mask_patches(pixels, 0.5, 2, torch.Generator().manual_seed(0))
    for picture in out:  # 4 patches of 2 x 2, 2 of them zero in all channels
        blocks = picture.unfold(1, 2, 2).unfold(2, 2, 2)  # [3, 2, 2, 2, 2]
        per_patch = blocks.sum(dim=(0, 3, 4))
        assert sorted(per_patch.flatten().tolist()) == [0.0, 0.0, 12.0, 12.0]
    assert mask_patches(pixels, 1.0, 2).abs().sum() == 0  # ratio 1: a blank picture
    ragged = mask_patches(torch.ones(1, 1, 5, 5), 1 / 9, 2, torch.Generator().manual_seed(1))  # 3 x 3 patches
    assert 25 - int(ragged.sum()) in (1, 2, 4)  # one patch: a corner, edge or full one


def test_masked_fields_run_the_forward_on_masked_pictures_only_when_a_term_needs_them():
    from reinforge.types import Batch

    rows = {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3, dtype=torch.long),
            "loss_mask": torch.tensor([[0.0, 1.0, 1.0]]), "sampling_logprobs": torch.zeros(1, 3),
            "prefix_len": torch.tensor([1]), "group_index": torch.tensor([0]), "rewards": torch.tensor([1.0])}
    mb = Batch(**rows, model_inputs={"pixel_values": torch.ones(1, 3, 4, 4)})
    seen = []

    def forward(batch):
        seen.append(batch.model_inputs["pixel_values"])
        return torch.zeros(1, 3), torch.ones(1, 3)

    assert masked_fields([Term("entropy", 0.1)], mb, torch.nn.Linear(1, 1), forward) == {}
    out = masked_fields([Term("papo", 1.0, PapoSettings(mask_ratio=1.0, patch=2))], mb, torch.nn.Linear(1, 1), forward)
    assert set(out) == {"masked_logp", "masked_entropy"} and seen[0].abs().sum() == 0
    assert mb.model_inputs["pixel_values"].sum() == 48  # the batch's own pictures untouched
    text = Batch(**rows)
    with pytest.raises(ConfigError, match="papo masks the rows' pictures"):
        masked_fields([Term("papo", 1.0, PapoSettings())], text, torch.nn.Linear(1, 1), forward)


def test_vision_patch_reads_the_model_config():
    import json
    from types import SimpleNamespace

    from reinforge.assets import resolve_model_path

    config = json.loads((resolve_model_path("tiny-vlm") / "config.json").read_text())
    model = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(**config["vision_config"])))
    assert vision_patch(model) == 8 and vision_patch(torch.nn.Linear(1, 1)) == 14  # tiny-vlm's; else the paper's


# --- NoisyRollout ------------------------------------------------------------------------------------------------


def test_diffusion_noise_at_a_step_by_hand():
    x = torch.full((1, 3, 2, 2), 0.5)
    beta0 = 1 / (1 + math.exp(6)) * (0.5e-2 - 1e-5) + 1e-5  # sigmoid(-6) scaled: the first step's beta
    eps = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    want = (math.sqrt(1 - beta0) * 0.5 + math.sqrt(beta0) * eps).clamp(0, 1)
    torch.testing.assert_close(diffusion_noise(x, 0, torch.Generator().manual_seed(3)), want)
    late = diffusion_noise(torch.zeros(1, 3, 64, 64), 999, torch.Generator().manual_seed(0))
    assert 0 <= late.min() and late.max() <= 1 and late.mean() > 0.3  # mostly noise by the last step


def test_sigmoid_anneal_by_hand():
    assert sigmoid_anneal(500, 30, 60, 30.0, 0.5) == 250  # the midpoint: half
    assert sigmoid_anneal(500, 0, 60, 30.0, 0.5) == 499  # 500 (1 - 1 / (1 + e^15)) = 499.99985
    assert sigmoid_anneal(500, 60, 60, 30.0, 0.5) == 0
    assert sigmoid_anneal(500, 20, 60, 30.0, 0.5) == int(500 * (1 - 1 / (1 + math.exp(5))))  # 496


class _Processor:
    class image_processor:  # noqa: N801
        image_mean, image_std = [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]


class _Engine:
    processor = _Processor()

    def __init__(self):
        self.calls = []

    def generate(self, requests, params):
        self.calls.append(([r.model_inputs["pixel_values"].clone() for r in requests], params.n))
        return [Generation(r.request_id, r.prompt_ids, [7, len(self.calls)], [-0.1, -0.2], "stop", 0)
                for r in requests for _ in range(params.n)]


def test_noisy_rollout_groups_clean_and_noisy_samples_and_trains_on_the_clean_picture():
    clean = [torch.zeros(1, 3, 2, 2), torch.full((1, 3, 2, 2), 1.0)]  # normalised values: pixels 0.5 and 0.75
    requests = [GenerationRequest([1, 2], f"r{i}", {"pixel_values": p}) for i, p in enumerate(clean)]
    engine, sampler = _Engine(), NoisyRollout(NoisyRolloutSettings(total_steps=4, seed=5))
    out = sampler.sample(engine, requests, SamplingParams(n=4))
    (first, n1), (noisy, n2) = engine.calls
    assert (n1, n2) == (2, 2) and all(torch.equal(a, b) for a, b in zip(first, clean, strict=True))
    assert [g.request_id for g in out] == ["r0"] * 4 + ["r1"] * 4 and [g.sample_index for g in out[:4]] == [0, 1, 2, 3]
    assert [g.extra["noisy_rollout/noisy"] for g in out[:4]] == [0.0, 0.0, 1.0, 1.0]
    assert [g.token_ids[1] for g in out[:4]] == [1, 1, 2, 2]  # first the clean draws, then the noisy
    assert all(g.model_inputs is requests[i // 4].model_inputs for i, g in enumerate(out))  # the update: clean
    step = sigmoid_anneal(500, 0, 4, 30.0, 0.5)
    gen = torch.Generator().manual_seed(5 * 1_000_003)
    for req, shown in zip(requests, noisy, strict=True):  # un-normalised, noised at alpha_0's step, normalised
        want = (diffusion_noise(req.model_inputs["pixel_values"] * 0.25 + 0.5, step, gen) - 0.5) / 0.25
        torch.testing.assert_close(shown, want)
    assert sampler.counters()["noisy_rollout/noise_step"] == step and sampler.state_dict() == {"calls": 1}
    sampler.load_state_dict({"calls": 4})
    assert sampler.noise_step() == 0


def test_noisy_rollout_refuses_groups_of_one_and_rows_without_pictures():
    sampler = NoisyRollout()
    with pytest.raises(ConfigError, match="group_size >= 2"):
        sampler.sample(_Engine(), [GenerationRequest([1], "a", {"pixel_values": torch.zeros(1, 3, 2, 2)})],
                       SamplingParams(n=1))
    with pytest.raises(ConfigError, match="has no picture"):
        sampler.sample(_Engine(), [GenerationRequest([1], "a")], SamplingParams(n=2))
    sent_pictures = _Engine()
    sent_pictures.reads_model_inputs = False  # the vLLM engine's: it samples from the pictures, not pixel_values
    with pytest.raises(ConfigError, match="noisy_rollout noises the processor's pixel values.*rollout.engine=torch"):
        sampler.sample(sent_pictures, [GenerationRequest([1], "a", {"pixel_values": torch.zeros(1, 3, 2, 2)})],
                       SamplingParams(n=2))
    assert sent_pictures.calls == []
    from reinforge.rollout.openai_engine import OpenAIRolloutEngine
    from reinforge.rollout.vllm_engine import VLLMRolloutEngine
    # both send the pictures themselves (image parts, multi_modal_data): the noise on pixel_values would not reach them
    assert OpenAIRolloutEngine.reads_model_inputs is False and VLLMRolloutEngine.reads_model_inputs is False


# --- grounding rewards and the box question -------------------------------------------------------------------------


def _box_task(answer: str, **metadata) -> Task:
    return Task(id="b", prompt="box?", answer=answer, metadata=metadata)


def test_box_iou_by_hand():
    assert parse_box("the box is [3, 4, 12, 15].") == (3.0, 4.0, 12.0, 15.0) and parse_box("1,2,3") is None
    assert parse_box("5,5,1,1") is None  # corners out of order
    assert iou((0, 0, 9, 9), (5, 5, 14, 14)) == pytest.approx(25 / 175)  # 5 x 5 of 100 + 100 - 25
    task = _box_task("0,0,9,9")
    assert box_iou(task, "0,0,9,9").reward == 1.0
    half = box_iou(task, "0,0,4,9")  # 50 of 100 pixels
    assert half.reward == pytest.approx(0.5) and half.correct and half.answer == "0,0,4,9"
    assert box_iou(task, "5,5,14,14").reward == pytest.approx(1 / 7) and not box_iou(task, "5,5,14,14").correct
    assert box_iou(task, "20,20,29,29").reward == 0.0 and box_iou(task, "red").reward == 0.0
    with pytest.raises(ValueError, match="no box"):
        box_iou(_box_task("red"), "0,0,1,1")


def test_box_iou_threshold_by_hand():
    task = _box_task("0,0,9,9")
    assert box_iou_threshold(task, "5,5,14,14").reward == 0.0  # IoU 1/7 < 0.5
    assert box_iou_threshold(task, "0,0,4,9").reward == pytest.approx(0.5)  # at the criterion
    strict = _box_task("0,0,9,9", iou_threshold=0.75)  # the paper's second stage
    assert box_iou_threshold(strict, "0,0,4,9").reward == 0.0 and box_iou_threshold(strict, "0,0,8,9").reward == 0.9


def test_box_hit_by_hand():
    task = _box_task("0,0,9,9")
    assert box_hit(task, "0,0,9,9").reward == 1.0
    at = box_hit(task, "0,0,4,9")  # IoU 50/100 = 0.5: at Acc@0.5's criterion, the whole reward
    assert at.reward == 1.0 and at.correct and at.answer == "0,0,4,9"
    near = box_hit(task, "0,0,3,9")  # IoU 40/100 = 0.4: box_iou gives 0.4, box_hit nothing
    assert near.reward == 0.0 and not near.correct and box_iou(task, "0,0,3,9").reward == pytest.approx(0.4)
    assert box_hit(task, "0,0,8,9").reward == 1.0  # IoU 0.9: box_iou_threshold gives 0.9, box_hit 1
    assert box_hit(task, "red").reward == 0.0 and box_hit(task, "5,5,1,1").reward == 0.0


def test_shapes_box_answer_is_the_drawn_shapes_box():
    from reinforge.data.shapes import GROUND, shapes_splits

    tasks = [t for t in shapes_splits("box").train[:40] if t.metadata["shape"] == "square"]
    assert tasks and all(t.prompt[0]["content"][1]["text"] == "box?" for t in tasks)
    for t in tasks:
        px = torch.from_numpy(np.asarray(t.images[0]).copy())  # [32, 32, 3]
        ys, xs = torch.nonzero((px != torch.tensor(GROUND)).any(-1), as_tuple=True)
        assert t.answer == f"{xs.min()},{ys.min()},{xs.max()},{ys.max()}"
        assert box_iou(t, t.answer).reward == 1.0


# --- one step through the loop for each part ------------------------------------------------------------------------


ONE_STEP = ["model.path=tiny-vlm", "task.kind=shapes", "task.heldout_size=4", "train.steps=1", "eval.every=0",
            "eval.final_samples=0", "checkpoint.every=0", "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=8", "train.time_limit_s=0", "log.report=false", "algo.kl.coef=0.0"]


@pytest.mark.parametrize("extra, metric", [
    (["algo.loss_terms=[{name: papo}]"], "train/papo/kl_prc"),
    (["rollout.group_sampler={name: noisy_rollout, total_steps: 1}"], "rollout/noisy_rollout/noise_step"),
    (["task.question=box", "task.verifier=box_iou", "rollout.max_new_tokens=12"], "reward/mean"),
])
def test_one_step_through_the_loop(tmp_path, extra, metric):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    result = train(load_config(None, [f"output_dir={tmp_path}", *ONE_STEP, *extra]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if metric in m]
    assert len(rows) == 1 and math.isfinite(rows[0][metric]) and rows[0][metric] >= 0
    assert all(math.isfinite(m["loss/total"]) for m in read_jsonl(result.run_dir / "metrics.jsonl")
               if "loss/total" in m)
