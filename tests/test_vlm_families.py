"""Vision-language families by path (docs/vision.md): Qwen2-VL, Qwen2.5-VL, LLaVA and Idefics3 (SmolVLM), each a
tiny random model built offline in the test (tests/vlm_fixtures.py): processors without torchvision, the batch
record's rows of flattened patches, engine and learner log-probs against a direct HF forward, a GRPO step with a
checkpoint that reloads as the family, and LoRA with the vision tower frozen or adapted."""

from __future__ import annotations

import dataclasses
import logging
import sys

import pytest
import torch

from reinforge.data.shapes import shapes_splits
from reinforge.learn.forwards import PlainForward
from reinforge.models.loading import load_model, load_processor
from reinforge.models.vlm_inputs import forward_inputs, image_token_id
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.rollout.vision import encode_vision_prompt, with_image_parts
from reinforge.types import Batch, Trajectory
from tests.vlm_fixtures import FAMILIES, build_family

PIL = pytest.importorskip("PIL.Image")
CLASSES = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "llava": "Llava", "idefics3": "Idefics3"}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlms")
    return {f: build_family(f, root / f) for f in FAMILIES}


def _tasks(n: int = 2, sizes: tuple[int, ...] = (32, 48)):
    """Shapes prompts whose pictures differ in size (a Qwen-VL row of 16 patches beside one of 36)."""
    tasks = []
    for i in range(n):
        size = sizes[i % len(sizes)]
        tasks.append(shapes_splits(size=size).heldout[i])
    return tasks


def test_qwen_vl_processors_build_without_torchvision(family_dirs, monkeypatch, tmp_path, caplog):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # an import of it fails
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for family in ("qwen2_vl", "qwen2_5_vl"):
        with caplog.at_level(logging.INFO, logger="reinforge.models.processors"):
            processor = load_processor(family_dirs[family])
        assert "without its video processor (torchvision is not installed)" in caplog.text
        assert type(processor).__name__ == f"{CLASSES[family]}Processor" and not hasattr(processor, "video_processor")
        assert type(processor.image_processor).__name__.endswith("Pil")
        processor.save_pretrained(tmp_path / family)  # saved under the family's class: AutoProcessor finds it
        assert f'"processor_class": "{CLASSES[family]}Processor"' in (tmp_path / family / "processor_config.json"
                                                                      ).read_text()
    assert type(load_processor(family_dirs["idefics3"])).__name__ == "Idefics3Processor"


def test_qwen_vl_rows_keep_their_patches_through_select(family_dirs):
    model, processor = load_model(family_dirs["qwen2_vl"]), load_processor(family_dirs["qwen2_vl"])
    raw, rows = [], []
    tasks = _tasks(3)
    tasks[2] = dataclasses.replace(tasks[2], prompt="colour?", images=(tasks[0].images[0], tasks[1].images[0]))
    for t in tasks:
        text = processor.apply_chat_template(with_image_parts(t.prompt, len(t.images)), tokenize=False,
                                             add_generation_prompt=True)
        raw.append(processor(text=[text], images=list(t.images), return_tensors="pt"))
        rows.append(encode_vision_prompt(processor, t.prompt, t.images))
    assert [tuple(r[1]["pixel_values"].shape) for r in rows] == [(1, 16, 384), (1, 36, 384), (1, 52, 384)]
    assert "mm_token_type_ids" not in rows[0][1]  # derived from the whole sequence at each forward
    trajs = [Trajectory(ids, [0] * (len(ids) - 1) + [1], [0.0] * len(ids), 0, i, f"t{i}", model_inputs=inputs)
             for i, (ids, inputs) in enumerate(rows)]
    batch = Batch.from_trajectories(trajs, pad_id=0)
    assert batch.model_inputs["pixel_values"].shape == (3, 52, 384)  # zero-padded to the largest row
    assert batch.model_inputs["image_grid_thw"].tolist() == [[[1, 4, 4], [0, 0, 0]], [[1, 6, 6], [0, 0, 0]],
                                                             [[1, 4, 4], [1, 6, 6]]]
    for index in ([1], [2, 1], [0, 2], [0, 1]):
        sub = batch.select(index)
        kwargs = forward_inputs(model, sub.input_ids, sub.model_inputs)
        torch.testing.assert_close(kwargs["pixel_values"], torch.cat([raw[i]["pixel_values"] for i in index]),
                                   rtol=0, atol=0)
        torch.testing.assert_close(kwargs["image_grid_thw"], torch.cat([raw[i]["image_grid_thw"] for i in index]))
        assert (kwargs["mm_token_type_ids"][:, :raw[index[0]]["input_ids"].shape[1]][0]
                == raw[index[0]]["mm_token_type_ids"][0]).all()  # the processor's own, on the prompt


