"""``reinforge prm``: train a process reward model on step-labelled completions (docs/rewards.md).

The model is an HF ``AutoModelForTokenClassification`` with one output: the score of a step is its
logit at the token that ends the step, ``P(step is good) = sigmoid(logit)``, trained with
Math-Shepherd's per-step binary cross entropy (``algo.reward_losses.prm_step_bce``). A run directory
holds ``config.yaml``, ``metrics.jsonl``, ``eval.json`` (held-out step accuracy with its 95%
bootstrap interval over steps, and the share of the commoner label: what a constant answer scores) and ``model/``, which the ``prm`` step verifier
(``reward.step_verifier``) loads. With ``data.path: task`` the labels are made first by the policy's
Monte Carlo continuations (``rm/label.py``) and kept in the run directory.
"""

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

from reinforge.algo.reward_losses import PRM_LOSSES
from reinforge.eval.stats import bootstrap_ci
from reinforge.orchestrate.run_dir import new_run_dir
from reinforge.rm.config import PRMConfig
from reinforge.rm.data import split_by_prompt
from reinforge.rm.fit import fit
from reinforge.rm.model import build_reward_model, save_reward_model
from reinforge.rm.steps import StepExample, encode_steps, read_steps, step_batch, step_ends
from reinforge.track.jsonl import JsonlSink


@dataclass
class PRMResult:
    run_dir: Path
    model_dir: Path
    step_accuracy: float
    low: float
    high: float
    steps: int
    seconds: float


class EncodedSteps:
    """Every example's ids, step-end positions and labels, and right-padded batches of them."""

    def __init__(self, examples: list[StepExample], tokenizer: Any, separator: str, max_length: int) -> None:
        self.rows = []
        for ex in examples:
            ids, positions = encode_steps(tokenizer, ex.prompt, separator.join(ex.steps),
                                          step_ends(ex.steps, separator), ex.where)
            if len(ids) > max_length:
                raise ValueError(f"{ex.where}: {len(ids)} tokens, more than the model's context of {max_length}")
            self.rows.append((ids, positions, list(ex.labels)))
        self.pad_id = int(tokenizer.pad_token_id)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, index: np.ndarray) -> tuple[torch.Tensor, ...]:
        return step_batch([self.rows[i] for i in index], self.pad_id)


