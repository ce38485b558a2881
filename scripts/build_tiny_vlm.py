"""Build reinforge's shipped tiny vision-language model from nothing: tokenizer, processor, model, pretraining.

    python scripts/build_tiny_vlm.py [--out reinforge/assets/tiny-vlm] [--seed 0] [--steps 60]

1. A character-level tokenizer (lowercase letters, digits, a little punctuation, ``<pad> <bos> <eos> <unk>``
   and ``<image>``) with a chat template that renders a message's image parts as ``<image>`` and its text
   parts as they are: ``<bos>`` + message contents, assistant turns closed by ``<eos>``. (tiny-base's
   tokenizer has no letters, so it is not reused; its chat template's shape is.)
2. A ``LlavaProcessor`` over a PIL CLIP image processor (32 x 32 pixels, no torchvision needed) that expands
   ``<image>`` into the 16 patch tokens of the vision tower.
3. A ``LlavaForConditionalGeneration``: a 2-layer CLIP vision tower (32 x 32 pictures, 8 x 8 patches), LLaVA's
   two-layer projector and a 2-layer Llama language model (tied embeddings), ~0.5M parameters.
4. Next-token pretraining of the answer *format* on the train splits of the built-in ``shapes`` task (every
   question it has: ``colour``, ``count``, ``shape``, ``box``, ``count_colour``, ``position``, ``digits``,
   ``bars``, ``geometry``, each row's question drawn with the ``SHARES`` weights; the task's defaults, so each
   question's 200 held-out scenes are never seen): after each picture and question, an answer of that question
   drawn at random as the task draws them (``shapes.random_answer``: a colour name, a count 1-4, a shape name, a
   box, a number, ``left``/``right``, a number of sides), independent of the picture. The model learns the format
   of each question's answers and nothing about which one the picture shows: it starts at chance, and only RL
   can teach it to look (docs/vision.md).
5. ``save_pretrained`` of model and processor, plus a model card with the command, seed, time and accuracies.

Reproducible: fixed seed, deterministic CPU kernels, 2 threads. Nothing is edited by hand afterwards.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from reinforge.data.shapes import CHANCE, SCENES, in_format, random_answer, shapes_splits
from reinforge.rollout.vision import encode_vision_prompt

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<image>"]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz +-=?.,")
IMAGE_SIZE, PATCH = 32, 8
MAX_ANSWER_TOKENS = 12  # the longest answer, a box (11 characters), and <eos>
# Each question's weight in a pretraining batch. Colour, which the default-suite learning test
# (tests/test_vision_rl.py) and vlm_colour start from, gets about as many rows (6/17: an expected 1,355 of 3,840)
# as when it was one of three questions: with 3/14 of the rows, 120 steps gave a colour policy that the test's
# 20 GRPO steps did not move (seed 0), and 240 steps one that rose by 0.07-0.22 in seeds 0-2, against 0.3-0.6
# before (docs/vision.md).
SHARES = {"colour": 6, "count": 3, "shape": 2, "box": 1, "count_colour": 1, "position": 1, "digits": 1, "bars": 1,
          "geometry": 1}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)


def build_processor() -> LlavaProcessor:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", padding_side="left", model_max_length=128,
                                  extra_special_tokens={"image_token": "<image>"})
    tok.chat_template = CHAT_TEMPLATE
    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                   image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=PATCH, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE, image_token="<image>")


def build_model(processor: LlavaProcessor) -> LlavaForConditionalGeneration:
    tok = processor.tokenizer
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=64)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                       tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="default", vision_feature_layer=-1, projector_hidden_act="gelu",
                         tie_word_embeddings=True)
    return LlavaForConditionalGeneration(config)


def encode(processor, task) -> tuple[list[int], torch.Tensor]:
    ids, inputs = encode_vision_prompt(processor, task.prompt, task.images, where=task.id)
    return ids, inputs["pixel_values"]


def train_batch(processor, tasks, answers: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded prompt + answer + <eos>, labels on the answer only."""
    tok = processor.tokenizer
    rows, pixels = [], []
    for t, answer in zip(tasks, answers, strict=True):
        ids, px = encode(processor, t)
        rows.append((ids, tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
        pixels.append(px)
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p): len(p) + len(a)] = torch.tensor(a)
        attn[i, : len(p) + len(a)] = 1
    return {"input_ids": ids, "attention_mask": attn, "labels": labels, "pixel_values": torch.cat(pixels)}


