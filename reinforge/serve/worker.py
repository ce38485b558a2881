"""The thread that owns the rollout engine: it batches concurrent requests and streams their tokens.

HTTP handlers submit ``Job``s; the worker takes the oldest one and every other waiting job with
the same sampling parameters (and no seed of its own), up to ``max_batch_sequences`` rows, and
runs them as one ``engine.generate`` call. A job with a ``seed`` runs alone with a generator
seeded from it, so the same request with the same seed gives the same completion. Weight updates
go through the same queue, so they never land in the middle of a generation.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from reinforge.rollout.types import GenerationRequest, SamplingParams

TokenEvent = tuple[int, int, float, list[tuple[int, float]]]
"""(row within the job, token id, log-prob, top alternatives [(token id, log-prob)])."""


@dataclass
class Job:
    """One request: prompts x ``params.n`` rows. ``on_token`` (if set) is called from the worker
    thread for every new token of every active row; the future resolves to (generations, top
    log-probs per row per token). ``model_inputs``: each prompt's (its pictures' ``pixel_values``; empty: text)."""

    prompts: list[list[int]]
    params: SamplingParams
    seed: int | None = None
    top_logprobs: int = 0
    on_token: Callable[[TokenEvent], None] | None = None
    future: Future = field(default_factory=Future)
    model_inputs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.params.n

    def batch_key(self) -> tuple | None:
        """Jobs with equal keys can share one generate call; a seeded job shares with nobody, and prompts with
        pictures share only with prompts whose model inputs are of the same kinds (one prefill takes them all)."""
        kinds = tuple(sorted({k for inputs in self.model_inputs for k in inputs}))
        return None if self.seed is not None else (self.params, kinds)


@dataclass
class _WeightUpdate:
    state: Mapping[str, Tensor]
    version: int
    future: Future = field(default_factory=Future)


class EngineWorker:
    def __init__(self, engine: Any, max_batch_sequences: int = 256) -> None:
        self.engine = engine
        self.max_batch_sequences = max_batch_sequences
        self._queue: queue.Queue = queue.Queue()
        self._held: list[Job] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reinforge-engine", daemon=True)
        self._thread.start()
        self.batches_run = 0

    def submit(self, job: Job) -> Future:
        self._queue.put(job)
        return job.future

    def update_weights(self, state: Mapping[str, Tensor], version: int) -> Future:
        update = _WeightUpdate(state, version)
        self._queue.put(update)
        return update.future

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ worker thread
    def _loop(self) -> None:
        while not self._stop.is_set():
            item = self._held.pop(0) if self._held else self._queue.get()
            if item is None:
                continue
            if isinstance(item, _WeightUpdate):
                self._apply(item)
                continue
            jobs = self._gather(item)
            try:
                self._run(jobs)
            except Exception as e:  # a failed batch fails its requests, not the server
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(e)

    def _gather(self, first: Job) -> list[Job]:
        """``first`` plus every waiting job that can share its batch (others are held, in order)."""
        jobs, rows, key = [first], first.rows, first.batch_key()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if (isinstance(item, Job) and key is not None and item.batch_key() == key
                    and rows + item.rows <= self.max_batch_sequences and not self._held):
                jobs.append(item)
                rows += item.rows
            else:
                self._held.append(item)
        return jobs

    def _apply(self, update: _WeightUpdate) -> None:
        try:
            self.engine.update_weights(update.state, update.version)
            update.future.set_result(update.version)
        except Exception as e:
            update.future.set_exception(e)

    def _run(self, jobs: list[Job]) -> None:
        params = jobs[0].params
        requests = [GenerationRequest(p, "", job.model_inputs[i] if job.model_inputs else {})
                    for job in jobs for i, p in enumerate(job.prompts)]
        starts, total = [], 0
        for job in jobs:
            starts.append(total)
            total += job.rows
        tops: list[list[list[tuple[int, float]]]] = [[] for _ in range(total)]
        want_steps = any(job.on_token is not None or job.top_logprobs for job in jobs)
        generator = None
        if jobs[0].seed is not None:
            generator = torch.Generator(device=self.engine.device).manual_seed(jobs[0].seed)

        owner = torch.empty(total, dtype=torch.long)  # job index of every output row
        for j, (job, start) in enumerate(zip(jobs, starts, strict=True)):
            owner[start : start + job.rows] = j

        def on_step(rows: Tensor, logits: Tensor, tokens: Tensor, logprobs: Tensor) -> None:
            k = max(job.top_logprobs for job in jobs)
            top_ids = top_lps = None
            if k:
                scaled = logits.float() if params.greedy else logits.float() / params.temperature
                top = torch.log_softmax(scaled, -1).topk(min(k, logits.shape[-1]), dim=-1)
                top_ids, top_lps = top.indices.tolist(), top.values.tolist()
            for i, (row, tok, lp) in enumerate(zip(rows.tolist(), tokens.tolist(), logprobs.tolist(), strict=True)):
                job = jobs[int(owner[row])]
                alternatives: list[tuple[int, float]] = []
                if job.top_logprobs and top_ids is not None and top_lps is not None:
                    alternatives = list(zip(top_ids[i][: job.top_logprobs], top_lps[i][: job.top_logprobs],
                                            strict=True))
                tops[row].append(alternatives)
                if job.on_token is not None:
                    job.on_token((row - starts[int(owner[row])], tok, lp, alternatives))

        generations = self.engine.generate(requests, params, generator, on_step if want_steps else None)
        self.batches_run += 1
        for job, start in zip(jobs, starts, strict=True):
            rows = slice(start, start + job.rows)
            job.future.set_result((generations[rows], tops[rows]))
