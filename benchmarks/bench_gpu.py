"""GPU benchmarks of the device check (scripts/device_check.py), each runnable on its own:

    python benchmarks/bench_gpu.py limits    [--device cuda] [--quick] [--json out.json]
    python benchmarks/bench_gpu.py generate  [--shape qwen2.5-0.5b] [--budget-s 60]
    python benchmarks/bench_gpu.py learner   [--shape qwen2.5-0.5b] [--budget-s 60]
    python benchmarks/bench_gpu.py grpo_step [--shape qwen2.5-0.5b] [--budget-s 60]
    python benchmarks/bench_gpu.py recipe    [--budget-s 90]

- ``limits``: the physical limits the other figures are compared to: the measured bf16 (fp32 on a CPU)
  matmul peak in TFLOP/s and the device-to-device copy bandwidth in GB/s (read + write).
- ``generate``: the torch engine's tokens/s against HF ``generate`` in the same process, interleaved
  repeats, 64 prompts x 8 samples x 256 new tokens (``ignore_eos``), and the fraction of the
  memory-bandwidth limit its decode reached (every decode step reads the weights once and each row's
  KV cache).
- ``learner``: a GRPO update on 512 sequences x 512 tokens (bf16 autocast, fp32 master weights):
  preparation (old log-probs) and update timed apart, tokens/s, MFU = model FLOPs (6 x parameters x
  tokens + attention) over the matmul peak measured in the same process, peak memory, and the largest
  micro-batch (tokens per forward/backward) that fits, found by doubling.
- ``grpo_step``: one end-to-end step of the training loop at the shape (a model directory written with
  random weights and the shipped tokenizer), split into generation, reward and learner time.
- ``recipe``: the default recipe on the shipped tiny model: wall-clock to held-out greedy 0.9.

Models in the real shapes come from ``benchmarks/configs/<shape>.json`` with random weights;
``--quick`` shrinks every size (hidden 64, 2 layers, vocabulary 4,096) so that the same code runs on
a CPU in seconds. Each benchmark stops adding repeats when its ``--budget-s`` is spent, and rewrites
its ``--json`` after every measurement, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "configs"
QUICK_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 4096, "max_window_layers": 2, "bos_token_id": 1,
               "eos_token_id": 2}


class Record:
    """The figures of one benchmark, rewritten to ``path`` (JSON) after every ``set``."""

    def __init__(self, path: Path | None, name: str) -> None:
        self.path, self.figures = path, {"benchmark": name}

    def set(self, **figures: Any) -> None:
        self.figures.update(figures)
        outside = memory_outside_torch_mb()
        if outside is not None:  # another allocator in this process (JAX's preallocation, say) or another process
            self.figures.update(gpu_mb_outside_torch=outside, jax_loaded="jax" in sys.modules)
        if self.path is not None:
            self.path.write_text(json.dumps(self.figures, indent=1, default=str))


def memory_outside_torch_mb() -> int | None:
    """GPU memory in use that torch's caching allocator did not reserve (None without CUDA)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    free, total = torch.cuda.mem_get_info()
    return int((total - free - torch.cuda.memory_reserved()) / 2**20)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def shape_config(shape: str, quick: bool):
    """The HF config of ``benchmarks/configs/<shape>.json`` (shrunk with ``quick``)."""
    from transformers import AutoConfig

    raw = json.loads((CONFIGS / f"{shape}.json").read_text())
    if quick:
        raw.update(QUICK_SHAPE)
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def random_model(shape: str, quick: bool, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(shape, quick), dtype=dtype)
    return model.eval()


def matmul_peak(device: torch.device, quick: bool) -> dict[str, float]:
    """Best-of TFLOP/s of square matmuls (bf16 on CUDA, fp32 on a CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n, reps = (8192, 20) if device.type == "cuda" and not quick else (512, 5)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b
    best = min(timed(lambda: [a @ b for _ in range(reps)], device)[0] for _ in range(3))
    return {"matmul_dtype": str(dtype).removeprefix("torch."), "matmul_n": n,
            "matmul_peak_tflops": 2 * n**3 * reps / best / 1e12}


def copy_bandwidth(device: torch.device, quick: bool) -> dict[str, float]:
    """Device-to-device copy bandwidth, counting the bytes read and written."""
    nbytes = 2**30 if device.type == "cuda" and not quick else 2**24
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(timed(lambda: [dst.copy_(src) for _ in range(5)], device)[0] for _ in range(3))
    return {"copy_bytes": nbytes, "copy_bandwidth_gbs": 2 * nbytes * 5 / best / 1e9}


def bench_limits(args, rec: Record) -> None:
    device = torch.device(args.device)
    rec.set(**matmul_peak(device, args.quick))
    rec.set(**copy_bandwidth(device, args.quick))


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(100 if vocab > 1000 else 3, vocab - 1, (n, length), generator=g).tolist()


def _hf_generate(model, prompts: list[list[int]], n: int, new: int, device: torch.device) -> int:
    ids = torch.tensor(prompts, device=device)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=new,
                         min_new_tokens=new, num_return_sequences=n, pad_token_id=0, top_k=0, top_p=1.0)
    return int(out.shape[0] * (out.shape[1] - ids.shape[1]))


def decode_limit_tokens_per_s(cfg, rows: int, context: float, param_bytes: int, bandwidth_gbs: float) -> float:
    """tokens/s if every decode step only read the weights once and each row's KV cache at ``context``
    tokens, at ``bandwidth_gbs`` (read bytes only; the copy figure counts read + write, hence / 2 there)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = rows * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * context * 2
    return rows * bandwidth_gbs * 1e9 / (param_bytes + kv_bytes)