def _encoded(processor, task) -> tuple[list[int], str, dict]:
    ids, inputs = encode_vision_prompt(processor, task.prompt, task.images)
    return ids, task.id, inputs


def _direct_logits(model, processor, task, ids: list[int]) -> torch.Tensor:
    """Logits of one row alone, unpadded, from the processor's own outputs straight into transformers."""
    text = processor.apply_chat_template(with_image_parts(task.prompt, len(task.images)), tokenize=False,
                                         add_generation_prompt=True)
    out = processor(text=[text], images=list(task.images), return_tensors="pt")
    extra = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    full = torch.tensor([ids])
    if "mm_token_type_ids" in out:  # the processor's marks on the prompt, text (0) after it
        extra["mm_token_type_ids"] = torch.nn.functional.pad(out["mm_token_type_ids"], (0, len(ids) - out[
            "input_ids"].shape[1]))
    with torch.no_grad():
        return model(input_ids=full, **extra).logits[0, :-1].float()


@pytest.mark.numerics
@pytest.mark.parametrize("family", FAMILIES)
def test_engine_and_learner_logprobs_match_a_direct_hf_forward(family, family_dirs, caplog):
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    model, processor = load_model(family_dirs[family]).eval(), load_processor(family_dirs[family])
    engine = TorchRolloutEngine(model, processor.tokenizer, seed=5)
    engine.processor = processor
    tasks = _tasks(2)
    reqs = [GenerationRequest(*_encoded(processor, t)) for t in tasks]
    with caplog.at_level(logging.INFO, logger="reinforge.rollout.torch_engine"):
        gens = engine.generate(reqs, SamplingParams(max_new_tokens=6, temperature=1.0, n=2, ignore_eos=True))
    assert "the lean forward and continuous batching have no vision tower" in caplog.text  # the reason, logged
    by_id = {r.request_id: (r, t) for r, t in zip(reqs, tasks, strict=True)}
    trajs = []
    for i, g in enumerate(gens):
        req, _ = by_id[g.request_id]
        ids = g.prompt_ids + g.token_ids
        trajs.append(Trajectory(ids, [0] * len(g.prompt_ids) + [1] * len(g.token_ids),
                                [0.0] * len(g.prompt_ids) + g.logprobs, 0, i // 2, g.request_id,
                                model_inputs=req.model_inputs))
    batch = Batch.from_trajectories(trajs, pad_id=engine.pad_id)
    cfg = type("T", (), {"logprob_chunk_tokens": 0})()
    logp, _ = PlainForward(model, model, cfg).logprobs(model, batch, 1.0, False)
    token = torch.tensor([image_token_id(model)])
    for i, (t, g) in enumerate(zip(trajs, gens, strict=True)):
        logits = _direct_logits(model, processor, by_id[g.request_id][1], t.token_ids)
        ids = torch.tensor(t.token_ids)
        direct = torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]
        n, p = len(t.token_ids), len(g.prompt_ids)
        torch.testing.assert_close(logp[i, 1:n], direct, rtol=0, atol=1e-5)  # the learner: the plain softmax
        banned = torch.log_softmax(logits.index_fill(-1, token, float("-inf")), -1).gather(-1, ids[1:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(t.logprobs[p:]), banned[p - 1:], rtol=0, atol=1e-5)  # the engine


def spread(task, completion: str):
    """A reward that tells distinct completions apart (a random model's GRPO groups then have advantages)."""
    from reinforge.rewards.verifiers import RewardResult

    return RewardResult(sum(map(ord, completion)) % 97 / 97, False)


@pytest.mark.parametrize(("family", "lora"), [(f, False) for f in FAMILIES] + [("qwen2_vl", True)])
def test_one_grpo_step_saves_a_checkpoint_that_reloads_as_the_family(family, lora, family_dirs, tmp_path):
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, [f"model.lora.enabled={str(lora).lower()}", "model.lora.r=4",
        f"output_dir={tmp_path}", f"model.path={family_dirs[family]}", "task.kind=shapes", "task.heldout_size=4",
        "train.steps=1", "eval.every=0", "eval.final_samples=0", "checkpoint.every=1", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=4", "train.time_limit_s=0", "log.report=false",
        "algo.kl.coef=0.01", "train.lr=1e-2", "seed=0",
        f'reward.terms=[{{"name": "spread", "verifier": "{__name__}:spread", "weight": 1.0}}]'])
    result = train(cfg)
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 1 and rows[0]["batch/sequences"] == 4 and 0 < rows[0]["train/grad_norm"] < float("inf")
    ckpt = str(result.run_dir / "checkpoints" / "step_1")
    before, after = load_model(family_dirs[family]), load_model(ckpt)
    assert type(after).__name__ == f"{CLASSES[family]}ForConditionalGeneration"
    changed = [n for n, p in after.named_parameters() if not torch.equal(p, before.get_parameter(n))]
    assert changed, "the GRPO step changed no weight"
    if lora:  # the adapter alone is saved; merged on loading, it changed the language model's projections only
        assert (result.run_dir / "checkpoints" / "step_1" / "adapter_config.json").is_file()
        assert all(n.startswith("model.language_model.") and n.endswith("_proj.weight") for n in changed), changed
    processor, original = load_processor(ckpt), load_processor(family_dirs[family])
    assert type(processor).__name__ == type(original).__name__
    task = _tasks(1)[0]
    (ids, inputs), (ids0, inputs0) = (encode_vision_prompt(p, task.prompt, task.images) for p in (processor, original))
    assert ids == ids0 and all(torch.equal(inputs[k], inputs0[k]) for k in inputs0)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_lora_trains_the_language_model_and_the_vision_tower_only_when_asked(family, family_dirs):
    from reinforge.config import LoraConfig
    from reinforge.errors import ConfigError
    from reinforge.learn.lora import wrap_lora

    task = _tasks(1)[0]
    processor = load_processor(family_dirs[family])
    ids, inputs = encode_vision_prompt(processor, task.prompt, task.images)
    row = torch.tensor([ids + ids[-3:]])
    for tower in ("frozen", "lora"):
        base = load_model(family_dirs[family])
        language = next(n for n, m in base.named_modules() if m is base.get_decoder())
        model = wrap_lora(base, LoraConfig(enabled=True, vision_tower=tower))
        out = model(input_ids=row, **forward_inputs(model, row, inputs)).logits
        torch.log_softmax(out[0, -4:-1], -1).gather(-1, row[0, -3:, None]).sum().backward()
        if tower == "frozen":  # B = 0 at the start: A's gradient is zero, B's is not
            trained = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
        named = {n for n, p in model.named_parameters() if p.requires_grad}
        assert named and all(".lora_" in n for n in named)
        in_vision = {n for n in named if f".{language}." not in n}
        if tower == "frozen":  # the default: adapters on the language model's q, k, v, o projections alone
            assert not in_vision and trained and all(".lora_B." in n and f".{language}." in n for n in trained)
            assert {n.split(".")[-4] for n in named} == {"q_proj", "k_proj", "v_proj", "o_proj"}
        else:  # adapters on the tower's and projector's linear layers too, and they get gradients
            assert in_vision and any(p.grad is not None and p.grad.abs().sum() > 0
                                     for n, p in model.named_parameters() if n in in_vision and ".lora_B." in n)
        assert not any(p.requires_grad for n, p in model.named_parameters() if ".lora_" not in n)
    with pytest.raises(ConfigError, match="match no module of the language model"):
        wrap_lora(load_model(family_dirs[family]), LoraConfig(enabled=True, target_modules=["fc1"]))
    with pytest.raises(ValueError, match="vision_tower"):
        LoraConfig(enabled=True, vision_tower="full")
    with pytest.raises(ConfigError, match="model.lora.vision_tower: the model has no vision tower"):
        wrap_lora(load_model("tiny-base"), LoraConfig(enabled=True, vision_tower="lora"))


