"""Learner memory and step time vs sequence length and batch, with and without each memory switch.

    python benchmarks/bench_memory.py [--models tiny,30m] [--repeats 2] [--quick]

For each model, length L and batch B: a synthetic rollout batch of B sequences in groups of 8
(a 32-token prompt shared by the group, completions of uniform random length in [L/4, L - 32],
rewards spread within every group), then ``Learner.update`` (forward, backward, AdamW step; no
reference model) under each setting:

- ``default``: padded micro-batches, shared-prefix forward (the default recipe);
- ``plain``: padded micro-batches, the HF forward (shared prefix off);
- ``packing``: ``train.packing`` (sequences packed end to end, dynamic micro-batches);
- ``ckpt``: ``train.gradient_checkpointing`` (with the default shared-prefix forward);
- ``bf16``: ``train.autocast=bf16``;
- ``all``: packing + checkpointing + bf16.

Every (model, L, B, setting) runs in a fresh subprocess (2 torch threads): one warm-up update,
then the peak RSS window is reset (``/proc/self/clear_refs``) and ``--repeats`` updates are timed.
"peak" is the process's peak resident set during those updates; "act" is peak minus the RSS just
before them (activations, gradients and temporaries; weights and the optimizer state are already
resident after the warm-up). Settings are interleaved per (model, L, B); ratios are against
``default`` in the same run. Models: ``tiny`` = the shipped tiny-base (2.4M parameters;
pretrained at context 64, run here at up to 256: rotary positions have no hard limit); ``30m`` = a Llama config built here (hidden 512, 8 layers, vocab 8192: 29.4M).
``micro_batch_tokens`` is 4096 for every setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SETTINGS = {
    "default": [],
    "plain": ["train.shared_prefix=false"],
    "packing": ["train.packing=true"],
    "ckpt": ["train.gradient_checkpointing=true"],
    "bf16": ["train.autocast=bf16"],
    "all": ["train.packing=true", "train.gradient_checkpointing=true", "train.autocast=bf16"],
}

CHILD = r"""
import json, random, statistics, sys, tempfile, time
import torch
from reinforge.config import load_config
from reinforge.learn.learner import Learner
from reinforge.learn.memory import peak_mb, reset_peak
from reinforge.types import Batch, Trajectory

spec = json.loads(sys.argv[1])
torch.set_num_threads(2)
torch.manual_seed(0)
if spec["model"] == "tiny":
    from reinforge.models.loading import load_model
    model = load_model("tiny-base")
else:
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024,
                                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0))
vocab = model.config.vocab_size
L, B, prompt = spec["length"], spec["batch"], 32
rng = random.Random(0)
trajs = []
for g in range(B // 8):
    p = [1] + [rng.randrange(3, vocab) for _ in range(prompt - 1)]
    for j in range(8):
        n = rng.randint(L // 4, L - prompt)
        ids = p + [rng.randrange(3, vocab) for _ in range(n)]
        trajs.append(Trajectory(ids, [0] * prompt + [1] * n, [0.0] * prompt + [-2.0] * n, version=0, group_id=g,
                                task_id=str(g), reward=float(j % 3)))
cfg = load_config(None, ["algo.kl.coef=0", "train.micro_batch_tokens=4096", "rollout.group_size=8",
                         f"rollout.max_new_tokens={L}", *spec["overrides"]])
learner = Learner.for_run(model, cfg)
batch = Batch.from_trajectories(trajs, 0)
learner.update(batch.select(list(range(B))))  # warm-up: optimizer state allocated, kernels chosen
rss_before = next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
reset_peak()
times = []
for _ in range(spec["repeats"]):
    t0 = time.perf_counter()
    learner.update(batch.select(list(range(B))))
    times.append(time.perf_counter() - t0)
print("RESULT " + json.dumps({"step_s": statistics.median(times), "peak_mb": peak_mb(), "rss_before_mb": rss_before,
                              "real_tokens": int(batch.attention_mask.sum()), "padded_tokens": batch.input_ids.numel()}))
"""


def run(model: str, length: int, batch: int, setting: str, repeats: int) -> dict:
    spec = {"model": model, "length": length, "batch": batch, "overrides": SETTINGS[setting], "repeats": repeats}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{model} L={length} B={batch} {setting} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,30m")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--shapes", default="", help="only these shapes, e.g. tiny:256x64,30m:256x16 (model:LxB)")
    p.add_argument("--quick", action="store_true", help="one tiny shape, two settings (a smoke test)")
    args = p.parse_args()
    grid = {"tiny": [(128, 16), (256, 16), (256, 64)], "30m": [(256, 16), (512, 16)]}
    if args.shapes:
        grid = {}
        for item in args.shapes.split(","):
            model, shape = item.split(":")
            grid.setdefault(model, []).append(tuple(int(v) for v in shape.split("x")))
        args.models = ",".join(grid)
    settings = args.settings.split(",")
    if args.quick:
        grid, settings, args.models = {"tiny": [(64, 8)]}, ["default", "all"], "tiny"
    print(f"{os.cpu_count()} CPU cores; 2 torch threads; micro_batch_tokens 4096; {args.repeats} timed updates "
          "(median) after one warm-up; peak RSS and act = peak - RSS before the timed updates")
    print("| model | L | B | real/padded tokens | setting | step s | vs default | peak RSS MB | act MB | act vs default |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for length, batch in grid[model]:
            rows = {s: run(model, length, batch, s, args.repeats) for s in settings}
            base = rows.get("default") or next(iter(rows.values()))
            base_act = max(base["peak_mb"] - base["rss_before_mb"], 1e-9)
            for s, r in rows.items():
                act = r["peak_mb"] - r["rss_before_mb"]
                print(f"| {model} | {length} | {batch} | {r['real_tokens']}/{r['padded_tokens']} | {s} | "
                      f"{r['step_s']:.3f} | {r['step_s'] / base['step_s']:.2f}x | {r['peak_mb']:.0f} | {act:.0f} | "
                      f"{act / base_act:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