def bench_generate(args, rec: Record) -> None:
    from reinforge.models.loading import load_tokenizer
    from reinforge.rollout.torch_engine import TorchRolloutEngine
    from reinforge.rollout.types import GenerationRequest, SamplingParams

    device, t_end = torch.device(args.device), time.monotonic() + args.budget_s
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n_prompts, n, new, plen = (4, 2, 16, 16) if args.quick else (64, 8, 256, 64)
    model = random_model(args.shape, args.quick, dtype, device)
    engine = TorchRolloutEngine(model, load_tokenizer("tiny-base"), device, seed=0)  # over the same weights
    prompts = _prompts(n_prompts, plen, model.config.vocab_size)
    params = SamplingParams(max_new_tokens=new, n=n, ignore_eos=True)
    reqs = [GenerationRequest(p, str(i)) for i, p in enumerate(prompts)]
    runs = {"torch engine": lambda: sum(len(g.token_ids) for g in engine.generate(reqs, params)),
            "HF generate": lambda: _hf_generate(model, prompts, n, new, device)}
    rec.set(shape=args.shape, dtype=str(dtype), rows=n_prompts * n, new_tokens=new, prompt_tokens=plen,
            lean_forward=engine.lean is not None)
    times: dict[str, list[float]] = {k: [] for k in runs}
    tokens = {}
    with torch.no_grad():
        for name, fn in runs.items():  # warm-up
            tokens[name] = fn()
        while time.monotonic() < t_end or not times["torch engine"]:
            for name, fn in runs.items():
                dt, tokens[name] = timed(fn, device)
                times[name].append(dt)
            _set_generation_figures(rec, times, tokens, model, n_prompts * n, plen + new / 2)
            if len(times["torch engine"]) >= args.max_repeats:
                break


def _set_generation_figures(rec: Record, times, tokens, model, rows: int, context: float) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: tokens[k] / med[k] for k in med}
    figures = {"repeats": len(times["torch engine"]),
               "torch_tokens_per_s": tps["torch engine"], "hf_tokens_per_s": tps["HF generate"],
               "torch_over_hf": tps["torch engine"] / tps["HF generate"],
               "torch_s": [round(t, 4) for t in times["torch engine"]],
               "hf_s": [round(t, 4) for t in times["HF generate"]]}
    bw = rec.figures.get("copy_bandwidth_gbs")
    if bw:
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        limit = decode_limit_tokens_per_s(model.config, rows, context, param_bytes, bw / 2)
        figures.update(decode_limit_tokens_per_s=limit, torch_fraction_of_bandwidth_limit=tps["torch engine"] / limit)
    rec.set(**figures)


def grpo_batch(n_prompts: int, group: int, prompt_len: int, completion_len: int, vocab: int):
    """A GRPO batch of ``n_prompts x group`` rows of random tokens, rewards varying within each group."""
    from reinforge.types import Batch, Trajectory

    g = torch.Generator().manual_seed(0)
    low = 100 if vocab > 1000 else 3
    trajs = []
    for p in range(n_prompts):
        prompt = torch.randint(low, vocab - 1, (prompt_len,), generator=g).tolist()
        for i in range(group):
            completion = torch.randint(low, vocab - 1, (completion_len,), generator=g).tolist()
            trajs.append(Trajectory(token_ids=prompt + completion, loss_mask=[0] * prompt_len + [1] * completion_len,
                                    logprobs=[0.0] * prompt_len + (-torch.rand(completion_len, generator=g) * 5).tolist(),
                                    version=0, group_id=p, task_id=f"t{p}", reward=float(i % 2)))
    return Batch.from_trajectories(trajs, pad_id=0)


