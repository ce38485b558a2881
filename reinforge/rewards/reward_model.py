"""Reward models: any Hugging Face ``AutoModelForSequenceClassification``, an autoregressive reward model
(GenARM's ``r = beta * sum_t log pi_r(y_t | x, y_<t)``, ``rewards/arm.py``: a causal LM directory whose
``reinforge_rm.json`` says ``kind: autoregressive`` and its beta), or an ensemble of them.

A model with one head gives its score as it is. Several scores, from k heads (``num_labels = k``)
or from the members of an ensemble directory (``ensemble.json``, written by ``reinforge rm`` with
``ensemble: k``), become one through a registered aggregate (``algo.reward_ensembles``: mean, min,
uwo), which the reward term names (``reward_model.aggregate``).

``RewardModelScorer.score(tasks, completions)`` scores (prompt, completion) pairs in batches. The
text scored is the chat template applied to ``prompt + [assistant: completion]`` when the prompt
is chat messages and the tokenizer has a template, else ``prompt + completion`` as raw text (chat
messages without a template: their contents joined by newlines). Sequences are right-padded
whatever the tokenizer's ``padding_side`` (so real tokens keep positions 0..n-1 under absolute
position embeddings too), and the model's own pooling reads the head at the last non-pad token (an
autoregressive reward model sums over the completion's tokens instead, ``row`` telling where they begin).
A sequence longer than ``max_length`` keeps its last ``max_length`` tokens (the completion's end).

A model trained by ``reinforge rm`` with a reference template (``reinforge_rm.json``) is a
reference-based reward model: the task's reference answer is put into the prompt it scores, as it
was in training (``with_reference``).

``transform`` (``algo.reward_transforms``: none, clip, par) turns the score into the reward: ``clip`` reads
the running statistics of the raw scores, ``par`` each task's reference rewards (the scores of its
``reference_responses``, computed at the task's first sight and kept).

``normalise="running"`` (after the transform): ``z = (s - mean) / (std + eps)``, where mean and (population) std are of
every raw score seen so far including the current call's (Welford / Chan et al. updates;
``state_dict`` for checkpoints).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from reinforge.errors import ConfigError
from reinforge.models.precision import at_least_float32
from reinforge.rewards.arm import (
    completion_mask,
    forward_scores,
    ids_and_start,
    is_autoregressive,
    load_autoregressive,
    reads_completion,
)
from reinforge.rewards.rm_inputs import (  # noqa: F401  (re-exported: the trainer and tests import them from here)
    RM_CONFIG,
    reference_template,
    reward_text_ids,
    right_padded,
    trained_with,
    with_reference,
)
from reinforge.rewards.verifiers import RewardResult
from reinforge.types import Task

log = logging.getLogger(__name__)

Normalise = Literal["none", "running"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RunningMeanStd:
    """Mean and population variance of every value seen: Chan et al.'s batch form of Welford's update,
    ``M2 <- M2_a + M2_b + delta^2 n_a n_b / n``, ``mean <- mean_a + delta n_b / n``, ``var = M2 / n``."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: Sequence[float]) -> None:
        if not values:
            return
        n_b = len(values)
        mean_b = math.fsum(values) / n_b
        m2_b = math.fsum((v - mean_b) ** 2 for v in values)
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * self.count * n_b / n
        self.count = n

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


def reward_model_dir(path: str, label: str = "reward model") -> Path:
    """``path`` as a Hugging Face model directory, or a ConfigError starting with ``label``."""
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{label} {path!r}: not a Hugging Face model directory (no config.json)")
    return directory


def ensemble_members(path: str) -> list[Path] | None:
    """The member directories of an ensemble directory (its ``ensemble.json``, as ``reinforge rm``
    writes with ``ensemble: k``), in order; None for a single model."""
    manifest = Path(path).expanduser() / "ensemble.json"
    if not manifest.is_file():
        return None
    members = [manifest.parent / m for m in json.loads(manifest.read_text()).get("members", [])]
    if not members:
        raise ConfigError(f"{manifest}: lists no members")
    return members


class RewardEnsemble(torch.nn.Module):
    """k reward models as one: ``logits`` are the members' outputs side by side ``[batch, sum of heads]``;
    ``config`` is the first member's (they share a tokenizer, so a pad id and a context length)."""

    def __init__(self, members: list[torch.nn.Module]) -> None:
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        self.config = members[0].config
        self.reads_completion = reads_completion(members[0])  # members of one run are of one kind

    @property
    def heads(self) -> int:
        return sum(_heads(m) for m in self.members)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                completion_mask: torch.Tensor | None = None) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(logits=torch.cat(
            [forward_scores(m, input_ids, attention_mask, completion_mask) for m in self.members], dim=-1))


def _load(path: str, dtype: str) -> torch.nn.Module:
    from transformers import AutoModelForSequenceClassification

    members = ensemble_members(path)
    if members is not None:
        return RewardEnsemble([_load(str(m), dtype) for m in members])
    if is_autoregressive(reward_model_dir(path)):
        return load_autoregressive(reward_model_dir(path), _DTYPES[dtype])
    return AutoModelForSequenceClassification.from_pretrained(str(reward_model_dir(path)), dtype=_DTYPES[dtype])


