"""The LM head's log-probs and entropies at a real vocabulary: the plain path vs chunks of positions.

    python benchmarks/bench_lm_head.py [--vocab 151936] [--hidden 896] [--positions 4096]
                                       [--chunks 0,1024,256] [--repeats 3]

The head alone (Qwen2.5-0.5B's shape by default: H=896, V=151936, untied ``nn.Linear``), float32 on the
CPU, over ``--positions`` hidden states that require a gradient: forward (log-prob of a random target
and the entropy at every position) and backward of sum(logp) + 0.01 sum(entropy), as the learner's
loss would. Chunk 0 is the plain path (``train.logprob_chunk_tokens=0``: the head over every position
at once, then ``learn/logprobs._taken``); a chunk > 0 is ``learn/lm_head.chunked_token_logprobs``.

Every (setting, repeat) runs in a fresh subprocess (``--threads`` torch threads), the settings
interleaved within each repeat. Reported: median and range of the forward+backward time; "largest
alloc": the largest single tensor any op allocated (a ``TorchDispatchMode`` that sees every op,
the backward's recomputed chunks included; deterministic); peak RSS and "act" = peak RSS minus the
RSS just before the pass (``/proc/self/clear_refs``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from reinforge.models.precision import at_least_float32
from reinforge.learn.lm_head import chunked_token_logprobs
from reinforge.learn.logprobs import _taken
from reinforge.learn.memory import peak_mb, reset_peak

spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
V, H, P, chunk = spec["vocab"], spec["hidden"], spec["positions"], spec["chunk"]


class Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t._is_view():
                self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


g = torch.Generator().manual_seed(0)
head = torch.nn.Linear(H, V, bias=False)
with torch.no_grad():
    head.weight.normal_(0, 0.02, generator=g)
hidden = torch.randn(1, P, H, generator=g).requires_grad_()
ids = torch.randint(0, V, (1, P + 1), generator=g)
rss = lambda: next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
before = rss()
reset_peak()
t0 = time.perf_counter()
with Largest() as seen:
    if chunk == 0:
        logp, ent = _taken(at_least_float32(head(hidden)), ids, entropy=True, entropy_grad=True)
    else:
        logp, ent = chunked_token_logprobs(hidden, head, ids[:, 1:], 1.0, chunk, entropy=True, entropy_grad=True)
    (logp.sum() + 0.01 * ent.sum()).backward()
seconds = time.perf_counter() - t0
print("RESULT " + json.dumps({"s": seconds, "largest_mb": seen.bytes / 2**20, "peak_mb": peak_mb(),
                              "rss_before_mb": before, "logp_sum": float(logp.sum())}))
"""


def run(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"chunk={spec['chunk']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def spread(values: list[float], fmt: str) -> str:
    """median [min, max]"""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--positions", type=int, default=4096)
    p.add_argument("--chunks", default="0,1024,256", help="positions per chunk; 0 = the plain path")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    rows: dict[int, list[dict]] = {c: [] for c in chunks}
    for _ in range(args.repeats):  # interleaved: each repeat runs every setting once
        for c in chunks:
            rows[c].append(run({"vocab": args.vocab, "hidden": args.hidden, "positions": args.positions, "chunk": c,
                                "threads": args.threads}))
    print(f"{os.cpu_count()} CPU cores; {args.threads} torch threads; V={args.vocab}, H={args.hidden}, "
          f"{args.positions} positions, float32; {args.repeats} runs per setting, each in a fresh process; "
          "median [min, max]")
    print(f"plain float32 logits: {args.positions * args.vocab * 4 / 2**20:.0f} MiB")
    print("| setting | forward+backward s | vs plain | largest alloc MiB | peak RSS MiB | act MiB |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(r["s"] for r in rows[0 if 0 in rows else chunks[0]])
    for c in chunks:
        rs = rows[c]
        name = "plain" if c == 0 else f"chunk {c}"
        times = [r["s"] for r in rs]
        acts = [r["peak_mb"] - r["rss_before_mb"] for r in rs]
        print(f"| {name} | {spread(times, '.2f')} | {statistics.median(times) / base:.2f}x | "
              f"{rs[0]['largest_mb']:.0f} | {spread([r['peak_mb'] for r in rs], '.0f')} | {spread(acts, '.0f')} |",
              flush=True)


if __name__ == "__main__":
    main()