@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3"])
def test_rows_with_one_and_two_pictures_share_a_batch(family, family_dirs):
    """Zero padding (patches and grid rows; Idefics3's all-zero pictures) changes no row's log-probs."""
    from reinforge.learn.logprobs import token_logprobs

    model, processor = load_model(family_dirs[family]).eval(), load_processor(family_dirs[family])
    one, two = _tasks(2)
    two = dataclasses.replace(two, prompt="colour?", images=(one.images[0], two.images[0]))
    rows = [encode_vision_prompt(processor, t.prompt, t.images) for t in (one, two, one)]
    trajs = [Trajectory(ids + [9, 10], [0] * len(ids) + [1, 1], [0.0] * (len(ids) + 2), 0, i, f"t{i}",
                        model_inputs=inputs) for i, (ids, inputs) in enumerate(rows)]
    batch = Batch.from_trajectories(trajs, pad_id=0)
    with torch.no_grad():
        together, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, model_inputs=batch.model_inputs)
        for i, t in enumerate(trajs):
            alone = Batch.from_trajectories([t], pad_id=0)
            logp, _ = token_logprobs(model, alone.input_ids, alone.attention_mask, model_inputs=alone.model_inputs)
            n = len(t.token_ids)
            torch.testing.assert_close(together[i, :n], logp[0], rtol=0, atol=1e-5)


def test_a_family_with_one_pixel_row_per_picture_takes_one_picture(family_dirs):
    from reinforge.errors import ConfigError

    processor = load_processor(family_dirs["llava"])
    task = _tasks(1)[0]
    with pytest.raises(ConfigError, match="task 'x': the model's processor gives pixel_values of 2 rows"):
        encode_vision_prompt(processor, "colour?", (task.images[0], task.images[0]), "task 'x'")
