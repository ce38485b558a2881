"""Pictures through the loop (docs/vision.md): the shipped tiny-vlm and its processor, the shapes task, bad
images, the batch record's ``model_inputs``, the learner's log-probs against a direct HF forward, a GRPO run."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from reinforge.config import load_config, task_config
from reinforge.data.shapes import CHANCE, COLOURS, GROUND, shapes_splits
from reinforge.data.sources import build_task_splits
from reinforge.errors import ConfigError
from reinforge.learn.forwards import PackedForward, PlainForward
from reinforge.models.loading import load_model, load_processor, load_tokenizer
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.rollout.vision import MAX_PIXELS, encode_vision_prompt, read_image, with_image_parts
from reinforge.types import Batch, Trajectory

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def vlm():
    return load_model("tiny-vlm").eval(), load_processor("tiny-vlm")


@pytest.mark.slow  # a fresh interpreter importing transformers: about 10 s
def test_tiny_vlm_processor_builds_offline_without_torchvision():
    blocked = ("import sys; sys.modules['torchvision'] = None  # an import of it fails\n"
               "from reinforge.models.loading import load_processor\n"
               "print(type(load_processor('tiny-vlm')).__name__)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "LlavaProcessor"


def test_tiny_vlm_and_its_processor_encode_a_shapes_prompt(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    processor = load_processor("tiny-vlm")
    assert type(processor.image_processor).__name__.endswith("Pil")  # the PIL image processor, not torchvision's
    assert load_processor("tiny-base") is None  # a text model has none
    task = shapes_splits().train[0]
    ids, inputs = encode_vision_prompt(processor, task.prompt, task.images)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert ids.count(image_token) == 16  # 32 x 32 pixels in 8 x 8 patches
    assert ids[0] == processor.tokenizer.bos_token_id and processor.tokenizer.decode(ids[-7:]) == "colour?"
    assert set(inputs) == {"pixel_values"} and inputs["pixel_values"].shape == (1, 3, 32, 32)
    assert type(load_model("tiny-vlm")).__name__ == "LlavaForConditionalGeneration"


def test_shapes_task_answer_is_in_the_picture_only():
    splits = build_task_splits(task_config({"kind": "shapes"}))
    assert CHANCE == {"colour": 0.25, "count": 0.25, "shape": pytest.approx(1 / 3), "count_colour": 0.25,
                      "position": 0.25, "digits": pytest.approx(1 / 180), "bars": 0.5, "geometry": 0.25}
    train_ids, held_ids = {t.id for t in splits.train[:2000]}, {t.id for t in splits.heldout}
    assert len(held_ids) == 200 and not train_ids & held_ids
    tasks = splits.heldout[:40]
    assert {t.answer for t in tasks} == set(COLOURS) and {t.prompt[0]["content"][1]["text"] for t in tasks} == {"colour?"}
    for t in tasks:  # the one colour besides the ground is the answer's
        pixels = {tuple(int(c) for c in px) for px in np.asarray(t.images[0]).reshape(-1, 3)} - {GROUND}
        assert pixels == {COLOURS[t.answer]}, t.id
    again = shapes_splits().heldout[3]
    assert again.images[0].tobytes() == tasks[3].images[0].tobytes()  # drawn from the index alone
    counts = shapes_splits("count").train[:20]
    assert {t.answer for t in counts} == {"1", "2", "3", "4"} and all(t.prompt[0]["content"][1]["text"] == "count?"
                                                                      for t in counts)
    with pytest.raises(ValueError, match="question must be one of"):
        shapes_splits("size")
    with pytest.raises(ValueError, match="image_size"):
        task_config({"kind": "shapes", "image_size": 8})


def test_bad_images_are_errors_naming_the_row_and_column(tmp_path):
    where = "row 7, column 'image'"
    with pytest.raises(ConfigError, match="row 7, column 'image': unreadable image"):
        read_image(b"not a png", where)
    with pytest.raises(ConfigError, match="row 7, column 'image': image file .*missing.png.* does not exist"):
        read_image("missing.png", where, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="PIL image, a file path or encoded bytes, not int"):
        read_image(3, where)
    big = PIL.new("L", (4097, 4096))
    with pytest.raises(ConfigError, match=f"4097 x 4096 pixels is larger than the limit of {MAX_PIXELS}"):
        read_image(big, where)
    buf = io.BytesIO()
    PIL.new("RGBA", (5, 4), (1, 2, 3, 4)).save(buf, format="PNG")
    (tmp_path / "ok.png").write_bytes(buf.getvalue())
    for source in (buf.getvalue(), "ok.png", PIL.new("L", (5, 4))):  # bytes, a relative path, another mode
        image = read_image(source, where, base_dir=tmp_path)
        assert image.mode == "RGB" and image.size == (5, 4)
    with pytest.raises(ConfigError, match="has images but the model has no image processor"):
        encode_vision_prompt(None, "x", (image,), "task 't1'")


def test_table_image_column_reads_paths_bytes_and_datasets_cells(tmp_path):
    from reinforge.config import ColumnsConfig
    from reinforge.data.columns import rows_to_tasks
    from reinforge.data.tabular import pictures_fingerprint
    from reinforge.errors import DataError

    (tmp_path / "pics").mkdir()
    red, blue = PIL.new("RGB", (8, 8), (255, 0, 0)), PIL.new("P", (8, 8))
    red.save(tmp_path / "pics" / "red.png")
    buf = io.BytesIO()
    blue.save(buf, format="PNG")
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "colour?", "answer": "red", "image": "pics/red.png"}\n'
                    '{"prompt": "colour?", "answer": "red", "image": ["pics/red.png", "pics/red.png"]}\n')
    splits = build_task_splits(task_config({"kind": "jsonl", "path": str(data), "heldout_size": 1,
                                            "columns": {"images": "image"}}))
    tasks = [*splits.train, *splits.heldout]
    assert sorted(len(t.images) for t in tasks) == [1, 2] and all("image" not in t.metadata for t in tasks)
    assert tasks[0].images[0].tobytes() == red.tobytes()
    cols = ColumnsConfig(images="image")
    row = {"prompt": "q", "answer": "a"}
    cells = rows_to_tasks([("d:0", "d:0", {**row, "image": {"bytes": buf.getvalue(), "path": None}}),
                           ("d:1", "d:1", {**row, "image": red})], cols, "d")
    assert [t.images[0].mode for t in cells] == ["RGB", "RGB"]
    assert pictures_fingerprint(cells[0].images) != pictures_fingerprint(cells[1].images)  # same question, two prompts
    assert pictures_fingerprint(()) == ""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q", "answer": "a", "image": "pics/red.png"}\n'
                   '{"prompt": "q", "answer": "a", "image": "pics/none.png"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: column 'image': image file .*none.png.* does not exist"):
        build_task_splits(task_config({"kind": "jsonl", "path": str(bad), "columns": {"images": "image"}}))
    (tmp_path / "pics" / "junk.png").write_bytes(b"junk")
    bad.write_text('{"prompt": "q", "answer": "a", "image": ["pics/red.png", "pics/junk.png"]}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: column 'image', image 1: unreadable image"):
        build_task_splits(task_config({"kind": "jsonl", "path": str(bad), "columns": {"images": "image"}}))
    with pytest.raises(DataError, match=r"d:0: column 'image' \(images\) is empty"):
        rows_to_tasks([("d:0", "d:0", {**row, "image": []})], cols, "d")


def test_evaluation_requests_carry_the_pictures_or_refuse():
    from reinforge.eval.heldout import build_requests

    tasks = shapes_splits().heldout[:2]
    processor = load_processor("tiny-vlm")
    reqs = build_requests(tasks, processor.tokenizer, None, processor)
    assert [r.model_inputs["pixel_values"].shape for r in reqs] == [(1, 3, 32, 32)] * 2
    assert all(r.prompt_ids.count(processor.tokenizer.convert_tokens_to_ids("<image>")) == 16 for r in reqs)
    with pytest.raises(ConfigError, match="has images but the model has no image processor"):
        build_requests(tasks, processor.tokenizer, None)  # a picture is never dropped silently


def test_paths_without_pictures_refuse_tasks_that_have_them():
    from reinforge.orchestrate.multi_turn import _start

    tasks = shapes_splits().heldout[:1]
    with pytest.raises(ConfigError, match=r"task 'shapes-colour-\d+' has images, but multi-turn episodes cannot"):
        _start(tasks, None, 1, 0, None, None)  # type: ignore[arg-type]


def test_image_parts_are_placed_before_the_first_user_text():
    msgs = with_image_parts([{"role": "system", "content": "s"}, {"role": "user", "content": "q?"}], 2)
    assert msgs[1]["content"] == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "q?"}]
    given = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q"}]}]
    assert with_image_parts(given, 1) == given
    with pytest.raises(ConfigError, match="1 image parts but the task has 2 images"):
        with_image_parts(given, 2)


def _traj(ids, prompt, pixels, group=0):
    return Trajectory(token_ids=ids, loss_mask=[0] * prompt + [1] * (len(ids) - prompt),
                      logprobs=[0.0] * len(ids), version=0, group_id=group, task_id=f"t{group}",
                      model_inputs={"pixel_values": pixels} if pixels is not None else {})


def test_batch_record_carries_pixel_values_row_by_row():
    px = [torch.full((1, 3, 4, 4), float(i)) for i in range(3)]
    trajs = [_traj([1, 2, 3], 2, px[0], 0), _traj([1, 2, 3, 4, 5], 2, px[1], 1), _traj([1, 5], 1, px[2], 2)]
    batch = Batch.from_trajectories(trajs, pad_id=0)
    assert batch.model_inputs["pixel_values"].shape == (3, 3, 4, 4)
    sub = batch.select([2, 0])  # micro-batches: rows only, the picture dimensions untouched
    assert sub.input_ids.shape == (2, 3) and sub.model_inputs["pixel_values"].shape == (2, 3, 4, 4)
    assert sub.model_inputs["pixel_values"][:, 0, 0, 0].tolist() == [2.0, 0.0]
    two = _traj([1, 2, 3], 2, torch.zeros(2, 3, 4, 4), 3)  # a row showing two pictures cannot be indexed by row
    with pytest.raises(ValueError, match="task 't3': a batch row shows one picture; this row shows several"):
        Batch.from_trajectories([*trajs, two], pad_id=0)
    assert sub.to("cpu") is sub and Batch.from_trajectories(trajs[:1], 0).to("meta").model_inputs[
        "pixel_values"].device.type == "meta"
    assert Batch.from_trajectories([_traj([1, 2], 1, None)], 0).model_inputs == {}  # text rows: nothing
    with pytest.raises(ValueError, match="pictures in every row or in none"):
        Batch.from_trajectories([trajs[0], _traj([1, 2], 1, None, 5)], pad_id=0)


def test_packing_refuses_pictures_with_a_clear_error():
    batch = Batch.from_trajectories([_traj([1, 2, 3], 2, torch.zeros(1, 3, 4, 4))], pad_id=0)
    with pytest.raises(ConfigError, match="train.packing cannot carry pictures.*pixel_values"):
        PackedForward.logprobs(None, None, batch, 1.0, False)  # type: ignore[arg-type]


@pytest.mark.numerics
def test_vlm_logprobs_equal_a_direct_hf_forward_and_the_engine(vlm):
    from reinforge.rollout.torch_engine import TorchRolloutEngine, image_token_id

    model, processor = vlm
    engine = TorchRolloutEngine(model, load_tokenizer("tiny-vlm"), seed=3)
    engine.processor = processor
    tasks = shapes_splits().heldout[:2]
    reqs = []
    for t in tasks:
        ids, inputs = encode_vision_prompt(processor, t.prompt, t.images)
        reqs.append(GenerationRequest(ids, t.id, inputs))
    gens = engine.generate(reqs, SamplingParams(max_new_tokens=6, temperature=1.0, n=2))
    for g in gens:
        g.model_inputs = reqs[[r.request_id for r in reqs].index(g.request_id)].model_inputs
    trajs = [_traj(g.prompt_ids + g.token_ids, len(g.prompt_ids), g.model_inputs["pixel_values"], i // 2)
             for i, g in enumerate(gens)]
    for t, g in zip(trajs, gens, strict=True):
        t.logprobs = [0.0] * len(g.prompt_ids) + g.logprobs
    batch = Batch.from_trajectories(trajs, pad_id=engine.pad_id)
    cfg = type("T", (), {"logprob_chunk_tokens": 0})()
    logp, _ = PlainForward(model, model, cfg).logprobs(model, batch, 1.0, False)
    with torch.no_grad():
        for i, t in enumerate(trajs):  # each row alone, unpadded, straight through transformers
            ids = torch.tensor([t.token_ids])
            logits = model(input_ids=ids, pixel_values=t.model_inputs["pixel_values"]).logits[0, :-1]
            direct = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            n, p = len(t.token_ids), t.loss_mask.index(1)
            torch.testing.assert_close(logp[i, 1:n], direct, rtol=0, atol=1e-5)
            # the engine samples with the image placeholder banned: its log-probs are the same logits' softmax
            # without that token
            banned = logits.index_fill(-1, torch.tensor([image_token_id(model)]), float("-inf"))
            sampled = torch.log_softmax(banned.float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(t.logprobs[p:]), sampled[p - 1:], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_grpo_trains_the_tiny_vlm_on_the_shapes_task(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config(None, [
        f"output_dir={tmp_path}", "model.path=tiny-vlm", "task.kind=shapes", "task.heldout_size=16",
        "train.steps=2", "eval.every=0", "eval.final_samples=0", "checkpoint.every=2", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_new_tokens=8", "train.time_limit_s=0", "log.report=false",
        "algo.kl.coef=0.01", "train.epochs=2",  # the reference's and pi_old's passes take the pictures too
    ])
    result = train(cfg)
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2 and all(0.0 <= m["reward/mean"] <= 1.0 for m in rows)
    assert all(torch.isfinite(torch.tensor(m["loss/total"])) for m in rows if "loss/total" in m)
    ckpt = result.run_dir / "checkpoints" / "step_2"
    assert (ckpt / "processor_config.json").is_file()  # a checkpoint reloads as a vision-language model
    assert type(load_processor(str(ckpt))).__name__ == "LlavaProcessor"


@pytest.mark.learning
def test_grpo_raises_tiny_vlm_accuracy_and_it_reads_the_picture(tmp_path):
    """The ``vlm_colour`` recipe (seed 0): held-out greedy accuracy rises from tiny-vlm's, and falls to about
    chance when the pictures are blank or shuffled among the rows (docs/vision.md has the runs' numbers)."""
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = load_config("vlm_colour", [f"output_dir={tmp_path}", "train.time_limit_s=0", "log.report=false"])
    result = train(cfg)
    evals = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "eval/heldout_acc" in m]
    before, after = evals[0]["eval/heldout_acc"], evals[-1]["eval/heldout_acc"]
    assert before <= CHANCE["colour"] + 0.1 and after >= before + 0.4 and after >= 0.65, evals
    for ablation in ("eval/heldout_acc_blank", "eval/heldout_acc_shuffled"):
        assert evals[-1][ablation] <= CHANCE["colour"] + 0.1 < after - 0.3, (ablation, evals[-1])


