"""Data-parallel training (learn/distributed.py): 2 ranks (gloo, processes spawned here) give the
same update as 1 process on the whole batch, with DDP and FSDP2; and a tiny 2-rank training run.

The update comparisons claim mathematical equality, so they run in float64 (tests/numerics.py): in
float32 the ranks' different summation orders move an Adam update by up to ~1e-5 on some CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from numerics import EXACT_RTOL, float64_model

from reinforge.config import load_config
from reinforge.learn.learner import Learner
from reinforge.types import Batch, Trajectory

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed with the gloo backend",
)

TOL = EXACT_RTOL  # parameters and gradients after the update, relative to the largest; metrics, relative to
# values above 1
GROUPS, GROUP_SIZE = 4, 4
# Each variant: config overrides; which groups each rank holds (rank 1 holds none in "uneven").
VARIANTS: dict[str, tuple[list[str], list[list[int]]]] = {
    "token_mean": (["algo.loss_agg=token_mean"], [[0, 1], [2, 3]]),
    "token_mean_micro": (["algo.loss_agg=token_mean", "train.micro_batch_tokens=40"], [[0, 1], [2, 3]]),
    "seq_sum_micro_minibatches_clip": (
        ["algo.loss_agg=seq_mean_token_sum", "train.micro_batch_tokens=40", "train.minibatches=2", "train.epochs=2",
         "train.grad_clip=0.05"], [[0, 1], [2, 3]]),
    # a batch-normalised advantage (statistics of the global batch) and a KL term in the loss
    "reinforce_pp_kl": (["algo.advantage=reinforce_pp_baseline", "algo.kl.coef=0.1", "algo.kl.placement=loss",
                         "algo.kl.estimator=k1", "train.micro_batch_tokens=40"], [[0, 1], [2, 3]]),
    # critic (gradients summed over ranks), whitened GAE over the global batch, KL in the reward, 2 mini-batches
    "ppo": (["preset=ppo", "train.micro_batch_tokens=40"], [[0, 1], [2, 3]]),
    # the memory switches: packed dynamic micro-batches and gradient checkpointing (inside FSDP2's hooks)
    "packed_checkpointed": (["algo.loss_agg=token_mean", "train.micro_batch_tokens=40", "train.packing=true",
                             "train.gradient_checkpointing=true"], [[0, 1], [2, 3]]),
    "uneven": (["algo.loss_agg=seq_mean_token_sum", "train.micro_batch_tokens=40", "train.minibatches=2"],
               [[0, 1, 2, 3], []]),
}
METRICS = ("loss", "pg_loss", "entropy", "grad_norm", "clip_frac", "kl_ref", "logprob_mismatch",
           "logprob_mismatch_max", "critic/value_loss", "critic/grad_norm", "critic/explained_variance")


def _cfg(overrides: list[str], parallel: str = "ddp"):
    return load_config(None, ["algo.kl.coef=0", "train.lr=1e-4", f"train.parallel={parallel}",
                              "rollout.max_new_tokens=12", *overrides])


def _trajectories() -> list[Trajectory]:
    """GROUPS groups of GROUP_SIZE completions of one prompt each, of varied lengths and rewards."""
    g = torch.Generator().manual_seed(7)
    out = []
    for group in range(GROUPS):
        prompt = torch.randint(3, 18, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
        for i in range(GROUP_SIZE):
            n = int(torch.randint(2, 12, (1,), generator=g))
            completion = torch.randint(3, 18, (n,), generator=g).tolist()
            logprobs = (-torch.rand(n, generator=g) * 3).tolist()
            out.append(Trajectory(
                token_ids=prompt + completion, loss_mask=[0] * len(prompt) + [1] * n,
                logprobs=[0.0] * len(prompt) + logprobs, version=0, group_id=group, task_id=f"t{group}",
                reward=float((i + group) % 3 == 0) + 0.25 * i,
            ))
    return out


def _batch(groups: list[int]) -> Batch | None:
    trajs = [t for t in _trajectories() if t.group_id in groups]
    return Batch.from_trajectories(trajs, pad_id=0) if trajs else None


def _learner(cfg) -> Learner:
    from reinforge.learn.critic import build_critic
    from reinforge.models.loading import load_model

    torch.manual_seed(0)
    ref = float64_model(load_model("tiny-base")) if cfg.algo.kl.coef > 0 else None
    critic = build_critic("tiny-base", cfg.algo.critic, "float64", "cpu") if cfg.algo.advantage == "gae" else None
    if critic is not None:
        float64_model(critic.model)
    return Learner.for_run(float64_model(load_model("tiny-base")), cfg, ref, critic)


def _full_state(learner: Learner) -> dict[str, torch.Tensor]:
    from reinforge.learn import distributed

    state = distributed.full_state_dict(learner.model) if learner.fsdp else learner.model.state_dict()
    if learner.critic is not None:
        state.update({f"critic.{k}": v for k, v in learner.critic.model.state_dict().items()})
    return {k: v.detach().clone() for k, v in state.items()}


def _grads(learner: Learner) -> dict[str, torch.Tensor]:
    """The gradients of the last optimizer step (summed over ranks, clipped), whole."""
    out = {}
    for name, p in learner.model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


def _reference(tmp_path: Path, parallel: str) -> Path:
    """One process, the whole batch: the parameters and metrics after one update, per variant."""
    torch.set_num_threads(2)
    out = {}
    for name, (overrides, _) in VARIANTS.items():
        # FSDP2 ranks compute log-probs with the model's own forward (no shared-prefix forward): so does the reference
        extra = ["train.shared_prefix=false"] if parallel == "fsdp" else []
        learner = _learner(_cfg([*overrides, *extra]))
        metrics = learner.update(_batch(list(range(GROUPS))))
        out[name] = {"state": _full_state(learner), "grads": _grads(learner), "metrics": metrics}
    path = tmp_path / f"reference_{parallel}.pt"
    torch.save(out, path)
    return path


def _rank_main(index: int, world: int, port: int, parallel: str, reference: str, out_dir: str) -> None:
    """One rank: every variant's update on this rank's groups, compared with the one-process reference."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=index, world_size=world)
    torch.set_num_threads(1)
    result: dict[str, object] = {}
    try:
        expected = torch.load(reference, weights_only=False)
        for name, ref in expected.items():
            overrides, split = VARIANTS[name]
            learner = _learner(_cfg(overrides, parallel))
            assert learner.world == world and learner.fsdp == (parallel == "fsdp")
            metrics = learner.update(_batch(split[index]))
            state, grads = _full_state(learner), _grads(learner)
            result[name] = {
                "max_param_diff": max(float((state[k] - v).abs().max()) for k, v in ref["state"].items()),
                "max_param": max(float(v.abs().max()) for v in ref["state"].values() if v.is_floating_point()),
                "max_grad_diff": max(float((grads[k] - v).abs().max()) for k, v in ref["grads"].items()),
                "max_grad": max(float(v.abs().max()) for v in ref["grads"].values()),
                "metric_diffs": {m: abs(metrics[m] - ref["metrics"][m]) / max(1.0, abs(ref["metrics"][m]))
                                 for m in METRICS if m in ref["metrics"]},  # relative to values above 1
                "missing_metrics": sorted(set(ref["metrics"]) - set(metrics)),
            }
    except Exception:
        result["error"] = traceback.format_exc()
        raise
    finally:
        Path(out_dir, f"rank{index}.json").write_text(json.dumps(result))
        dist.destroy_process_group()


