"""The policy's probability of the gold answer before every turn, for a part that declares the need
``answer_probs`` (IGPO's estimator, algo/igpo.py; Wang et al. 2025, arXiv:2510.14967).

After a step's rollout, for every kept row (replayed ones included; not demonstrations) and every
model turn k, the state s_k is the row's tokens before the turn (the prompt, the earlier turns and
their observations, up to where turn k's tokens begin); a single-turn row has one state, its prompt.
The gold answer is written with the estimator's ``answer_template`` (``{answer}`` the task's
``answer``), its three pieces tokenised apart (text before, answer, text after) and appended to s_k;
one teacher-forced forward pass of the current policy gives p_k = exp(mean of log pi over the
answer's tokens) at the sampling temperature (the authors' code: the actor's log-probs, averaged over
the ground-truth span of a pseudo answer turn, then exponentiated). Distinct states are scored once
(every episode of a group shares its first state), ``batch_size`` sequences per forward.

Why a stage and not a learner pass like ``ref_logp``: the scored sequences are not rows of the
training batch (one per turn, each ending in the gold answer), so they fit none of the learner's
per-row passes; the stage runs once per step in the learner's process, from the rollout engine's
copy of the policy (``engine.model``: ``rollout.engine: torch``; the weights that sampled the step, IGPO's
pi_theta at rollout time), without gradient and without touching the learner's model.

Each trajectory gets ``metadata['answer_probs']`` (p_k per turn); the producer below writes the
batch field ``answer_probs`` [N, T] (p_k on the tokens of turn k). Recomputed every step; nothing
kept across steps (nothing to checkpoint).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from reinforge.algo.igpo import FIELD
from reinforge.algo.objective import required_inputs
from reinforge.config import AlgoConfig
from reinforge.errors import ConfigError
from reinforge.orchestrate.batch_fields import produces
from reinforge.orchestrate.rollouts import KeptRowsStage
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory

PREFIX = "rollout/answer_probs"


def turn_starts(t: Trajectory) -> list[int]:
    """Where each model turn of ``t`` begins (single-turn: where its generated tokens begin)."""
    if t.turn_spans:
        return [start for start, _ in t.turn_spans]
    return [t.loss_mask.index(1)] if 1 in t.loss_mask else []


def answer_pieces(tokenizer: Any, template: str, answer: str) -> tuple[list[int], list[int]]:
    """(the tokens appended after a state, the slice of them that is the answer as [start, end))."""
    if "{answer}" not in template:
        raise ConfigError(f"algo.advantage.answer_template {template!r} must contain {{answer}}")
    before, after = template.split("{answer}", 1)
    enc = [tokenizer.encode(s, add_special_tokens=False) if s else [] for s in (before, answer, after)]
    return enc[0] + enc[1] + enc[2], [len(enc[0]), len(enc[0]) + len(enc[1])]


@torch.no_grad()
def answer_probabilities(model: torch.nn.Module, pad_id: int, states: Sequence[list[int]],
                         appended: Sequence[list[int]], spans: Sequence[list[int]], temperature: float,
                         batch_size: int = 32) -> list[float]:
    """exp(mean log pi(answer token | state, preceding appended tokens)) of each (state, appended) pair,
    ``batch_size`` right-padded sequences per forward; an empty answer gives 0."""
    device = next(model.parameters()).device
    out: list[float] = []
    for lo in range(0, len(states), batch_size):
        seqs = [list(s) + list(a) for s, a in zip(states[lo:lo + batch_size], appended[lo:lo + batch_size],
                                                    strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long, device=device)
        attention = torch.zeros_like(ids)
        score = torch.zeros((len(seqs), width), dtype=torch.bool, device=device)
        for i, (s, st, (a, b)) in enumerate(zip(seqs, states[lo:lo + batch_size], spans[lo:lo + batch_size],
                                                strict=True)):
            ids[i, : len(s)] = torch.tensor(s, device=device)
            attention[i, : len(s)] = 1
            score[i, len(st) + a : len(st) + b] = True
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / max(temperature, 1e-6)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        hit = score[:, 1:]
        mean = (logp * hit).sum(1) / hit.sum(1).clamp(min=1)
        out += torch.where(hit.any(1), mean.exp(), 0.0).tolist()
    return out


class AnswerProbs:
    """The work of the stage: ``__call__(tasks, trajectories, params)`` writes each trajectory's p_k and
    returns the step's counters (``rollout/answer_probs/*``)."""

    def __init__(self, engine: Any, template: str) -> None:
        if getattr(engine, "model", None) is None:
            raise ConfigError(f"algo.advantage: a part needs the policy's probability of the gold answer "
                              f"({FIELD}), scored by the rollout engine's model; {type(engine).__name__} has none "
                              "(rollout.engine: torch)")
        self.engine, self.template = engine, template

    def __call__(self, tasks: Mapping[str, Task], trajectories: Sequence[Trajectory],
                 params: SamplingParams) -> dict[str, float]:
        t0 = time.perf_counter()
        index: dict[tuple[int, ...], int] = {}
        states, appended, spans, where = [], [], [], []
        pieces: dict[str, tuple[list[int], list[int]]] = {}  # the answer's tokens, once per task (a group shares its task)
        for t in trajectories:
            if t.demonstration:
                continue
            if t.task_id not in pieces:
                pieces[t.task_id] = answer_pieces(self.engine.tokenizer, self.template, tasks[t.task_id].answer)
            tail, span = pieces[t.task_id]
            pos = []
            for start in turn_starts(t):
                key = (*t.token_ids[:start], -1, *tail)
                if key not in index:
                    index[key] = len(states)
                    states.append(t.token_ids[:start])
                    appended.append(tail)
                    spans.append(span)
                pos.append(index[key])
            where.append((t, pos))
        if not states:
            return {}
        probs = answer_probabilities(self.engine.model, self.engine.pad_id, states, appended, spans,
                                     params.temperature)
        gains = []
        for t, pos in where:
            p = [probs[i] for i in pos]
            t.metadata[FIELD] = p
            gains += [b - a for a, b in zip(p, p[1:], strict=False)]
        return {f"{PREFIX}/states": float(len(states)), f"{PREFIX}/prob_mean": sum(probs) / len(probs),
                f"{PREFIX}/gain_mean": sum(gains) / len(gains) if gains else 0.0,
                f"{PREFIX}/time_s": time.perf_counter() - t0}


