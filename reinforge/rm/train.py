"""``reinforge rm``: train a reward model on preference pairs (docs/rewards.md).

A run directory ``runs/<name>/`` holds ``config.yaml``, ``metrics.jsonl`` (loss, train pair accuracy,
score gap and mean every step; held-out accuracy every ``train.eval_every``), ``eval.json`` (held-out
pair accuracy with its 95% bootstrap interval, calibration bins), ``calibration.png`` and the reward
model: ``model/`` (one model) or ``members/<i>/`` plus ``ensemble.json`` (``ensemble: k``), each an
HF ``AutoModelForSequenceClassification`` directory (``model.kind: autoregressive``: a causal LM directory
with its kind and beta in ``reinforge_rm.json``) the ``reward_model`` reward term loads as it is.
``combine: warm`` averages the k members' weights into ``model/`` (WARM), keeping the members (the run
directory is still their ensemble, for comparison) and recording each one's held-out accuracy and that of their averaged predictions in ``eval.json``.

Each pair is encoded as the scorer encodes (``rewards.rm_inputs.reward_text_ids``: the RM
tokenizer's chat template over prompt + answer; ``rewards.arm.ids_and_start``: where the answer's
tokens begin), keeping the last tokens that fit the model's context.
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

from reinforge.algo.reward_losses import RM_LOSSES
from reinforge.data.sources import build_task_splits
from reinforge.errors import DataError
from reinforge.orchestrate.run_dir import new_run_dir
from reinforge.rewards.arm import completion_mask, forward_scores, ids_and_start, keep_last
from reinforge.rewards.rm_inputs import right_padded, with_reference
from reinforge.rm.config import RMConfig
from reinforge.rm.data import PreferencePair, near_miss_pairs, read_pairs, split_by_prompt
from reinforge.rm.evaluate import PairEval, evaluate_pairs, plot_calibration
from reinforge.rm.fit import fit
from reinforge.rm.model import build_for, save_reward_model, trained_record
from reinforge.track.jsonl import JsonlSink


@dataclass
class RMResult:
    run_dir: Path
    model_dirs: list[Path]
    heldout: PairEval
    steps: int
    seconds: float


def load_pairs(cfg: RMConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held-out) pairs: from the task's two splits, or a file split by prompt (or two files)."""
    d = cfg.data
    if d.path == "task":
        splits = build_task_splits(d.task)
        return near_miss_pairs(splits.train, d.pairs_per_task), near_miss_pairs(splits.heldout, d.pairs_per_task)
    pairs = read_pairs(d.path, d.columns, d.split)
    if d.heldout_path is not None:
        return pairs, read_pairs(d.heldout_path, d.columns, d.split)
    heldout = max(1, min(d.heldout_max, round(d.heldout_fraction * len(pairs))))
    return split_by_prompt(pairs, heldout, cfg.seed)


class EncodedPairs:
    """Every pair's two sides as token ids with where each completion begins (read by an autoregressive
    reward model), encoded when a batch first needs them (a run of S steps of B pairs encodes at most
    S * B pairs, not the whole file), and right-padded batches of them."""

    def __init__(self, pairs: list[PreferencePair], tokenizer: Any, max_length: int,
                 reference_template: str | None = None) -> None:
        if reference_template is not None:
            missing = next((p for p in pairs if not p.reference), None)
            if missing is not None:
                raise DataError(f"{missing.where}: data.reference_template is set but the pair has no reference "
                                "answer (data.columns.reference)")
        self.pairs, self.tokenizer, self.max_length, self.template = pairs, tokenizer, max_length, reference_template
        self._ids: dict[int, tuple[tuple[list[int], int], tuple[list[int], int]]] = {}
        self.margin = torch.tensor([p.margin for p in pairs], dtype=torch.float32)
        self.pad_id = int(tokenizer.pad_token_id)

    def sides(self, i: int) -> tuple[tuple[list[int], int], tuple[list[int], int]]:
        """((chosen ids, start), (rejected ids, start)) of pair ``i``, each keeping its last ``max_length``
        tokens; start: where the completion begins in the ids kept."""
        if i not in self._ids:
            p = self.pairs[i]
            prompt = with_reference(p.prompt, self.template, p.reference)
            chosen, rejected = ids_and_start(self.tokenizer, prompt, p.chosen, p.rejected)
            self._ids[i] = (keep_last(*chosen, self.max_length), keep_last(*rejected, self.max_length))
        return self._ids[i]

    def __len__(self) -> int:
        return len(self.pairs)

    def batch(self, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, attention mask, completion mask) of ``2 * len(index)`` rows: the chosen sides, then the
        rejected ones."""
        sides = [self.sides(int(i)) for i in index]
        rows = [c for c, _ in sides] + [r for _, r in sides]
        ids, mask = right_padded([r for r, _ in rows], self.pad_id)
        return ids, mask, completion_mask([len(r) for r, _ in rows], [s for _, s in rows], ids.shape[1])


def pair_scores(model: torch.nn.Module, data: EncodedPairs, index: np.ndarray, device: str
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) scores ``[len(index), heads]``."""
    ids, mask, completion = data.batch(index)
    logits = forward_scores(model, ids.to(device), mask.to(device), completion.to(device)).float()
    return logits[: len(index)], logits[len(index):]


