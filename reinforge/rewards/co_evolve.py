"""A reward model that keeps learning during RL: Cooper (Hong et al. 2025, "Cooper: Co-Optimizing Policy
and Reward Models in Reinforcement Learning for Large Language Models", arXiv:2508.05613).

The reward term scores the policy's samples as ``RewardModelVerifier`` does. Each training batch, once
scored (``VerifierPool.observe``; held-out evaluations are never observed), is labelled by a rule
verifier (``co_evolve.verifier``, e.g. ``exact_match``: precise where it says "correct"). From each
prompt's samples, up to ``pairs_per_group`` pairs of a correct sample over an incorrect one (drawn with a
seeded generator) join a buffer; every ``batch_size`` buffered pairs make one AdamW step (gradient norm
clipped at 1) of the Bradley-Terry loss ``-log sigmoid(r_w - r_l)`` (``algo.reward_losses.bradley_terry``;
every head or ensemble member on every pair). Prompts whose samples are all right or all wrong give no pair;
a sample the rule verifier fails on (an exception) gives none either (a warning; ``counts["label_errors"]``).

Choices (Cooper's paper leaves them open or differs):
- Cooper's negatives are correct responses rewritten into wrong ones by an assistant LLM; here they are
  the policy's own wrong samples, i.e. exactly what the policy would hack the reward model with.
- Cooper updates the reward model once per RL step, after the policy; here it updates whenever
  ``batch_size`` pairs have gathered, in the order the batches were scored (deterministic).
- A transform's reference rewards (``par``) are scored again after each update.

The weights, the optimizer, the buffer, the generator and the counters are the term's state, saved in
every checkpoint (``reward.pt``) and restored on resume.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from reinforge.algo.reward_losses import BradleyTerrySettings, bradley_terry
from reinforge.rewards.reward_model import RewardModelScorer, RewardModelVerifier
from reinforge.rewards.verifiers import Verifier
from reinforge.types import Task

log = logging.getLogger(__name__)
Pair = tuple[Task, str, str]  # (task, chosen = a correct sample, rejected = an incorrect one)


class CoEvolvingRewardModel(RewardModelVerifier):
    """A reward-model term that trains on the policy's samples as the module docstring says."""

    def __init__(self, scorer: RewardModelScorer, labeller: Verifier, *, threshold: float = 0.0, lr: float = 1e-5,
                 pairs_per_group: int = 1, batch_size: int = 16, seed: int = 0) -> None:
        super().__init__(scorer, threshold)
        self.labeller, self.pairs_per_group, self.batch_size = labeller, pairs_per_group, batch_size
        self.optimizer = torch.optim.AdamW(scorer.model.parameters(), lr=lr, weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(seed)
        self.buffer: list[Pair] = []
        self.counts = {"pairs": 0, "updates": 0}
        scorer.model_lock = threading.Lock()

    def observe(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float]:
        """Pairs from a scored training batch; an update per ``batch_size`` of them. Metrics: ``co_evolve_pairs``
        (made from this batch), ``co_evolve_updates`` (in all), and of this batch's updates the mean
        ``co_evolve_loss`` and ``co_evolve_accuracy`` (the reward model's pair accuracy before each step)."""
        pairs = self.pairs(tasks, completions)
        self.buffer.extend(pairs)
        self.counts["pairs"] += len(pairs)
        seen: list[dict[str, float]] = []
        while len(self.buffer) >= self.batch_size:
            batch, self.buffer = self.buffer[: self.batch_size], self.buffer[self.batch_size :]
            seen.append(self.update(batch))
        metrics = {"co_evolve_pairs": float(len(pairs)), "co_evolve_updates": float(self.counts["updates"])}
        for key in ("loss", "accuracy"):
            if seen:
                metrics[f"co_evolve_{key}"] = sum(m[key] for m in seen) / len(seen)
        return metrics

    def pairs(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Pair]:
        """Per prompt (task id, in order of first appearance): up to ``pairs_per_group`` distinct (correct,
        incorrect) pairs of its samples, labelled by the rule verifier."""
        groups: dict[str, tuple[Task, list[str], list[str]]] = {}
        for task, text in zip(tasks, completions, strict=True):
            _, right, wrong = groups.setdefault(task.id, (task, [], []))
            try:
                correct = self.labeller(task, text).correct
            except Exception as exc:  # an unlabelled sample makes no pair; the RL reward is not affected
                self.counts["label_errors"] = self.counts.get("label_errors", 0) + 1
                log.warning("co_evolve: the labelling verifier failed on task %s (%s); the sample makes no pair",
                            task.id, exc)
                continue
            (right if correct else wrong).append(text)
        out: list[Pair] = []
        for task, right, wrong in groups.values():
            if not right or not wrong:
                continue
            n = min(self.pairs_per_group, len(right) * len(wrong))
            for flat in torch.randperm(len(right) * len(wrong), generator=self.generator)[:n].tolist():
                out.append((task, right[flat // len(wrong)], wrong[flat % len(wrong)]))
        return out

    def update(self, batch: Sequence[Pair]) -> dict[str, float]:
        """One optimizer step of the Bradley-Terry loss on ``batch``; its loss and pair accuracy."""
        s = self.scorer
        encoded = [s.row(task, text) for task, chosen, rejected in batch for text in (chosen, rejected)]
        with s.model_lock:
            s.model.train()
            try:
                logits = s.logits(encoded)
                loss, stats = bradley_terry(logits[0::2], logits[1::2], None, BradleyTerrySettings())
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(s.model.parameters(), 1.0)
                self.optimizer.step()
            finally:
                s.model.eval()
            with s._lock:
                s.reference_scores.clear()  # scored by the weights before this step
        self.counts["updates"] += 1
        return {"loss": float(loss.detach()), "accuracy": float(stats["accuracy"])}

    def state_dict(self) -> dict[str, Any]:
        return {**self.scorer.state_dict(), "model": {k: v.detach().clone() for k, v in self.scorer.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                "buffer": list(self.buffer), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scorer.load_state_dict(state)
        self.scorer.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.buffer, self.counts = list(state["buffer"]), dict(state["counts"])
        self.scorer.reference_scores.clear()