def _run_ranks(tmp_path: Path, parallel: str) -> dict[str, dict]:
    import torch.multiprocessing as mp

    from reinforge.learn.distributed import free_port

    reference = _reference(tmp_path, parallel)
    mp.spawn(_rank_main, args=(2, free_port(), parallel, str(reference), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, result in enumerate(results):
        assert "error" not in result, f"rank {r}: {result['error']}"
    return results


def _check(results: list[dict]) -> None:
    worst = worst_grad = 0.0
    for r, result in enumerate(results):
        for name, res in result.items():
            assert res["max_param_diff"] < TOL * res["max_param"], \
                f"rank {r}, {name}: parameters differ by {res['max_param_diff']:.2e}"
            assert not res["missing_metrics"], f"rank {r}, {name}: missing metrics {res['missing_metrics']}"
            for m, diff in res["metric_diffs"].items():
                assert diff < TOL, f"rank {r}, {name}: metric {m} differs by {diff:.2e}"
            assert res["max_grad_diff"] < TOL * res["max_grad"], f"rank {r}, {name}: gradients differ"
            worst = max(worst, res["max_param_diff"] / res["max_param"])
            worst_grad = max(worst_grad, res["max_grad_diff"] / res["max_grad"])
    print(f"2 ranks vs 1 process: largest parameter difference {worst:.2e} (relative to the largest parameter), "
          f"largest gradient difference {worst_grad:.2e} (relative to the largest gradient)")


@pytest.mark.numerics
def test_ddp_two_ranks_update_equals_one_process(tmp_path):
    """DDP (replicated weights, gradients summed): each rank half the groups (or all / none), micro-batches,
    mini-batches over 2 epochs, clipping, token_mean / seq_mean_token_sum, a batch-normalised advantage, KL."""
    _check(_run_ranks(tmp_path, "ddp"))


@pytest.mark.numerics
def test_fsdp2_two_ranks_update_equals_one_process(tmp_path):
    """The same with FSDP2 (fully_shard per decoder layer + root; ranks with fewer micro-batches run empty ones)."""
    _check(_run_ranks(tmp_path, "fsdp"))


def test_config_refusals():
    from reinforge.errors import ConfigError
    from reinforge.learn import distributed

    base = ["train.world_size=2", "rollout.prompts_per_step=4"]
    distributed.check(load_config(None, base))
    with pytest.raises(ConfigError, match="orchestrate.mode=sync"):
        distributed.check(load_config(None, [*base, "orchestrate.mode=async"]))
    with pytest.raises(ConfigError, match="prompts_per_step"):
        distributed.check(load_config(None, ["train.world_size=2", "rollout.prompts_per_step=1"]))
    with pytest.raises(ConfigError, match="lora"):
        distributed.check(load_config(None, [*base, "train.parallel=fsdp", "model.lora.enabled=true"]))
    with pytest.raises(ConfigError, match="nccl"):
        distributed.check(load_config(None, [*base, "train.dist_backend=nccl"]))
    assert distributed.world() == 1 and distributed.is_main() and distributed.shard(5) == (0, 5)


def _finish_rank(index: int, world: int, port: int, out_dir: str) -> None:
    """Rank 0 works 1.5 s longer after the last collective (as it evaluates and checkpoints at the end
    of a run); each rank records when ``finish()`` returned and whether the group is gone after it."""
    import time

    from reinforge.learn import distributed

    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=index, world_size=world)
    distributed.all_reduce([1.0])
    if index == 0:
        time.sleep(1.5)
    done_working = time.time()
    distributed.finish()
    Path(out_dir, f"finish{index}.json").write_text(json.dumps(
        {"worked_until": done_working, "left": time.time(), "initialized": distributed.initialized()}))


def test_finish_waits_for_every_rank_then_destroys_the_group(tmp_path):
    """A rank that ends its run leaves the group only when every rank has (a rank tearing gloo down while
    rank 0 still worked aborted now and then: "terminate called without an active exception")."""
    import torch.multiprocessing as mp

    from reinforge.learn.distributed import free_port

    mp.spawn(_finish_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"finish{r}.json").read_text()) for r in range(2))
    assert r1["left"] >= r0["worked_until"] - 0.05  # rank 1 waited for rank 0's extra work
    assert r1["left"] - r1["worked_until"] > 1.0
    assert not r0["initialized"] and not r1["initialized"]