def test_export_of_a_lora_vlm_checkpoint_is_a_vlm_with_its_processor(tmp_path):
    """`reinforge export` of a LoRA run over tiny-vlm: the merged model loads as the VLM class with its processor
    (AutoProcessor), and its forward with a picture equals the peft policy's."""
    from typer.testing import CliRunner

    from reinforge.cli import app
    from reinforge.config import LoraConfig
    from reinforge.learn.checkpoint import save_checkpoint
    from reinforge.learn.lora import wrap_lora

    policy = wrap_lora(load_model("tiny-vlm"), LoraConfig(enabled=True, r=4, alpha=8), seed=0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    processor = load_processor("tiny-vlm")
    save_checkpoint(tmp_path / "run", 2, policy, processor, {}, torch.Generator(), {}, keep=1)
    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0 and "AutoModelForImageTextToText" in result.output, result.output
    merged, reloaded_processor = load_model(str(tmp_path / "hf")), load_processor(str(tmp_path / "hf"))
    assert type(merged).__name__ == "LlavaForConditionalGeneration" and reloaded_processor is not None
    task = shapes_splits(heldout_size=1).heldout[0]
    ids, inputs = encode_vision_prompt(reloaded_processor, task.prompt, task.images)
    with torch.no_grad():
        ours = merged(input_ids=torch.tensor([ids]), **inputs).logits
        expected = policy(input_ids=torch.tensor([ids]), **inputs).logits
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
