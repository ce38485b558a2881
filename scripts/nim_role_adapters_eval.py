"""Win rate of each role's adapter of a LoRA ``multi_agent_nim`` self-play run against the random opponent
(docs/multi_agent.md, "One policy per role").

For each role: the held-out games of the run's config, the policy playing that role with its adapter (with
``env.role_adapters``, the role's own from the newest checkpoint's ``trainer.pt``; else the run's one adapter,
from the checkpoint's peft files) against the scripted random opponent; greedy and mean@n at temperature 1.
"Before" is the same with every adapter at its start (B = 0: the base). Both use the same sampling seed.

    PYTHONPATH=. python scripts/nim_role_adapters_eval.py RUN_DIR [--samples 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch


def _policies(run_dir: Path):  # type: ignore[no-untyped-def]
    """(config, {role: its adapter's name}, the peft model at its start, the same with the newest checkpoint's
    adapters). A run without ``env.role_adapters`` (one LoRA adapter for every role) plays both roles with it."""
    from peft import set_peft_model_state_dict

    from reinforge.config import load_config
    from reinforge.learn.checkpoint import latest_checkpoint
    from reinforge.learn.lora import restore_adapter, wrap_lora
    from reinforge.learn.role_adapters import add_role_adapters
    from reinforge.models.adapters import ADAPTER_NAME
    from reinforge.models.loading import load_model

    cfg = load_config(run_dir / "config.yaml")
    roles, ckpt = cfg.env.role_adapters, latest_checkpoint(run_dir)
    models = []
    for _ in range(2):
        base = load_model(cfg.model.path)
        models.append(add_role_adapters(base, cfg.model.lora, roles, cfg.model.path, cfg.seed) if roles
                      else wrap_lora(base, cfg.model.lora, cfg.model.path, seed=cfg.seed))
    if roles:
        state = torch.load(ckpt / "trainer.pt", weights_only=False)["roles"]
        for role in roles:
            set_peft_model_state_dict(models[1], state[role]["adapter"], adapter_name=role)
    else:
        restore_adapter(models[1], ckpt)
    names = {role: role for role in roles} if roles else dict.fromkeys(("first", "second"), ADAPTER_NAME)
    return cfg, names, models[0], models[1]


def _win_rates(cfg, peft_model, role: str, adapter: str, samples: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Greedy and mean@samples win rate of ``role`` played with ``adapter`` against the random opponent,
    held-out games."""
    from reinforge.data.sources import build_task_splits
    from reinforge.envs.nim import NimEnv
    from reinforge.learn.lora import adapter_weights
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes
    from reinforge.rollout.torch_engine import TorchRolloutEngine
    from reinforge.rollout.types import SamplingParams

    tok = load_tokenizer(cfg.model.path)
    engine = TorchRolloutEngine(load_model(cfg.model.path), tok, "cpu", seed=cfg.seed + 1)
    engine.update_adapter(adapter, adapter_weights(peft_model, adapter))
    engine.default_adapter = adapter
    tasks = list(build_task_splits(cfg.task, cfg.env).heldout)
    limits = EpisodeLimits(max_turns=cfg.env.max_turns, max_total_tokens=1024, max_turn_tokens=cfg.env.max_turn_tokens)
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0)
    out = {}
    for name, p in (("greedy", dataclasses.replace(params, greedy=True, n=1)), (f"mean@{samples}",
                                                                                  dataclasses.replace(params, n=samples))):
        trajs = run_episodes(tasks, engine, lambda: NimEnv("random", role), p, limits, seed=0)
        out[name] = sum(t.metadata.get("winner") == role for t in trajs) / len(trajs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    cfg, names, start, trained = _policies(args.run_dir)
    result = {role: {"before": _win_rates(cfg, start, role, adapter, args.samples),
                     "after": _win_rates(cfg, trained, role, adapter, args.samples)} for role, adapter in names.items()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