def _train_cli(tmp_path: Path, launcher: list[str], *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*launcher, "-m", "reinforge.cli", "train", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["spawn_ddp", "torchrun_fsdp"])
def test_two_rank_training_run_logs_once_and_checkpoints(tmp_path, launch):
    """`reinforge train ... train.world_size=2` spawns 2 ranks (or torchrun starts them, here with FSDP2):
    2 steps complete, rank 0 alone writes the metrics (one record per step, every rank's samples
    counted) and a checkpoint that loads as a plain model; the FSDP2 run then resumes for a third step."""
    from reinforge.models.loading import load_model
    from reinforge.track.jsonl import read_jsonl

    torchrun = Path(sys.executable).with_name("torchrun")
    if launch == "torchrun_fsdp" and not torchrun.exists():
        pytest.skip("no torchrun next to the python executable")
    launcher = [sys.executable] if launch == "spawn_ddp" else [str(torchrun), "--nproc_per_node", "2"]
    parallel = ["train.world_size=2"] if launch == "spawn_ddp" else ["train.parallel=fsdp"]
    proc = _train_cli(
        tmp_path, launcher, f"output_dir={tmp_path}", "name=run", *parallel, "train.steps=2",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=20", "eval.every=0",
        "eval.final_samples=0", "log.report=false", "checkpoint.every=0", "train.time_limit_s=0",
        "algo.skip_equal_reward_groups=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("done after") == 1
    run = tmp_path / "run"
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[1]["batch/sequences"] == 16  # both ranks' groups are reported
    assert "world_size: 2" in (run / "config.yaml").read_text()
    model = load_model(str(run / "checkpoints" / "step_2"))
    assert sum(p.numel() for p in model.parameters()) > 0
    if launch == "torchrun_fsdp":  # weights and the whole optimizer state re-sharded on resume
        proc = _train_cli(tmp_path, launcher, "--resume", str(run), "train.steps=3")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3]