def step_logits(model: torch.nn.Module, data: EncodedSteps, index: np.ndarray, device: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(step scores [rows, steps], labels, step mask) of the examples ``index``."""
    ids, mask, pos, labels, step_mask = data.batch(index)
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[..., 0].float()
    return logits.gather(1, pos.to(device)), labels.to(device), step_mask.to(device)


@torch.inference_mode()
def heldout_steps(model: torch.nn.Module, data: EncodedSteps, device: str, batch: int = 256) -> np.ndarray:
    """Per labelled held-out step: 1 if the score's side of 0 matches the label's side of 1/2."""
    was_training = model.training
    model.eval()
    right = []
    for s in range(0, len(data), batch):
        scores, labels, mask = step_logits(model, data, np.arange(s, min(s + batch, len(data))), device)
        hit = ((scores > 0) == (labels >= 0.5)).float()
        right.append(hit[mask.bool()].cpu().numpy())
    model.train(was_training)
    return np.concatenate(right)


def _mc_labelled(cfg: PRMConfig, run_dir: Path, console: Console) -> tuple[list[StepExample], list[StepExample]]:
    """Math-Shepherd labels for ``data.task``'s problems (``rm/label.py``), written to the run directory
    as ``labels_train.jsonl`` / ``labels_heldout.jsonl`` and read back as any file would be."""
    from reinforge.data.sources import build_task_splits
    from reinforge.eval.cli_eval import build_eval_engine
    from reinforge.orchestrate.state_values import CutSettings
    from reinforge.rewards.imported import resolve_verifier
    from reinforge.rm.label import label_steps
    from reinforge.rollout.types import SamplingParams

    d, mc = cfg.data, cfg.data.mc
    splits = build_task_splits(d.task)
    engine = build_eval_engine(mc.policy, cfg.seed)
    verifier = resolve_verifier(d.task.verifier)
    params = SamplingParams(max_new_tokens=mc.max_new_tokens, temperature=mc.temperature)
    cut = CutSettings(mc.rollouts, mc.step_split, mc.step_tokens, mc.max_steps - 1)
    order = np.random.default_rng(cfg.seed).permutation(len(splits.train))[: mc.tasks]
    out = []
    for name, tasks in (("train", [splits.train[int(i)] for i in order]),
                        ("heldout", [splits.heldout[i] for i in range(min(mc.heldout_tasks, len(splits.heldout)))])):
        rows = label_steps(engine, verifier, tasks, params, mc.samples, mc.rollouts, cut, mc.label == "hard", console)
        path = run_dir / f"labels_{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out.append(read_steps(str(path), d.columns))
    return out[0], out[1]


def _load(cfg: PRMConfig, run_dir: Path, console: Console) -> tuple[list[StepExample], list[StepExample]]:
    d = cfg.data
    if d.path == "task":
        return _mc_labelled(cfg, run_dir, console)
    examples = read_steps(d.path, d.columns, d.split)
    if d.heldout_path is not None:
        return examples, read_steps(d.heldout_path, d.columns, d.split)
    heldout = max(1, min(d.heldout_max, round(d.heldout_fraction * len(examples))))
    return split_by_prompt(examples, heldout, cfg.seed)  # type: ignore[arg-type]


def train_process_reward_model(cfg: PRMConfig, console: Console | None = None) -> PRMResult:
    """The whole run (see the module docstring)."""
    console = console or Console()
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    begin = time.monotonic()
    run_dir = new_run_dir(Path(cfg.output_dir), cfg.name, "prm")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    train_rows, held_rows = _load(cfg, run_dir, console)
    console.print(f"process reward model: {len(train_rows)} training rows, {len(held_rows)} held-out rows -> {run_dir}",
                  highlight=False)
    torch.manual_seed(cfg.seed)
    model, tokenizer = build_reward_model(cfg.model.path, 1, cfg.model.device, per="token")
    limit = int(getattr(model.config.get_text_config(), "max_position_embeddings", 2048) or 2048)
    train = EncodedSteps(train_rows, tokenizer, cfg.data.step_separator, limit)
    held = EncodedSteps(held_rows, tokenizer, cfg.data.step_separator, limit)
    loss_fn, device = PRM_LOSSES.get(cfg.loss), cfg.model.device

    def loss_of(index: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return loss_fn(*step_logits(model, train, index, device))

    steps = fit(model, cfg.train, len(train), cfg.seed, loss_of,
                lambda: ("step_accuracy", float(heldout_steps(model, held, device).mean())),
                JsonlSink(run_dir / "metrics.jsonl"), console)
    model_dir = save_reward_model(model, tokenizer, run_dir / "model")
    right = heldout_steps(model, held, device)
    mean, low, high = bootstrap_ci(right, seed=cfg.seed)
    positive = float(np.mean([y >= 0.5 for _, _, labels in held.rows for y in labels]))
    majority = max(positive, 1 - positive)  # what always answering the commoner label scores
    (run_dir / "eval.json").write_text(json.dumps({"heldout": {
        "rows": len(held), "steps": int(len(right)), "step_accuracy": float(mean), "low": float(low),
        "high": float(high), "positive_share": positive, "majority_baseline": majority}}, indent=2))
    seconds = time.monotonic() - begin
    console.print(f"held-out step accuracy {mean:.3f} [{low:.3f}, {high:.3f}] over {len(right)} steps (always "
                  f"answering the commoner label: {majority:.3f}); {seconds:.0f}s", highlight=False)
    return PRMResult(run_dir, model_dir, float(mean), float(low), float(high), steps, seconds)