@torch.no_grad()
def heldout_accuracy(model, processor, tasks, blank: bool = False, sample: bool = False) -> tuple[float, float]:
    """Greedy (``sample``: temperature-1) accuracy and the share of answers in the question's format (one of its
    ``ANSWERS``); ``blank``: every picture replaced by the empty grey ground (a model that looks drops to about
    chance)."""
    model.eval()
    tok = processor.tokenizer
    encoded = [encode(processor, t) for t in tasks]
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(tasks), width), tok.pad_token_id)
    attn = torch.zeros((len(tasks), width), dtype=torch.long)
    for i, (row, _) in enumerate(encoded):
        ids[i, width - len(row):], attn[i, width - len(row):] = torch.tensor(row), 1
    pixels = torch.cat([px for _, px in encoded])
    if blank:
        pixels = torch.zeros_like(pixels)  # the grey ground normalises to 0 (mean 0.5, std 0.5)
    out = model.generate(input_ids=ids, attention_mask=attn, pixel_values=pixels, max_new_tokens=MAX_ANSWER_TOKENS,
                         do_sample=sample,
                         top_k=None, top_p=None, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    texts = [text.strip() for text in tok.batch_decode(out[:, width:], skip_special_tokens=True)]
    model.train()
    right = sum(text == t.answer for text, t in zip(texts, tasks, strict=True)) / len(tasks)
    return right, sum(in_format(t.metadata["question"], text) for text, t in zip(texts, tasks, strict=True)) / len(tasks)


def random_format_batch(splits, batch: int, gen: torch.Generator, rng: np.random.Generator) -> tuple[list, list[str]]:
    """``batch`` train tasks, each of a question drawn with the ``SHARES`` weights, each with an answer of that
    question drawn as the task draws them (``random_answer``), independent of the picture (the format, not the
    content)."""
    questions = list(splits)
    weights = torch.tensor([float(SHARES[q]) for q in questions])
    tasks, answers = [], []
    for q in torch.multinomial(weights, batch, replacement=True, generator=gen).tolist():
        split = splits[questions[q]]
        tasks.append(split.train[int(torch.randint(len(split.train), (1,), generator=gen))])
        answers.append(random_answer(questions[q], rng))
    return tasks, answers


def measure(model, processor, heldout) -> dict[str, float]:
    """Held-out greedy and temperature-1 accuracy (and format share), greedy with blank pictures, chance."""
    acc, fmt = heldout_accuracy(model, processor, heldout)
    sampled, sampled_fmt = heldout_accuracy(model, processor, heldout, sample=True)
    blank, _ = heldout_accuracy(model, processor, heldout, blank=True)
    chance = CHANCE.get(heldout[0].metadata["question"])  # box: none, a box is graded by its overlap
    return {"greedy_accuracy": round(acc, 4), "greedy_format": round(fmt, 4), "sampled_accuracy": round(sampled, 4),
            "sampled_format": round(sampled_fmt, 4), "blank_greedy_accuracy": round(blank, 4),
            "chance": None if chance is None else round(chance, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "reinforge/assets/tiny-vlm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=120, help="pretraining steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    start = time.time()
    processor = build_processor()
    model = build_model(processor)
    n_params = sum(p.numel() for p in model.parameters())
    questions = list(SCENES)  # every question of the built-in task, its defaults: 32 x 32, 200 held out, seed 1234
    splits = {q: shapes_splits(q) for q in questions}
    gen, rng = torch.Generator().manual_seed(args.seed), np.random.default_rng(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    print(f"tiny-vlm: {n_params / 1e6:.2f}M parameters, vocab {len(processor.tokenizer)}")
    for step in range(1, args.steps + 1):
        tasks, answers = random_format_batch(splits, args.batch, gen, rng)
        loss = model(**train_batch(processor, tasks, answers)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}", flush=True)
    measured = {q: measure(model, processor, list(splits[q].heldout)) for q in questions}
    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    stats = {
        "command": "python scripts/build_tiny_vlm.py " + " ".join(sys.argv[1:]),
        "seed": args.seed, "parameters": n_params, "pretraining_steps": args.steps, "batch_size": args.batch,
        "learning_rate": args.lr, "question_shares": SHARES, "build_seconds": round(time.time() - start, 1),
        "heldout": measured,
        "torch": torch.__version__,
    }
    (args.out / "build_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    rows = "\n".join(ROW.format(question=q, **{**m, "chance": "-" if m["chance"] is None else m["chance"]})
                     for q, m in measured.items())
    shares = ", ".join(f"`{q}` {w}/{sum(SHARES.values())}" for q, w in SHARES.items())
    (args.out / "README.md").write_text(MODEL_CARD.format(rows=rows, shares=shares, **stats))
    print(json.dumps(stats, indent=2))


MODEL_CARD = """# tiny-vlm

reinforge's shipped vision-language model, written by `scripts/build_tiny_vlm.py` (do not edit by hand).

- Architecture: LLaVA (`LlavaForConditionalGeneration`): a CLIP vision tower (2 layers, hidden 64, 32 x 32
  pictures in 8 x 8 patches: 16 image tokens), LLaVA's two-layer projector, a Llama language model (2 layers,
  hidden 128, 4 heads, tied embeddings); {parameters} parameters. Loads with `AutoModelForImageTextToText` and
  `AutoProcessor`; the processor's image processor is the PIL one (no torchvision needed).
- Tokenizer: character level (lowercase letters, digits, `+ - = ? . ,`, space) with
  `<pad> <bos> <eos> <unk> <image>` and a chat template: `<bos>` + message contents (image parts as `<image>`,
  which the processor expands to the 16 patch tokens), each assistant turn closed by `<eos>`.
- Pretraining: the answer *format* only. Next-token loss on an answer after the picture and question, on the
  train splits of the built-in `shapes` task (every question, its share of the rows: {shares}; 32 x 32
  pictures; each question's 200 held-out scenes are never seen), the answer drawn at random as the task draws
  that question's answers (`shapes.random_answer`), independent of the picture: the model learns to answer in
  each question's format and nothing about which answer the picture shows. It starts at about chance; RL
  teaches it to look (docs/vision.md).

| | |
|---|---|
| command | `{command}` |
| seed | {seed} |
| pretraining steps (batch {batch_size}, lr {learning_rate}) | {pretraining_steps} |
| build time on 2 shared CPU cores | {build_seconds} s |
| torch | {torch} |

Held-out (200 scenes per question): greedy accuracy, the share of greedy answers in the question's format
(`shapes.in_format`: one of its answers; box: `x1,y1,x2,y2`), temperature-1 accuracy and format share, greedy
accuracy with every picture blank, chance (`shapes.CHANCE`; box is graded by overlap, exact-match accuracy shown):

| question | greedy | greedy format | temperature 1 | temperature-1 format | blank pictures | chance |
|---|---|---|---|---|---|---|
{rows}
"""

ROW = ("| `{question}` | {greedy_accuracy} | {greedy_format} | {sampled_accuracy} | {sampled_format} | "
       "{blank_greedy_accuracy} | {chance} |")

if __name__ == "__main__":
    main()
