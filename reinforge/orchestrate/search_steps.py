"""StepSearch's step rewards, for a part that declares the need ``search_steps`` (the ``stepsearch``
estimator, algo/stepsearch.py; Wang et al. 2025, arXiv:2505.15107).

After a step's rollout, for every kept multi-turn row (not demonstrations): the documents retrieved
at turn k are the non-empty lines of the environment's answers to that turn
(``metadata["observations"][k]``, orchestrate/multi_turn.py: the search environment answers with one
passage a line; a line ``no results`` is none), the gold evidence is the task's
``metadata["evidence"]`` (data/search_corpus.py gives the passages that answer each question). The
similarity of a document to a gold one is the TF-IDF cosine of the two after SQuAD normalisation, the
vectoriser fitted on the document and the gold ones together (the authors' ``subm_tfidf_cosine``:
scikit-learn's defaults, rebuilt here: words of 2+ characters, smoothed idf ln((1+n)/(1+df)) + 1, raw
counts, l2 norm). c_{k,j} is the best over turn k's documents; a document is repeated when the same
text was retrieved before in the episode (earlier in the same turn too, as in the authors' code).
``search_step_scores`` (algo) turns these into IG_k and P_k, and the stage adds
lambda_s (IG_k - P_k) to the row's ``token_rewards`` at the last token of turn k (each term as the
estimator's settings switch it). A task without evidence gets no information gain (P_k still counts).
Each row keeps ``metadata["search_steps"]`` ([[IG_k, P_k], ...]). Nothing kept across steps.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reinforge.algo.objective import required_inputs
from reinforge.algo.stepsearch import search_step_scores
from reinforge.envs.search import normalize_answer
from reinforge.orchestrate.rollouts import Rollout, StatelessStage
from reinforge.types import Task, Trajectory

NEED = "search_steps"
PREFIX = "rollout/search_steps"
_WORD = re.compile(r"(?u)\b\w\w+\b")
_NONE = "no results"


def tfidf_cosines(text: str, golds: Sequence[str]) -> list[float]:
    """The TF-IDF cosine of ``text`` with each of ``golds`` (the vectoriser fitted on all of them); an empty
    ``text`` gives 0s."""
    if not text:
        return [0.0] * len(golds)
    words = [_WORD.findall(d.lower()) for d in (text, *golds)]
    df = Counter(w for ws in words for w in set(ws))
    idf = {w: math.log((1 + len(words)) / (1 + n)) + 1 for w, n in df.items()}

    def vec(ws: list[str]) -> dict[str, float]:
        v = {w: c * idf[w] for w, c in Counter(ws).items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

    q = vec(words[0])
    return [max(sum(x * g.get(w, 0.0) for w, x in q.items()), 0.0) for g in map(vec, words[1:])]


def turn_documents(t: Trajectory) -> list[list[str]]:
    """The documents retrieved at each model turn of ``t`` (none after a turn the environment did not answer)."""
    answers = t.metadata.get("observations") or []
    docs = []
    for k in range(len(t.turn_spans)):
        texts = answers[k] if k < len(answers) else []
        docs.append([line.strip() for text in texts for line in text.splitlines()
                     if line.strip() and line.strip().lower() != _NONE])
    return docs


def episode_scores(docs: list[list[str]], evidence: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(IG [K], P [K]) of one episode from its turns' documents and the gold evidence."""
    golds = [normalize_answer(e) for e in evidence]
    sim = torch.zeros((len(docs), len(golds)), dtype=torch.float64)
    repeated, retrieved, seen = torch.zeros(len(docs)), torch.zeros(len(docs)), set()
    for k, turn in enumerate(docs):
        for d in turn:
            if golds:
                sim[k] = torch.maximum(sim[k], torch.tensor(tfidf_cosines(normalize_answer(d), golds)))
            repeated[k] += d in seen
            seen.add(d)
        retrieved[k] = len(turn)
    return search_step_scores(sim, repeated, retrieved)


class SearchStepStage(StatelessStage):
    """Adds each kept row's step rewards to its ``token_rewards`` (module docstring); metrics ``rollout/search_steps/*``."""

    name = "search_steps"
    reads, writes = ("kept",), ("kept.token_rewards", "kept.metadata.search_steps")

    def __init__(self, scale: float, gain: bool, penalty: bool) -> None:
        self.scale, self.gain, self.penalty = scale, gain, penalty

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        gains, penalties, missing = [], [], 0
        for t in rollout.kept:
            if t.demonstration or not t.turn_spans:
                continue
            evidence = list(tasks[t.task_id].metadata.get("evidence") or [])
            missing += not evidence
            gain, penalty = episode_scores(turn_documents(t), evidence)
            step_r = self.scale * (gain * self.gain - penalty * self.penalty)
            t.token_rewards = list(t.token_rewards) + [0.0] * (len(t.token_ids) - len(t.token_rewards))
            for (_, end), r in zip(t.turn_spans, step_r.tolist(), strict=True):
                t.token_rewards[end - 1] += r
            t.metadata[NEED] = [[g, p] for g, p in zip(gain.tolist(), penalty.tolist(), strict=True)]
            gains += gain.tolist()
            penalties += penalty.tolist()
        if not gains:
            return {}
        return {f"{PREFIX}/turns": float(len(gains)), f"{PREFIX}/gain_mean": sum(gains) / len(gains),
                f"{PREFIX}/redundancy_mean": sum(penalties) / len(penalties),
                f"{PREFIX}/rows_without_evidence": float(missing)}


def search_step_stage(algo: Any) -> SearchStepStage | None:
    """The run's stage when a part declares ``search_steps`` (None otherwise), weighted by its settings."""
    if NEED not in required_inputs(algo):
        return None
    s = algo.advantage.settings
    return SearchStepStage(float(getattr(s, "step_scale", 1.0)), bool(getattr(s, "information_gain", True)),
                           bool(getattr(s, "redundancy_penalty", True)))
