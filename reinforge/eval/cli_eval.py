"""`reinforge eval`: load a model, evaluate it on a task's held-out split, print a table."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from reinforge.assets import resolve_model_path
from reinforge.config import config_from_dict, load_config
from reinforge.data.sources import build_task_splits
from reinforge.errors import ConfigError
from reinforge.eval.heldout import DEFAULT_KS, EvalResult, evaluate
from reinforge.learn.checkpoint import latest_checkpoint
from reinforge.models.loading import load_model, load_tokenizer
from reinforge.rewards.imported import resolve_verifier
from reinforge.rollout.engines import context_limit


def resolve_eval_model(model: str) -> str:
    """A run directory means its latest checkpoint; anything else is a model path or alias."""
    path = resolve_model_path(model)
    if (path / "checkpoints").is_dir():
        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise ConfigError(f"--model {model}: run directory without checkpoints")
        return str(ckpt)
    return model


def run_eval(
    models: list[str], task: str, data: Path | None, samples: int, temperature: float, max_new_tokens: int,
    heldout_size: int, seed: int, ks: list[int] | None = None, plot: Path | None = None, n_boot: int = 2000,
    recipe: str | None = None, engine: str | None = None, rerank: dict[str, Any] | None = None,
    page: Path | None = None,
) -> dict[str, Any]:
    """Evaluate each model on the task's held-out split: print a table per model (with 95% bootstrap
    intervals over prompts), plot their pass@k curves on one figure if ``plot`` is given, and write an HTML
    page (metrics, the first prompts' greedy completions with their pictures: eval/eval_page.py) to ``page``."""
    from rich.console import Console

    if recipe is not None:  # any task source and reward the recipe defines (tables, reasoning-gym, composites)
        from reinforge.rewards.build import build_reward

        run_cfg = load_config(recipe)
        task_cfg = run_cfg.task
        verifier = build_reward(run_cfg.reward, run_cfg.task.verifier, run_cfg.model.resolved_device())
    else:
        run_cfg = None
        spec = {"kind": task, "heldout_size": heldout_size, **({"path": str(data)} if data else {})}
        task_cfg = config_from_dict({"task": spec}, source="--task/--data").task
        verifier = resolve_verifier(task_cfg.verifier)
    splits = build_task_splits(task_cfg, run_cfg.env if run_cfg is not None else None)
    ks = sorted(set(ks or [k for k in DEFAULT_KS if k <= samples]))
    if any(k < 1 or k > max(samples, 1) for k in ks) and samples:
        raise ConfigError(f"--ks: every k must be in [1, --samples={samples}], got {ks}")
    console = Console()
    results: dict[str, Any] = {}
    for model in models:
        path = resolve_eval_model(model)
        torch.manual_seed(seed)
        rollout_engine = build_eval_engine(path, seed, run_cfg, engine)
        texts: list[list[str]] = []  # a recipe's player's completions: the page's examples
        with _recipe_player(run_cfg, rollout_engine, verifier, texts) as player:
            result = evaluate(rollout_engine, splits.heldout, verifier, max_new_tokens, samples, temperature, ks=ks,
                              system_prompt=task_cfg.system_prompt, confidence=True, n_boot=n_boot, player=player,
                              rerank=_reranker(rerank), texts=texts if player is not None else None)
        console.print(f"\n[bold]{path}[/] on {splits.name}: {result.num_prompts} held-out prompts, "
                      f"{samples} samples each at T={temperature}", highlight=False)
        console.print(result_table(result))
        results[model] = {"model": path, **result.to_dict()}
    if plot is not None and samples > 0:
        from reinforge.eval.plots import plot_pass_curves

        plot_pass_curves({m: {int(k): v for k, v in r["pass_curve"].items()} for m, r in results.items()}, plot,
                         title=f"pass@k on {splits.name} ({samples} samples, T={temperature})")
        console.print(f"pass@k curves: {plot}")
    out = {"task": splits.name, "samples": samples, "temperature": temperature, "seed": seed, "models": results}
    if page is not None:
        from reinforge.eval.eval_page import write_eval_page

        console.print(f"report: {write_eval_page(out, page)}")
    return out


def _reranker(options: dict[str, Any] | None) -> Any:
    """``reinforge eval --rerank PATH``'s scorer (``eval/rerank.py``), or None."""
    if not options:
        return None
    from functools import partial

    from reinforge.eval.rerank import rerank_scores
    from reinforge.rewards.reward_model import ensemble_members, reward_model_dir

    path = str(Path(options["path"]).expanduser())
    if ensemble_members(path) is None:
        reward_model_dir(path, "--rerank")
    from reinforge.eval.rerank import STEP_AGGREGATES

    if options.get("steps", "min") not in STEP_AGGREGATES:
        raise ConfigError(f"--rerank-steps: one of {', '.join(STEP_AGGREGATES)}, got {options['steps']!r}")
    run_config = Path(path).parent / "config.yaml"  # a PRM from reinforge prm: its runs's step separator
    data = (yaml.safe_load(run_config.read_text()) or {}).get("data", {}) if run_config.is_file() else {}
    return partial(rerank_scores, path, step_separator=data.get("step_separator", "\n"), steps=options.get("steps", "min"))


def build_eval_engine(path: str, seed: int, run_cfg: Any = None, engine: str | None = None) -> Any:
    """The rollout engine that evaluates the model at ``path``: ``engine`` (a registered name, ``auto``
    resolved for this model), else the recipe's ``rollout.engine``, else the torch engine."""
    from reinforge.orchestrate.components import build_engine, resolve_config

    rollout = run_cfg.rollout.model_dump() if run_cfg is not None else {}
    rollout["engine"] = engine or rollout.get("engine", "torch")
    cfg = resolve_config(config_from_dict({"model": {"path": path}, "rollout": rollout}, source="--engine"))
    return build_engine(cfg, load_model(path), load_tokenizer(path), seed, copy_policy=False)


@contextlib.contextmanager
def _recipe_player(run_cfg, engine, verifier, texts: list[list[str]] | None = None) -> Iterator[Any]:
    """With a recipe: its environment's collector (multi-turn episodes, a black-box agent), as in
    training (orchestrate/collectors.py); without one: None (one completion per sample)."""
    if run_cfg is None:
        yield None
        return
    from reinforge.orchestrate.collectors import play
    from reinforge.orchestrate.components import episode_side
    from reinforge.rewards.build import build_reward_pool, pool_kind

    kind = pool_kind(run_cfg.reward, run_cfg.task.verifier, run_cfg.env.multi_turn)
    with build_reward_pool(run_cfg.reward, verifier, kind) as pool:
        _, collector = episode_side(run_cfg, engine, pool, context_limit(engine))
        try:
            yield play(collector, texts)
        finally:
            collector.close()


def result_table(result: EvalResult):
    from rich.table import Table

    table = Table()
    for column in ("metric", "value", "95% CI"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    rows = [("greedy accuracy", result.greedy_accuracy, "greedy_accuracy")]
    if result.mean_at_n is not None:
        rows.append((f"mean@{result.samples}", result.mean_at_n, f"mean@{result.samples}"))
    rows += [(f"pass@{k}", v, f"pass@{k}") for k, v in result.pass_at_k.items()]
    rows += [(f"maj@{k}", v, f"maj@{k}") for k, v in result.maj_at_k.items()]
    rows += [(f"best-of-{k} (reranked)", v, f"best_of_{k}") for k, v in result.best_of_k.items()]
    for label, value, key in rows:
        lo, hi = result.intervals.get(key, (float("nan"), float("nan")))
        table.add_row(label, f"{value:.3f}", f"[{lo:.3f}, {hi:.3f}]")
    for key, groups in result.breakdown.items():
        for group, metrics in groups.items():
            table.add_row(f"{key}={group} ({int(metrics['prompts'])} prompts)",
                          f"{metrics['greedy_accuracy']:.3f}", "greedy")
    return table
