"""The torch engine at a realistic size: a SmolLM2-135M-shaped Llama (random init, built here from a
LlamaConfig, no download) and the shipped demo size, with achieved GFLOP/s against a measured matmul peak.

    python benchmarks/bench_engine_scale.py [--size 135m|demo] [--repeats 3]
    python benchmarks/bench_engine_scale.py --profile            # torch.profiler's top ops of one generate
    python benchmarks/bench_engine_scale.py --peak               # fp32 matmul peak of the decode's shapes
    python benchmarks/bench_engine_scale.py --compare main       # this tree vs git ref `main`, interleaved

Settings: ``135m`` is vocab 49152, hidden 576, intermediate 1536, 9 query / 3 key-value heads, 30
layers, tied embeddings; 8 prompts x 8 samples, exactly 64 new tokens (EOS ignored). ``demo`` is the
shipped tiny-base on its own task, 16 prompts x 8 samples, <= 8 new tokens, stopping at EOS (one
training step of the default demo). Temperature 1, fp32, 2 threads.

``--compare REF`` runs one engine per process: a worker on this tree and a worker on ``REF`` (checked
out into a temporary git worktree and put first on the worker's ``sys.path``), each building the
same model once, then timed alternately (after a warm-up each), so machine load hits both alike.

FLOPs counted: 2 x (matmul parameters: every linear plus the lm_head, not the embedding lookup) per
processed token (prefill tokens once per prompt, plus every decoded token), plus 4 x layers x hidden
x context for the attention's two matmuls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # prompts, samples, max_new_tokens, ignore_eos
    "135m": (8, 8, 64, True),
    "demo": (16, 8, 8, False),
}
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build(size: str, new_tokens: int | None = None):  # type: ignore[no-untyped-def]
    """(model, tokenizer, requests, params) of a setting (``new_tokens`` overrides its max_new_tokens)."""
    from reinforge.data.arithmetic import arithmetic_splits
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.prompts import encode_prompt
    from reinforge.rollout.types import GenerationRequest, SamplingParams

    tok = load_tokenizer("tiny-base")
    if size == "demo":
        model = load_model("tiny-base").eval()
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).eval()
    prompts, samples, new, ignore_eos = SETTINGS[size]
    tasks = list(arithmetic_splits().heldout)[:prompts]
    reqs = [GenerationRequest(encode_prompt(tok, t.prompt), t.id) for t in tasks]
    return model, tok, reqs, SamplingParams(max_new_tokens=new_tokens or new, n=samples, ignore_eos=ignore_eos)


def flops(model, reqs, gens) -> float:  # type: ignore[no-untyped-def]
    """Matmul FLOPs of one generate: linears and lm_head over prefill and decoded tokens, plus attention."""
    cfg = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    prefill = sum(len(r.prompt_ids) for r in reqs)
    decoded = sum(len(g.token_ids) for g in gens)
    context = sum(len(g.prompt_ids) * len(g.token_ids) + len(g.token_ids) ** 2 / 2 for g in gens)
    prefill_ctx = sum(len(r.prompt_ids) ** 2 / 2 for r in reqs)
    return 2 * linear * (prefill + decoded) + 4 * cfg.num_hidden_layers * cfg.hidden_size * (context + prefill_ctx)


def matmul_peak(shapes: list[tuple[int, int, int]], repeats: int = 30) -> dict[str, float]:
    """GFLOP/s of torch.mm per (m, k, n) shape (weights stay in cache: the same operands every repeat)."""
    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            torch.mm(a, b)
        t0 = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n * repeats / (time.perf_counter() - t0) / 1e9
    return out


def decode_shapes(batch: int = 64) -> list[tuple[int, int, int]]:
    c = SMOLLM2_135M
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    qkv = h + 2 * c["num_key_value_heads"] * hd
    return [(1024, 1024, 1024), (batch, h, qkv), (batch, h, h), (batch, h, 2 * i), (batch, i, h),
            (batch, h, c["vocab_size"])]


def streaming_peak(batch: int = 64, repeats: int = 3) -> float:
    """GFLOP/s of the decode step's matmuls alone, in order, over all 30 layers' distinct weights
    (so the weights stream from memory as in the real step): the floor of any fp32 eager decode."""
    c = SMOLLM2_135M
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    qkv = h + 2 * c["num_key_value_heads"] * hd
    layers = [(torch.randn(h, qkv), torch.randn(h, h), torch.randn(h, 2 * i), torch.randn(i, h))
              for _ in range(c["num_hidden_layers"])]
    head = torch.randn(h, c["vocab_size"])
    x, xi = torch.randn(batch, h), torch.randn(batch, i)
    per_step = 2 * batch * (sum(w.numel() for ws in layers for w in ws) + head.numel())
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for wqkv, wo, wgu, wd in layers:
            torch.mm(x, wqkv), torch.mm(x, wo), torch.mm(x, wgu), torch.mm(xi, wd)
        torch.mm(x, head)
        times.append(time.perf_counter() - t0)
    return per_step / statistics.median(times[1:]) / 1e9


def time_generate(engine, reqs, params) -> tuple[float, list]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    gens = engine.generate(reqs, params)
    return time.perf_counter() - t0, gens


def worker(size: str, new_tokens: int | None) -> None:
    """Build one engine, then answer each stdin line with one timed generate as a JSON line."""
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    model, tok, reqs, params = build(size, new_tokens)
    engine = TorchRolloutEngine(model, tok, seed=0)
    time_generate(engine, reqs, params)  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        seconds, gens = time_generate(engine, reqs, params)
        print(json.dumps({"s": seconds, "tokens": sum(len(g.token_ids) for g in gens),
                          "flops": flops(model, reqs, gens)}), flush=True)


def spawn(size: str, code_root: Path, new_tokens: int | None, threads: int) -> subprocess.Popen:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--size", size, "--code-root", str(code_root),
           "--threads", str(threads)] + (["--new-tokens", str(new_tokens)] if new_tokens else [])
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["ready"]
    return proc


def run_interleaved(workers: dict[str, subprocess.Popen], repeats: int) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {name: [] for name in workers}
    for _ in range(repeats):
        for name, proc in workers.items():
            proc.stdin.write("run\n")
            proc.stdin.flush()
            results[name].append(json.loads(proc.stdout.readline()))
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()
    return results


def report(size: str, results: dict[str, list[dict]], peak: float, new_tokens: int | None) -> None:
    prompts, samples, new, _ = SETTINGS[size]
    new = new_tokens or new
    print(f"\n{size}: {prompts} prompts x {samples} samples, max_new_tokens {new}\n")
    print("| code | median s (min-max) | generated tok/s | GFLOP/s | of matmul peak |")
    print("|---|---|---|---|---|")
    first = None
    for name, runs in results.items():
        secs = [r["s"] for r in runs]
        med = statistics.median(secs)
        first = first or med
        gflops = runs[0]["flops"] / med / 1e9
        print(f"| {name} | {med:.3f} ({min(secs):.3f}-{max(secs):.3f}) | {runs[0]['tokens'] / med:,.0f} | "
              f"{gflops:.1f} | {gflops / peak:.0%} |")
    if len(results) == 2:
        (a, ra), (b, rb) = results.items()
        ratios = [x["s"] / y["s"] for x, y in zip(ra, rb, strict=True)]
        print(f"\nspeed of {b} vs {a}: median {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}x over paired repeats)")


def checkout(ref: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="reinforge-ref-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True,
                   capture_output=True)
    return path


def profile(size: str, rows: int, new_tokens: int | None) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from reinforge.rollout.torch_engine import TorchRolloutEngine

    model, tok, reqs, params = build(size, new_tokens)
    engine = TorchRolloutEngine(model, tok, seed=0)
    engine.generate(reqs, params)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        seconds, gens = time_generate(engine, reqs, params)
    print(f"\none generate under the profiler: {seconds:.2f} s, {sum(len(g.token_ids) for g in gens)} tokens\n")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SETTINGS), default="135m")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compare", metavar="REF", help="also time git ref REF, interleaved with this tree")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top ops of one generate")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--peak", action="store_true", help="only measure the fp32 matmul peak")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, help="override the setting's max_new_tokens (quicker runs)")
    p.add_argument("--code-root", default=str(ROOT), help="import reinforge from here (e.g. a worktree of REF)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.code_root)
    if args.worker:
        return worker(args.size, args.new_tokens)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    peak = matmul_peak([(1024, 1024, 1024)])["1024x1024x1024"]
    print(f"fp32 torch.mm peak (1024^3, operands in cache): {peak:.0f} GFLOP/s")
    if args.peak:
        peaks = matmul_peak(decode_shapes())
        print("fp32 torch.mm GFLOP/s by shape, operands in cache: " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()))
        print(f"the 135M decode step's matmuls alone (batch 64, weights streamed from memory): {streaming_peak():.0f} GFLOP/s")
        return None
    if args.profile:
        return profile(args.size, args.rows, args.new_tokens)
    workers = {}
    ref_path = None
    try:
        if args.compare:
            ref_path = checkout(args.compare)
            workers[args.compare] = spawn(args.size, ref_path, args.new_tokens, args.threads)
        workers["this tree"] = spawn(args.size, Path(args.code_root), args.new_tokens, args.threads)
        report(args.size, run_interleaved(workers, args.repeats), peak, args.new_tokens)
    finally:
        if ref_path is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref_path)], check=False)
    print(f"\n(GFLOP/s against the 1024^3 torch.mm peak of {peak:.0f} GFLOP/s measured in this run)")
    return None


if __name__ == "__main__":
    main()