class AnswerProbStage(KeptRowsStage):
    """p_k of every kept row's turns (``answer_probs``), from the current policy; nothing kept across steps."""

    name, writes = "answer_probs", ("kept.metadata.answer_probs",)


def answer_prob_stage(algo: Any, engine: Any, params: SamplingParams) -> AnswerProbStage | None:
    """The run's stage when a part declares ``answer_probs`` (None otherwise); the template from its settings."""
    if FIELD not in required_inputs(algo):
        return None
    template = getattr(algo.advantage.settings, "answer_template", "{answer}")
    return AnswerProbStage(AnswerProbs(engine, str(template)), params)


@produces(FIELD)
def _answer_probs(kept: list[Trajectory], width: int, algo: AlgoConfig) -> tuple[Tensor, ...]:
    return (per_turn_tensor(kept, width, FIELD),)


def per_turn_tensor(trajs: list[Trajectory], width: int, key: str) -> Tensor:
    """[N, width]: ``metadata[key][k]`` on the tokens of turn k of each row (a single-turn row: entry 0 on
    its generated tokens); 0 elsewhere and where a row has no entry."""
    out = torch.zeros((len(trajs), width))
    for i, t in enumerate(trajs):
        values = t.metadata.get(key) or []
        spans = t.turn_spans or ([(turn_starts(t)[0], len(t.token_ids))] if 1 in t.loss_mask else [])
        for (start, end), v in zip(spans, values, strict=False):
            out[i, start:end] = float(v)
    return out