@torch.inference_mode()
def heldout_scores(model: torch.nn.Module, data: EncodedPairs, device: str, batch: int = 256
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    was_training = model.training
    model.eval()
    parts = [pair_scores(model, data, np.arange(s, min(s + batch, len(data))), device)
             for s in range(0, len(data), batch)]
    model.train(was_training)
    return torch.cat([c for c, _ in parts]).cpu(), torch.cat([r for _, r in parts]).cpu()


def train_member(cfg: RMConfig, seed: int, train: EncodedPairs, held: EncodedPairs, model: torch.nn.Module,
                 sink: JsonlSink, console: Console, label: str = "") -> int:
    """Train ``model`` in place on ``train`` with the recipe's pairwise loss; returns the steps taken."""
    device, loss_fn, loss_cfg = cfg.model.device, RM_LOSSES.get(cfg.loss), cfg.loss.settings

    def loss_of(index: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = pair_scores(model, train, index, device)
        return loss_fn(chosen, rejected, train.margin[index].to(device), loss_cfg)

    def heldout() -> tuple[str, float]:
        c, r = heldout_scores(model, held, device)
        return "pair_accuracy", evaluate_pairs(c.mean(-1), r.mean(-1), n_boot=1).accuracy

    return fit(model, cfg.train, len(train), seed, loss_of, heldout, sink, console, label)


def train_reward_model(cfg: RMConfig, console: Console | None = None) -> RMResult:
    """The whole run (see the module docstring)."""
    console = console or Console()
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    begin = time.monotonic()
    train_pairs, held_pairs = load_pairs(cfg)
    run_dir = new_run_dir(Path(cfg.output_dir), cfg.name, f"rm-{cfg.loss}")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    console.print(f"reward model: {len(train_pairs)} training pairs, {len(held_pairs)} held-out pairs -> {run_dir}",
                  highlight=False)
    sink = JsonlSink(run_dir / "metrics.jsonl")
    members: list[Path] = []
    member_scores: list[tuple[torch.Tensor, torch.Tensor]] = []
    states: list[dict[str, torch.Tensor]] = []
    steps = 0
    for k in range(cfg.ensemble):
        torch.manual_seed(cfg.seed + k)
        model, tokenizer = build_for(cfg.model)
        limit = _context_length(model)
        template = cfg.data.reference_template
        train = EncodedPairs(train_pairs, tokenizer, limit, template)
        held = EncodedPairs(held_pairs, tokenizer, limit, template)
        label = f"[member {k}] " if cfg.ensemble > 1 else ""
        steps = train_member(cfg, cfg.seed + k, train, held, model, sink, console, label)
        out = run_dir / "model" if cfg.ensemble == 1 else run_dir / "members" / str(k)
        out.parent.mkdir(parents=True, exist_ok=True)
        members.append(save_reward_model(model, tokenizer, out, trained_record(model, template)))
        member_scores.append(heldout_scores(model, held, cfg.model.device))
        if cfg.combine == "warm":
            states.append({n: t.detach().clone() for n, t in model.state_dict().items()})
    evals = {f"member_{k}": evaluate_pairs(c.mean(-1), r.mean(-1), seed=cfg.seed).accuracy
             for k, (c, r) in enumerate(member_scores)} if cfg.ensemble > 1 else {}
    chosen = torch.stack([c for c, _ in member_scores]).mean(0).mean(-1)
    rejected = torch.stack([r for _, r in member_scores]).mean(0).mean(-1)
    result = evaluate_pairs(chosen, rejected, seed=cfg.seed)  # one model, or the members' mean prediction
    if cfg.combine == "warm":
        evals["prediction_ensemble"] = result.accuracy
        model.load_state_dict(average_weights(states))
        c, r = heldout_scores(model, held, cfg.model.device)
        result = evaluate_pairs(c.mean(-1), r.mean(-1), seed=cfg.seed)
        _write_outputs(run_dir, cfg, result, members, evals)  # the members stay an ensemble beside the WARM model
        members = [save_reward_model(model, tokenizer, run_dir / "model", trained_record(model, template))]
    else:
        _write_outputs(run_dir, cfg, result, members, evals)
    seconds = time.monotonic() - begin
    what = "WARM (weight-averaged) model" if cfg.combine == "warm" else "held-out"
    console.print(f"{what} pair accuracy {result.accuracy:.3f} [{result.low:.3f}, {result.high:.3f}] over "
                  f"{result.pairs} pairs, calibration error {result.ece:.3f}; {seconds:.0f}s", highlight=False)
    return RMResult(run_dir, members, result, steps, seconds)


def average_weights(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """WARM (Rame et al. 2024, arXiv:2401.12187): ``theta = (1/M) sum_i theta_i``, the element-wise mean
    of M reward models fine-tuned from one initialisation (floating tensors; others from the first)."""
    return {name: torch.stack([s[name] for s in states]).mean(0) if states[0][name].is_floating_point()
            else states[0][name] for name in states[0]}


def _context_length(model: torch.nn.Module) -> int:
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions"):
        if isinstance(getattr(config, name, None), int):
            return int(getattr(config, name))
    return 2048


def _write_outputs(run_dir: Path, cfg: RMConfig, result: PairEval, members: list[Path],
                   evals: dict[str, float]) -> None:
    (run_dir / "eval.json").write_text(json.dumps({"heldout": result.to_dict(), "heads": cfg.model.heads,
                                                   "members": cfg.ensemble, "combine": cfg.combine,
                                                   "accuracy_of": evals}, indent=2))
    if len(members) > 1:
        (run_dir / "ensemble.json").write_text(json.dumps(
            {"members": [str(m.relative_to(run_dir)) for m in members], "aggregate": "mean"}, indent=2))
    plot_calibration(result, run_dir / "calibration.png")  # with WARM: the averaged model's
