"""A classic run: ``runs/<name>/`` with ``config.yaml``, ``metrics.jsonl`` (one record per update),
atomic checkpoints (``learn/checkpoint.py``'s writer) and a final ``eval.json``: the run-directory
format of the LLM side, so ``reinforge compare`` aggregates classic runs (docs/classic.md)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from rich.console import Console

from reinforge.classic.agents import ClassicAgent, Iteration, build_agent
from reinforge.classic.config import ClassicConfig
from reinforge.classic.envs import (
    finished_episodes,
    finished_successes,
    make_vec_env,
    obs_normalizers,
    obs_tensor,
)
from reinforge.learn.checkpoint import save_checkpoint
from reinforge.orchestrate.run_dir import new_run_dir
from reinforge.track.jsonl import JsonlSink


@dataclass
class ClassicResult:
    run_dir: Path
    updates: int
    env_steps: int
    eval_return: float | None
    stopped: str  # why the run ended: steps, return, time


def create_classic_run_dir(cfg: ClassicConfig) -> Path:
    env = cfg.classic.env.id.replace("/", "-")  # a namespaced id (reinforge/BitFlipping-v0) is one directory
    return new_run_dir(Path(cfg.output_dir), cfg.name, f"{env}-{cfg.classic.agent}")


class _Weights:
    """The agent's network for ``save_checkpoint``: ``save_pretrained`` writes ``model.safetensors``."""

    def __init__(self, net: torch.nn.Module) -> None:
        self.net = net

    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in self.net.state_dict().items()}, str(Path(path) / "model.safetensors"))


class _NoTokenizer:
    """A classic agent has no tokenizer; the checkpoint writer's call writes nothing."""

    def save_pretrained(self, path: Path) -> None:
        return None


def _checkpoint(run_dir: Path, agent: ClassicAgent, envs: Any, update: int, env_steps: int, keep: int) -> None:
    norms = obs_normalizers(envs)
    state = {"optimizer": agent.optimizer.state_dict(),  # type: ignore[attr-defined] "update": update, "env_steps": env_steps,
             "obs_rms": [(n.obs_rms.mean, n.obs_rms.var, n.obs_rms.count) for n in norms]}
    save_checkpoint(run_dir, update, _Weights(agent.net), _NoTokenizer(), state, agent.generator,  # type: ignore[attr-defined]
                    {"env_steps": env_steps}, keep)


def evaluate(cfg: ClassicConfig, agent: ClassicAgent, train_envs: Any) -> dict[str, Any]:
    """``eval.episodes`` episodes of the policy (its mode if ``eval.deterministic``) on a fresh environment
    seeded ``seed + 10_000``, with the training environments' observation statistics (frozen); on a goal
    environment (``info["is_success"]``) also the share of episodes that end on their goal."""
    c = cfg.classic
    env = make_vec_env(c.env.model_copy(update={"vectorization": "sync", "normalize_reward": False}),
                       c.agent.settings.gamma, cfg.seed + 10_000, num_envs=1)
    for mine, theirs in zip(obs_normalizers(env), obs_normalizers(train_envs)[:1], strict=False):
        mine.obs_rms = theirs.obs_rms
        mine.update_running_mean = False
    obs, _ = env.reset(seed=cfg.seed + 10_000)
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[bool] = []
    while len(returns) < c.eval.episodes:
        action = agent.act(obs_tensor(obs), c.eval.deterministic).numpy()
        obs, _, _, _, info = env.step(action.astype(np.int64) if action.dtype.kind in "iu" else action)
        for r, n in finished_episodes(info):
            returns.append(r)
            lengths.append(n)
        successes += finished_successes(info)
    env.close()
    result = {"eval/return_mean": float(np.mean(returns)), "eval/return_std": float(np.std(returns)),
              "eval/length_mean": float(np.mean(lengths)), "eval/episodes": len(returns),
              "eval/deterministic": c.eval.deterministic, "returns": returns}
    if successes:
        result["eval/success_rate"] = float(np.mean(successes))
    return result


def _record(update: int, env_steps: int, it: Iteration, start: float) -> dict[str, Any]:
    elapsed = time.perf_counter() - start
    record: dict[str, Any] = {"step": update, "env_steps": env_steps}
    if it.episodes:
        record["episode/return_mean"] = float(np.mean([r for r, _ in it.episodes]))
        record["episode/length_mean"] = float(np.mean([n for _, n in it.episodes]))
        record["episode/count"] = len(it.episodes)
    record.update(it.metrics)
    record["time/elapsed_s"] = elapsed
    record["time/rollout_s"] = it.rollout_s
    record["perf/env_steps_per_s"] = env_steps / max(elapsed, 1e-9)
    return record


def _line(record: dict[str, Any], total: int, recent: list[float]) -> str:
    ret = f"{np.mean(recent):8.1f}" if recent else "     -  "
    return (f"update {record['step']:5d}/{total} | env steps {record['env_steps']:8d} | return (last {len(recent)}) "
            f"{ret} | {record['perf/env_steps_per_s']:6.0f} steps/s")


def train_classic(cfg: ClassicConfig, console: Console | None = None) -> ClassicResult:
    """Train ``cfg.classic.agent`` on ``cfg.classic.env`` to ``train.total_env_steps`` (or an early stop)."""
    c, console = cfg.classic, console or Console()
    torch.set_num_threads(c.train.threads)
    envs = make_vec_env(c.env, c.agent.settings.gamma, cfg.seed)
    agent = build_agent(c.agent.name, envs, cfg.seed, c.agent.settings, c.env)
    run_dir = create_classic_run_dir(cfg)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    sink = JsonlSink(run_dir / "metrics.jsonl")
    per_update = agent.steps_per_iteration
    total = max(1, c.train.total_env_steps // per_update)
    start, env_steps, recent, stopped = time.perf_counter(), 0, [], "steps"
    update = 0
    for update in range(1, total + 1):
        it = agent.iterate((update - 1) / total)
        env_steps += per_update
        recent = (recent + [r for r, _ in it.episodes])[-c.train.return_window:]
        record = _record(update, env_steps, it, start)
        sink.write(record)
        if update % c.train.log_every == 0 or update == total:
            console.print(_line(record, total, recent), highlight=False, soft_wrap=True)
        if c.checkpoint.every and update % c.checkpoint.every == 0:
            _checkpoint(run_dir, agent, envs, update, env_steps, c.checkpoint.keep)
        if c.train.stop_at_return is not None and len(recent) == c.train.return_window \
                and np.mean(recent) >= c.train.stop_at_return:
            stopped = "return"
            break
        if c.train.time_limit_s and record["time/elapsed_s"] >= c.train.time_limit_s:
            stopped = "time"
            break
    _checkpoint(run_dir, agent, envs, update, env_steps, c.checkpoint.keep)
    result = evaluate(cfg, agent, envs) if c.eval.episodes else None
    getattr(agent, "close", lambda: None)()
    envs.close()
    if result is not None:
        result.update({"step": update, "env_steps": env_steps, "stopped": stopped})
        (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return ClassicResult(run_dir, update, env_steps, result["eval/return_mean"] if result else None, stopped)