def training_flops(model, tokens: int, seq_len: int) -> float:
    """6 x (parameters without the input embedding) x tokens + 12 x layers x hidden x seq_len x tokens
    (the attention scores and values, forward and backward; Kaplan et al. / PaLM's MFU convention)."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    if not getattr(cfg, "tie_word_embeddings", False):
        params -= model.get_input_embeddings().weight.numel()
    return 6 * params * tokens + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len * tokens


def _learner(model, overrides: list[str]):
    from reinforge.config import load_config
    from reinforge.learn.learner import Learner

    cfg = load_config(None, ["algo.kl.coef=0", "train.shared_prefix=false", "train.lr=1e-6", *overrides])
    return Learner.for_run(model, cfg)


def bench_learner(args, rec: Record) -> None:
    from reinforge.learn.memory import peak_mb, reset_peak

    device, t_end = torch.device(args.device), time.monotonic() + args.budget_s
    n_prompts, group, plen, clen = (4, 4, 8, 8) if args.quick else (64, 8, 128, 384)
    micro = 256 if args.quick else 16384
    model = random_model(args.shape, args.quick, torch.float32, device).train()
    autocast = ["train.autocast=bf16"] if device.type == "cuda" else []
    learner = _learner(model, [f"train.micro_batch_tokens={micro}", *autocast, *args.set])
    batch = grpo_batch(n_prompts, group, plen, clen, model.config.vocab_size)
    tokens, peak = int(batch.attention_mask.sum()), matmul_peak(device, args.quick)
    rec.set(shape=args.shape, sequences=len(batch), seq_len=plen + clen, tokens=tokens, micro_batch_tokens=micro,
            autocast=bool(autocast), **peak)
    flops = training_flops(model, tokens, plen + clen)
    prep, upd = [], []
    while time.monotonic() < t_end or len(upd) < 2:
        reset_peak(device)
        dt_prep, _ = timed(lambda: (learner.prepare(batch), learner.estimate_advantages(batch)), device)
        dt_upd, _ = timed(lambda: learner.update(batch), device)
        prep.append(dt_prep)
        upd.append(dt_upd)
        if len(upd) >= 2:  # the first update is a warm-up
            u = statistics.median(upd[1:])
            rec.set(repeats=len(upd) - 1, prepare_s=statistics.median(prep[1:]), update_s=u,
                    update_tokens_per_s=tokens / u, model_tflops_per_update=flops / 1e12,
                    mfu=flops / u / (peak["matmul_peak_tflops"] * 1e12), peak_mb=peak_mb(device))
        if len(upd) > args.max_repeats:
            break
    # the peak again after the updates, the best of both: a peak measured while another process had the cores
    # (a shared CPU) would make the learner's rate look above the machine's
    again = matmul_peak(device, args.quick)["matmul_peak_tflops"]
    if again > peak["matmul_peak_tflops"]:
        rec.set(matmul_peak_tflops=again, mfu=flops / statistics.median(upd[1:]) / (again * 1e12))
    learner = None  # frees its optimizer state before the largest-micro-batch search
    _largest_micro_batch(args, rec, model, micro, t_end + args.budget_s / 2)


def _largest_micro_batch(args, rec: Record, model, micro: int, t_end: float) -> None:
    """Double the micro-batch's tokens (one micro-batch a update, 512-token rows) until it does not fit."""
    from reinforge.learn.memory import peak_mb, reset_peak

    device, fits, row = torch.device(args.device), {}, 16 if args.quick else 512
    autocast = ["train.autocast=bf16"] if device.type == "cuda" else []
    limit = 4 * micro if args.quick else 2**20
    while micro <= limit and (time.monotonic() < t_end or not fits):
        rows = micro // row
        batch = grpo_batch(max(1, rows // 8), min(8, rows), row // 4, row - row // 4, model.config.vocab_size)
        try:
            learner = _learner(model, [f"train.micro_batch_tokens={micro}", *autocast, *args.set])
            reset_peak(device)
            dt, _ = timed(lambda: learner.update(batch), device)  # noqa: B023
            fits[micro] = {"update_s": round(dt, 3), "peak_mb": peak_mb(device)}
        except torch.OutOfMemoryError:
            rec.set(micro_batch_tokens_fit=fits, largest_micro_batch_tokens=max(fits, default=None),
                    first_oom_micro_batch_tokens=micro)
            break
        finally:
            learner = batch = None
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rec.set(micro_batch_tokens_fit=fits, largest_micro_batch_tokens=max(fits))
        micro *= 2


def write_model_dir(shape: str, quick: bool, directory: Path) -> Path:
    """A model directory with random weights in ``shape`` and the shipped tiny tokenizer (its ids are a
    subset of the vocabulary; decoding drops the others)."""
    import shutil

    from reinforge.assets import resolve_model_path

    model = random_model(shape, quick, torch.float32, torch.device("cpu"))
    model.save_pretrained(directory)
    tiny = resolve_model_path("tiny-base")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, directory / name)
    return directory


def _train(overrides: list[str], time_limit_s: float):
    """A training run's metrics records; ``time_limit_s`` 0: no limit."""
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    result = train(load_config(None, [*overrides, f"train.time_limit_s={int(time_limit_s)}"]),
                   progress_every=10**6)
    return result.metrics()


def bench_grpo_step(args, rec: Record) -> None:
    n_prompts, group, new = (4, 4, 8) if args.quick else (64, 8, 256)
    micro = 256 if args.quick else 16384
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.shape, args.quick, Path(tmp) / "model")
        autocast = ["train.autocast=bf16"] if args.device.startswith("cuda") else []
        rows = _train([f"model.path={model_dir}", f"model.device={args.device}", f"output_dir={tmp}", "name=step",
                       "train.steps=2", f"rollout.prompts_per_step={n_prompts}", f"rollout.group_size={group}",
                       f"rollout.max_new_tokens={new}", f"train.micro_batch_tokens={micro}", *autocast,
                       "algo.skip_equal_reward_groups=false", "algo.kl.coef=0", "task.heldout_size=8",
                       "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.report=false",
                       "log.samples_per_step=0", *args.set], 0)
    steps = [r for r in rows if "time/step_s" in r]
    last = steps[-1]  # the second step: the first one also warms up the kernels
    rec.set(shape=args.shape, sequences=n_prompts * group, max_new_tokens=new, steps=len(steps),
            **{k.removeprefix("time/"): last[k] for k in ("time/step_s", "time/generate_s", "time/reward_s",
                                                            "time/train_s") if k in last},
            peak_mb=last.get("memory/peak_mb"), tokens_generated=last.get("rollout/tokens_generated"))


