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
(every episode of a group shares its first state), ``batch_size`` sequences per forward. The pass
(``TeacherForcing``, ``span_logprobs``: per-token log-probabilities, and ranks on request) is shared with the
reference-rewards stage (orchestrate/reference_rewards.py: RLPR's and DRO's rewards).

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

import math
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


def answer_probabilities(model: torch.nn.Module, pad_id: int, states: Sequence[list[int]],
                         appended: Sequence[list[int]], spans: Sequence[list[int]], temperature: float,
                         batch_size: int = 32) -> list[float]:
    """exp(mean log pi(answer token | state, preceding appended tokens)) of each (state, appended) pair,
    ``batch_size`` right-padded sequences per forward; an empty answer gives 0."""
    return [geometric_mean_prob(lp) for lp, _ in span_logprobs(model, pad_id, states, appended, spans, temperature,
                                                               batch_size)]


def geometric_mean_prob(logp: Sequence[float]) -> float:
    """exp(mean of the log-probabilities); 0 for none."""
    return math.exp(sum(logp) / len(logp)) if logp else 0.0


@torch.no_grad()
def span_logprobs(model: torch.nn.Module, pad_id: int, states: Sequence[list[int]], appended: Sequence[list[int]],
                  spans: Sequence[Sequence[int]], temperature: float, batch_size: int = 32,
                  ranks: bool = False) -> list[tuple[list[float], list[int]]]:
    """Teacher-forced: for each (state, appended) pair, log pi(token | state, the appended tokens before it)
    at ``temperature`` for the appended tokens in ``spans[i]`` = [start, end), and with ``ranks`` each one's
    rank among the vocabulary (1: the most likely token; else []). ``batch_size`` right-padded sequences
    per forward of ``model`` (no gradient); the answer-probabilities and reference-rewards stages' pass."""
    device = next(model.parameters()).device
    out: list[tuple[list[float], list[int]]] = []
    for lo in range(0, len(states), batch_size):
        seqs = [list(s) + list(a) for s, a in zip(states[lo:lo + batch_size], appended[lo:lo + batch_size],
                                                    strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long, device=device)
        attention = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, device=device)
            attention[i, : len(s)] = 1
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / max(temperature, 1e-6)
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(-1, ids[:, 1:, None])
        rank = (logp > picked).sum(-1) + 1 if ranks else None
        for i, (st, (a, b)) in enumerate(zip(states[lo:lo + batch_size], spans[lo:lo + batch_size], strict=True)):
            where = slice(len(st) + a - 1, len(st) + b - 1)  # logits at t predict token t + 1
            out.append((picked[i, where, 0].tolist(), rank[i, where].tolist() if rank is not None else []))
    return out


class TeacherForcing:
    """The sequences of one teacher-forced pass: a state (token ids) followed by a task's answer, written with
    ``template`` and tokenised once per task (``answer_pieces``; a group shares its task). ``add`` returns the
    sequence's index, the same for a sequence added again (scored once); ``run`` scores them all
    (``span_logprobs``). IGPO's answer probabilities and the reference-rewards stage build theirs."""

    def __init__(self, engine: Any, template: str) -> None:
        self.engine, self.template = engine, template
        self.index: dict[tuple[int, ...], int] = {}
        self.states: list[list[int]] = []
        self.appended: list[list[int]] = []
        self.spans: list[list[int]] = []
        self.pieces: dict[str, tuple[list[int], list[int]]] = {}

    def add(self, state: list[int], task: Task) -> int:
        if task.id not in self.pieces:
            self.pieces[task.id] = answer_pieces(self.engine.tokenizer, self.template, task.answer)
        tail, span = self.pieces[task.id]
        key = (*state, -1, *tail)
        if key not in self.index:
            self.index[key] = len(self.states)
            self.states.append(list(state))
            self.appended.append(tail)
            self.spans.append(span)
        return self.index[key]

    def __len__(self) -> int:
        return len(self.states)

    def run(self, temperature: float, ranks: bool = False) -> list[tuple[list[float], list[int]]]:
        return span_logprobs(self.engine.model, self.engine.pad_id, self.states, self.appended, self.spans,
                             temperature, ranks=ranks)


def needs_model(engine: Any, who: str) -> None:
    """A ``ConfigError`` naming ``who`` when the rollout engine has no model to score with (not torch)."""
    if getattr(engine, "model", None) is None:
        raise ConfigError(f"{who}, scored by the rollout engine's model; {type(engine).__name__} has none "
                          "(rollout.engine: torch)")


class AnswerProbs:
    """The work of the stage: ``__call__(tasks, trajectories, params)`` writes each trajectory's p_k and
    returns the step's counters (``rollout/answer_probs/*``)."""

    def __init__(self, engine: Any, template: str) -> None:
        needs_model(engine, f"algo.advantage: a part needs the policy's probability of the gold answer ({FIELD})")
        self.engine, self.template = engine, template

    def __call__(self, tasks: Mapping[str, Task], trajectories: Sequence[Trajectory],
                 params: SamplingParams) -> dict[str, float]:
        t0 = time.perf_counter()
        forced = TeacherForcing(self.engine, self.template)
        where = [(t, [forced.add(t.token_ids[:start], tasks[t.task_id]) for start in turn_starts(t)])
                 for t in trajectories if not t.demonstration]
        if not forced:
            return {}
        probs = [geometric_mean_prob(lp) for lp, _ in forced.run(params.temperature)]
        gains = []
        for t, pos in where:
            p = [probs[i] for i in pos]
            t.metadata[FIELD] = p
            gains += [b - a for a, b in zip(p, p[1:], strict=False)]
        return {f"{PREFIX}/states": float(len(forced)), f"{PREFIX}/prob_mean": sum(probs) / len(probs),
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