def _heads(model: torch.nn.Module) -> int:
    """The model's scores per sequence: its ``heads`` (an ensemble, an autoregressive reward model), else
    its classifier's ``num_labels``."""
    heads = getattr(model, "heads", None)
    return int(heads) if heads is not None else int(getattr(model.config, "num_labels", 0) or 0)


class RewardModelScorer:
    """Batched scalar scores of (prompt, completion) pairs; see the module docstring."""

    def __init__(self, path_or_model: str | torch.nn.Module, tokenizer: Any = None, *, batch_size: int = 16,
                 normalise: Normalise = "none", max_length: int | None = None, device: str = "cpu",
                 dtype: str = "float32", eps: float = 1e-6, aggregate: str = "mean", aggregate_cfg: Any = None,
                 transform: str = "none", transform_cfg: Any = None) -> None:
        if normalise not in ("none", "running"):
            raise ConfigError(f"reward model normalise must be 'none' or 'running', got {normalise!r}")
        if batch_size < 1:
            raise ConfigError(f"reward model batch_size must be >= 1, got {batch_size}")
        self.reference_template: str | None = None
        if isinstance(path_or_model, str):
            model = _load(path_or_model, dtype)
            members = ensemble_members(path_or_model)
            first = str(members[0]) if members else path_or_model
            tokenizer = first if tokenizer is None else tokenizer
            self.reference_template = reference_template(Path(first).expanduser())
        else:
            model = path_or_model
        if tokenizer is None:
            raise ConfigError("RewardModelScorer needs a tokenizer (or a model path to load one from)")
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(Path(tokenizer).expanduser()))
        if _heads(model) < 1:
            raise ConfigError(f"a reward model needs a score head (num_labels >= 1); this one has "
                              f"num_labels={getattr(model.config, 'num_labels', None)}")
        from reinforge.algo.reward_ensembles import RM_AGGREGATES
        from reinforge.algo.reward_transforms import RM_TRANSFORMS

        self.heads = _heads(model)
        self.aggregate = RM_AGGREGATES.entry(aggregate)
        self.aggregate_cfg = _settings(self.aggregate, aggregate_cfg)
        self.transform = RM_TRANSFORMS.entry(transform)
        self.transform_cfg = _settings(self.transform, transform_cfg)
        self.model = model.to(device).eval()
        self.tokenizer, self.device = tokenizer, device
        self.batch_size, self.normalise, self.eps = batch_size, normalise, eps
        self.pad_id = self._pad_id()
        self.max_length = max_length or self._context_length()
        self.norm = RunningMeanStd()  # of the rewards (``normalise: running``)
        self.raw_stats = RunningMeanStd()  # of the raw scores (a transform's ``mean`` and ``std``)
        self.reference_scores: dict[str, list[float]] = {}  # task id -> its reference responses' raw scores
        self.truncated = 0
        self._lock = threading.Lock()
        # held around each forward; a lock only while the model also trains (rewards/co_evolve.py)
        self.model_lock: Any = contextlib.nullcontext()

    def _pad_id(self) -> int:
        """The model pools at its last non-``pad_token_id`` token, so we pad with that id; a model
        without one gets the tokenizer's pad (else eos) id written into its config."""
        text_config = self.model.config.get_text_config()
        if text_config.pad_token_id is not None:
            return int(text_config.pad_token_id)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        if pad is None:
            raise ConfigError("the reward model and its tokenizer define neither a pad nor an eos token")
        log.info("reward model: config.pad_token_id is unset; using the tokenizer's %d", pad)
        text_config.pad_token_id = int(pad)
        return int(pad)

    def _context_length(self) -> int:
        config = self.model.config.get_text_config()
        for name in ("max_position_embeddings", "n_positions"):
            if isinstance(getattr(config, name, None), int):
                return int(getattr(config, name))
        return 2048

    def encode(self, task: Task, completion: str) -> list[int]:
        """Token ids of the pair (before truncation); see ``reward_text_ids`` and ``with_reference``."""
        prompt = with_reference(task.prompt, self.reference_template, task.answer)
        return reward_text_ids(self.tokenizer, prompt, completion)

    def row(self, task: Task, completion: str) -> tuple[list[int], int]:
        """The pair's ids as scored (the last ``max_length``) and where its completion begins in them: read
        by a model that scores the completion's tokens (``rewards.arm``), else 0."""
        if not reads_completion(self.model):
            return self._truncate(self.encode(task, completion)), 0
        [(ids, start)] = ids_and_start(self.tokenizer, with_reference(task.prompt, self.reference_template,
                                                                      task.answer), completion)
        kept = self._truncate(ids)
        return kept, max(0, start - (len(ids) - len(kept)))

    def _truncate(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.max_length:
            return ids
        if self.truncated == 0:
            log.warning("reward model: a sequence of %d tokens keeps its last %d (max_length)", len(ids), self.max_length)
        self.truncated += 1
        return ids[-self.max_length :]

    @torch.inference_mode()
    def raw_scores(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        """The head's scalar for every pair, unnormalised, in order (batches of similar lengths)."""
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
        encoded = [self.row(t, c) for t, c in zip(tasks, completions, strict=True)]
        if any(not ids for ids, _ in encoded):
            raise ValueError("a (prompt, completion) pair encodes to no tokens")
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
        scores = [0.0] * len(encoded)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            with self.model_lock:
                logits = self.logits([encoded[i] for i in rows])
            for r, value in zip(rows, self._one_score(logits).tolist(), strict=True):
                scores[r] = value
        return scores

    def logits(self, rows: Sequence[tuple[list[int], int]]) -> torch.Tensor:
        """``[len(rows), heads]`` (at least float32): the ``row``s right-padded into one forward."""
        ids, mask = right_padded([r for r, _ in rows], self.pad_id)
        completion = completion_mask([len(r) for r, _ in rows], [s for _, s in rows], ids.shape[1])
        d = self.device
        return at_least_float32(forward_scores(self.model, ids.to(d), mask.to(d), completion.to(d)))

    def _one_score(self, logits: torch.Tensor) -> torch.Tensor:
        """``[batch, heads]`` -> ``[batch]``: a single head as it is, several through the aggregate."""
        if logits.shape[-1] == 1:
            return logits[:, 0]
        entry = self.aggregate
        return entry.fn(logits, self.aggregate_cfg) if "cfg" in entry.params else entry.fn(logits)

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        """The rewards: raw scores through the transform, then running-normalised with ``normalise="running"``."""
        rewards = self.transformed(tasks, self.raw_scores(tasks, completions))
        if self.normalise == "none":
            return rewards
        with self._lock:
            self.norm.update(rewards)
            mean, std = self.norm.mean, self.norm.std
        return [(s - mean) / (std + self.eps) for s in rewards]

    def transformed(self, tasks: Sequence[Task], raw: list[float]) -> list[float]:
        """``raw`` through the transform (``algo.reward_transforms``), given what it reads: the running
        statistics of the raw scores (this call's included) and the tasks' reference rewards."""
        params = self.transform.params
        with self._lock:  # every transform may read them; kept whatever the transform (a few floats)
            self.raw_stats.update(raw)
            mean, std = self.raw_stats.mean, self.raw_stats.std
        inputs: dict[str, Any] = {"scores": torch.tensor(raw, dtype=torch.float64), "mean": mean, "std": std,
                                  "cfg": self.transform_cfg}
        if "reference" in params:  # scored only for a transform that reads them
            inputs["reference"] = self._reference_tensor(tasks)
        return self.transform.fn(**{p: inputs[p] for p in params}).tolist()

    def _reference_tensor(self, tasks: Sequence[Task]) -> torch.Tensor:
        """``[len(tasks), M]``: each task's reference rewards (scored once per task id and kept), NaN-padded."""
        missing = {t.id: t for t in tasks if t.id not in self.reference_scores}
        if missing:
            pairs = [(t, r) for t in missing.values() for r in reference_responses(t)]
            scores = iter(self.raw_scores([t for t, _ in pairs], [r for _, r in pairs]))
            found = {tid: [next(scores) for _ in reference_responses(t)] for tid, t in missing.items()}
            with self._lock:
                self.reference_scores.update(found)
        rows = [self.reference_scores[t.id] for t in tasks]
        out = torch.full((len(rows), max(map(len, rows))), float("nan"), dtype=torch.float64)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"normaliser": self.norm.state_dict(), "raw_stats": self.raw_stats.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.norm.load_state_dict(state["normaliser"])
        if "raw_stats" in state:
            self.raw_stats.load_state_dict(state["raw_stats"])


def reference_responses(task: Task) -> list[str]:
    """The responses a task's reward is centred on (``par``): ``metadata["reference_responses"]`` (e.g. the
    starting policy's samples, as Fu et al. 2025 use), else its reference answer alone."""
    given = task.metadata.get("reference_responses")
    if given:
        if not isinstance(given, list) or not all(isinstance(r, str) and r for r in given):
            raise ConfigError(f"task {task.id}: metadata.reference_responses must be a list of non-empty strings")
        return given
    if not task.answer:
        raise ConfigError(f"task {task.id}: a reward centred on reference responses needs "
                          "metadata.reference_responses or a reference answer; it has neither")
    return [task.answer]


def _settings(entry: Any, given: Any) -> Any:
    """The part's settings as configured, else its defaults (None for a part without settings)."""
    return given if given is not None or entry.settings is None else entry.settings()


class RewardModelVerifier:
    """A Verifier over a scorer: ``reward = score``, ``correct = score > threshold``. It scores one
    sample per call; a loop that has the whole batch should call ``scorer.score`` once instead."""

    def __init__(self, scorer: RewardModelScorer, threshold: float = 0.0) -> None:
        self.scorer, self.threshold = scorer, threshold

    def __call__(self, task: Task, completion: str) -> RewardResult:
        value = self.scorer.score([task], [completion])[0]
        return RewardResult(value, value > self.threshold, None)

    def state_dict(self) -> dict[str, Any]:
        return self.scorer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scorer.load_state_dict(state)