def bench_recipe(args, rec: Record) -> None:
    target = 0.9
    steps = ["train.steps=2", "eval.every=1", "task.heldout_size=20"] if args.quick else []
    with tempfile.TemporaryDirectory() as tmp:
        rows = _train([f"model.device={args.device}", f"output_dir={tmp}", "name=recipe", "eval.final_samples=0",
                       "checkpoint.every=0", "log.report=false", *steps, *args.set], 0 if args.quick else max(1, args.budget_s))
    train_s, hit = 0.0, None
    for r in rows:
        train_s += r.get("time/step_s", 0.0)
        if hit is None and r.get("step", 0) > 0 and r.get("eval/heldout_acc", 0.0) >= target:
            hit = {"step": r["step"], "elapsed_s": r.get("time/elapsed_s"), "train_s": train_s}
    evals = [(r["step"], r["eval/heldout_acc"]) for r in rows if "eval/heldout_acc" in r]
    rec.set(target=target, reached=hit, steps=max((r.get("step", 0) for r in rows), default=0),
            final_heldout=evals[-1][1] if evals else None, heldout_curve=evals[-12:],
            step_s_median=statistics.median([r["time/step_s"] for r in rows if "time/step_s" in r] or [0.0]))


BENCHES = {"limits": bench_limits, "generate": bench_generate, "learner": bench_learner,
           "grpo_step": bench_grpo_step, "recipe": bench_recipe}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", choices=sorted(BENCHES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", default="qwen2.5-0.5b", help="a config in benchmarks/configs (without .json)")
    p.add_argument("--quick", action="store_true", help="shrunken shapes: the same code in seconds on a CPU")
    p.add_argument("--budget-s", type=float, default=60.0, help="stop adding repeats after this many seconds")
    p.add_argument("--max-repeats", type=int, default=5)
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="copy bandwidth (read + write) for the "
                   "decode limit; measured here when not given")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config override")
    p.add_argument("--json", type=Path, default=None, help="write the figures here (after every measurement)")
    args = p.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(min(torch.get_num_threads(), 2 if args.quick else 16))
    rec = Record(args.json, args.bench)
    rec.set(device=args.device, quick=args.quick, torch=torch.__version__)
    if args.bench == "generate":
        rec.set(copy_bandwidth_gbs=args.bandwidth_gbs or copy_bandwidth(torch.device(args.device), args.quick)[
            "copy_bandwidth_gbs"])
    BENCHES[args.bench](args, rec)
    print(json.dumps(rec.figures, indent=1, default=str))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
