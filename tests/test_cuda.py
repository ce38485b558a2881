"""The CUDA paths, on a real GPU (marked ``cuda``; skipped with a reason where there is none).

`scripts/device_check.py` runs these on a GPU machine (docs/gpu.md). Tolerances, stated once:
- engine vs learner log-probs, float32 weights: max |diff| < 2e-4 nats (the same weights, two kernel
  orders: the engine's KV-cached decode against the learner's full forward);
- bfloat16 weights: max |diff| < 0.25 and mean < 0.02 nats (bf16 rounding of two different kernel
  paths; both take their log-softmax in float32);
- bf16 autocast against float32: the update's parameter change has cosine similarity > 0.99;
- resume on CUDA against an uninterrupted run: every logged value within 1e-5 relative (CUDA kernels
  need not be bit-reproducible, the CPU tests ask for bit equality).
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from resume_fixtures import straight_and_resumed, untimed

from reinforge.config import load_config

pytestmark = pytest.mark.cuda
# REINFORGE_TEST_DEVICE=cpu runs these same tests on the CPU (device_check.py --quick --cpu, part of make test),
# so that they cannot rot between GPU runs; the two that only mean something on CUDA skip there.
DEVICE = os.environ.get("REINFORGE_TEST_DEVICE", "cuda")
cuda_only = pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="CUDA only (sync counting, nccl)")

SMALL = ("rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=6", "task.heldout_size=20",
         "eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "algo.skip_equal_reward_groups=false")


def _cfg(tmp_path, name: str, *overrides: str):
    return load_config(None, [f"output_dir={tmp_path}", f"name={name}", f"model.device={DEVICE}", *SMALL, *overrides])


def _engine_and_requests(dtype: torch.dtype, n: int = 12):
    from reinforge.data.arithmetic import arithmetic_splits
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.prompts import encode_prompt
    from reinforge.rollout.torch_engine import TorchRolloutEngine
    from reinforge.rollout.types import GenerationRequest

    tok = load_tokenizer("tiny-base")
    model = load_model("tiny-base").to(DEVICE, dtype)
    reqs = [GenerationRequest(encode_prompt(tok, t.prompt), t.id) for t in list(arithmetic_splits().heldout)[:n]]
    return model, TorchRolloutEngine(copy.deepcopy(model), tok, DEVICE, seed=0), reqs, tok


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_engine_logprobs_match_the_learner_on_cuda(dtype):
    from reinforge.learn.logprobs import token_logprobs
    from reinforge.rollout.types import SamplingParams

    model, engine, reqs, tok = _engine_and_requests(dtype)
    gens = engine.generate(reqs, SamplingParams(max_new_tokens=6, n=4))
    rows = [g.prompt_ids + g.token_ids for g in gens]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, device=DEVICE)
    attn, sampled, mask = torch.zeros_like(ids), torch.zeros(ids.shape, device=DEVICE), torch.zeros(ids.shape, device=DEVICE)
    for i, (g, row) in enumerate(zip(gens, rows, strict=True)):
        p = len(g.prompt_ids)
        ids[i, : len(row)], attn[i, : len(row)] = torch.tensor(row), 1
        sampled[i, p : len(row)], mask[i, p : len(row)] = torch.tensor(g.logprobs), 1
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, attn)
    diff = (logp.float() - sampled).abs() * mask
    assert mask.sum() > len(rows)
    if dtype == torch.float32:
        assert diff.max().item() < 2e-4
    else:
        assert diff.max().item() < 0.25 and (diff.sum() / mask.sum()).item() < 0.02


@cuda_only
def test_decode_does_not_synchronise_the_host_every_token():
    """The torch engine's decode loop on CUDA: fewer host synchronisations than decode steps (CUDA's sync
    debug mode warns at each one; every warning is counted)."""
    from reinforge.rollout.types import SamplingParams

    _, engine, reqs, _ = _engine_and_requests(torch.float32, n=8)
    steps = 32
    engine.generate(reqs, SamplingParams(max_new_tokens=4, n=2, ignore_eos=True))  # warm-up
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.generate(reqs, SamplingParams(max_new_tokens=steps, n=2, ignore_eos=True))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    syncs = sum(where.values())
    assert syncs < steps, f"{syncs} host synchronisations in {steps} decode steps, at {where.most_common(8)}"


def test_grpo_trains_on_cuda_and_its_checkpoint_loads_on_the_cpu(tmp_path):
    from reinforge.models.loading import load_model
    from reinforge.orchestrate.run import train

    result = train(_cfg(tmp_path, "cuda", "train.steps=3", "eval.every=0", "checkpoint.every=3"))
    steps = [r for r in result.metrics() if "train/loss" in r]
    assert len(steps) == 3 and all(math.isfinite(r["train/loss"]) for r in steps)
    assert steps[-1]["memory/peak_mb"] > 0
    trained = load_model(str(result.run_dir), device="cpu")  # map_location: saved from CUDA, read on the CPU
    base = load_model("tiny-base")
    assert next(trained.parameters()).device.type == "cpu"
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters(), strict=True))
    on_cpu = train(None, resume=result.run_dir, overrides=["model.device=cpu", "train.steps=4"])  # optimizer state too
    assert [r["step"] for r in on_cpu.metrics() if "train/loss" in r] == [1, 2, 3, 4]


def test_resume_on_cuda_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    common = ("train.steps=4", "eval.every=2", "checkpoint.every=2", "train.lr=1e-3")
    straight, resumed = straight_and_resumed(monkeypatch, lambda name: _cfg(tmp_path, name, *common))
    a, b = untimed(straight), untimed(resumed)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
            else:
                assert rb[k] == v, k


def test_bf16_autocast_update_follows_the_fp32_update():
    from reinforge.learn.learner import Learner
    from reinforge.models.loading import load_model
    from reinforge.types import Batch

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from bench_gpu import grpo_batch

    batch: Batch = grpo_batch(4, 4, 6, 6, 18)
    deltas = []
    for autocast in ("none", "bf16"):
        model = load_model("tiny-base", device=DEVICE)
        before = [p.detach().clone() for p in model.parameters()]
        learner = Learner.for_run(model, load_config(None, ["algo.kl.coef=0", f"train.autocast={autocast}",
                                                             "train.lr=1e-3", f"model.device={DEVICE}"]))
        learner.update(batch)
        deltas.append(torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)]))
    assert torch.nn.functional.cosine_similarity(deltas[0], deltas[1], dim=0).item() > 0.99


def test_lora_trains_on_cuda(tmp_path):
    from reinforge.orchestrate.run import train

    result = train(_cfg(tmp_path, "lora", "train.steps=2", "eval.every=0", "model.lora.enabled=true",
                        "train.lr=1e-3"))
    steps = [r for r in result.metrics() if "train/loss" in r]
    assert len(steps) == 2 and all(math.isfinite(r["train/loss"]) for r in steps)


@cuda_only
def test_nccl_with_one_rank(tmp_path):
    """`torchrun --nproc_per_node 1` with model.device=cuda: the nccl backend (auto), DDP, two steps."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "reinforge.cli", "train",
         f"output_dir={tmp_path}", "name=nccl", f"model.device={DEVICE}", "train.steps=2", "eval.every=0",
         "checkpoint.every=0", *SMALL],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done after" in proc.stdout
