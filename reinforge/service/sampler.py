"""Sampling from saved weights: one torch rollout engine per base model, weight snapshots by sampling session.

A sampling session samples from fixed weights: the base model's, or a snapshot a training client took
(``save_weights_for_sampler``). Snapshots are held in memory (the ``max_snapshots`` newest; a session
whose snapshot was dropped is refused with a message saying so). The engine (``rollout/torch_engine.py``)
holds one set of weights at a time: before a request, the session's snapshot is copied into it when it
is not the one loaded. Requests run one at a time, in arrival order, on the service's sampling thread.

Semantics: ``temperature`` 0 is greedy; ``top_k`` -1 (Tinker's "off") is 0 here; ``stop`` strings end a
completion as in the rollout engine, stop token ids end it after the first such token; log-probs are
those of softmax(z / T), the distribution sampled from (before top-p/top-k).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from reinforge.service.schema import FieldError, SampleRequest

BASE = "base"


class Sampler:
    """The engine over one base model and the snapshots sampled from it."""

    def __init__(self, path: str, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 max_snapshots: int = 8) -> None:
        from reinforge.models.loading import load_model, load_tokenizer
        from reinforge.rollout.torch_engine import TorchRolloutEngine

        self.tokenizer = load_tokenizer(path)
        self.engine = TorchRolloutEngine(load_model(path, dtype, device), self.tokenizer, device, seed=seed)
        self.max_positions = int(getattr(self.engine.model.config, "max_position_embeddings", 1 << 30))
        base = {n: p.detach().clone() for n, p in self.engine.model.named_parameters()}
        self._snapshots: OrderedDict[str, dict[str, Tensor]] = OrderedDict({BASE: base})
        self._max = max_snapshots
        self._loaded = BASE
        self._lock = threading.Lock()  # snapshots arrive from the training thread while the sampling thread reads

    def add_snapshot(self, key: str, weights: dict[str, Tensor]) -> None:
        with self._lock:
            self._snapshots[key] = weights
            while len(self._snapshots) > self._max + 1:  # the base is never dropped
                oldest = next(k for k in self._snapshots if k != BASE)
                del self._snapshots[oldest]

    def _load(self, key: str) -> None:
        with self._lock:
            weights = self._snapshots.get(key)
        if weights is None:
            raise FieldError("sampling_session_id", "its weights snapshot was dropped (the service keeps the "
                             f"{self._max} newest); save the weights for sampling again")
        if key != self._loaded:
            self.engine.update_weights(weights, self.engine.version + 1)
            self._loaded = key

    def sample(self, key: str, req: SampleRequest) -> dict[str, Any]:
        """``req.num_samples`` completions of ``req.prompt`` under snapshot ``key``: each one's tokens,
        log-probs and stop reason, and the prompt's log-probs when asked for."""
        from reinforge.rollout.types import GenerationRequest, SamplingParams

        prompt = req.prompt.ints()
        vocab = int(self.engine.model.config.vocab_size)
        if any(not 0 <= t < vocab for t in prompt):
            raise FieldError("prompt", f"a token outside the vocabulary [0, {vocab})")
        p = req.sampling_params
        max_new = p.max_tokens or max(1, self.max_positions - len(prompt))
        if len(prompt) + max_new > self.max_positions:
            raise FieldError("sampling_params.max_tokens", f"a prompt of {len(prompt)} tokens plus {max_new} new "
                             f"ones exceeds the model's context of {self.max_positions} positions")
        stop_strings = tuple(s for s in ([p.stop] if isinstance(p.stop, str) else p.stop or []) if isinstance(s, str))
        stop_ids = {s for s in (p.stop if isinstance(p.stop, list) else []) if isinstance(s, int)}
        params = SamplingParams(max_new_tokens=max_new, temperature=p.temperature or 1.0, top_p=p.top_p,
                                top_k=max(p.top_k, 0), n=req.num_samples, greedy=p.temperature == 0,
                                stop=stop_strings)
        self._load(key)
        generator = None
        if p.seed is not None:
            generator = torch.Generator(device=self.engine.device).manual_seed(p.seed)
        gens = self.engine.generate([GenerationRequest(prompt)], params, generator=generator)
        out = {"sequences": [_cut(g.token_ids, g.logprobs, g.finish_reason, stop_ids) for g in gens]}
        out["prompt_logprobs"] = self._prompt_logprobs(prompt) if req.prompt_logprobs else None
        return out

    @torch.no_grad()
    def _prompt_logprobs(self, prompt: list[int]) -> list[float]:
        from reinforge.learn.logprobs import token_logprobs

        ids = torch.tensor([prompt], device=self.engine.device)
        logp = token_logprobs(self.engine.model, ids, torch.ones_like(ids))[0][0].float().tolist()
        return [math.nan] + logp[1:]


def _cut(tokens: list[int], logprobs: list[float], reason: str, stop_ids: set[int]) -> dict[str, Any]:
    """A completion ended after its first stop token id (kept, as an EOS is), if it has one."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return {"tokens": tokens[:i + 1], "logprobs": logprobs[:i + 1], "stop_reason": "stop"}
    return {"tokens": list(tokens), "logprobs": list(logprobs), "stop_reason": reason}
