"""Micro sampling groups with length-aware scheduling, from Infinite Sampling (Wang et al. 2025,
"Infinite Sampling: Efficient and Stable Grouped RL Training for Large Language Models", arXiv:2506.22950).

A group of G completions of one prompt need not hold G KV-cache slots at once: it is split into G / g
micro-groups of g samples (``micro_group``), each one engine request that is admitted when g slots are
free (the engine's continuous batching: a finished sequence frees its slot, a waiting micro-group takes
it), under a cap of ``max_slots`` sequences decoded at once. Peak KV-cache memory then scales with
``max_slots`` (a multiple of g), not with G x prompts, and a group larger than the cap can still be
sampled. Every sample is an independent draw from pi(. | x), as in ``independent``: the schedule
decides when a sample is decoded, never what it is.

Length-aware scheduling: the micro-groups wait in shortest-predicted-first order (``order: sjf``, the
paper's runtime refill rule); a prompt's predicted length is the mean length of its last group (this
part's state, ``state_dict``), ``rollout.max_new_tokens`` for a prompt not seen yet. Each micro-group's
prompt is prefilled on admission (once per micro-group: G / g prefills of the prompt instead of one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from reinforge.errors import ReinforgeError
from reinforge.registry import Settings
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams


class MicroGroupSettings(Settings):
    micro_group: int = Field(2, ge=1, description="g: samples of a group admitted together; must divide "
                             "rollout.group_size")
    max_slots: int = Field(0, ge=0, description="sequences decoded at once (KV-cache slots; rounded down to a "
                           "multiple of micro_group); 0: the engine's max_batch_sequences")
    order: Literal["sjf", "fifo"] = Field("sjf", description="sjf: micro-groups of the prompts with the shortest "
                                          "predicted completions first (the paper's refill rule); fifo: request order")
    max_prompts: int = Field(4096, ge=1, description="prompts whose last mean length is kept (oldest dropped)")


@GROUP_SAMPLERS.register(
    "micro_groups",
    formula="group of G = G/g micro-groups of g samples, each admitted when g KV slots (of max_slots) are free, "
            "shortest predicted length first; every sample y ~ pi(. | x) independently",
    paper="Wang et al. 2025, Infinite Sampling (arXiv:2506.22950)",
    settings=MicroGroupSettings,
)
class MicroGroups:
    """Infinite Sampling's micro sampling groups with SJF refill (module docstring)."""

    def __init__(self, cfg: MicroGroupSettings | None = None) -> None:
        self.cfg = cfg or MicroGroupSettings()
        self.lengths: dict[str, float] = {}  # request id -> mean completion length of its last group
        self._counters: dict[str, float] = {}

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        g, n = min(self.cfg.micro_group, params.n), params.n
        if n % g:
            raise ReinforgeError(f"rollout.group_sampler.micro_group={g} does not divide rollout.group_size={n}")
        parts = [(k, start) for k, _ in enumerate(requests) for start in range(0, n, g)]
        if self.cfg.order == "sjf":
            parts.sort(key=lambda p: self._predicted(requests[p[0]], params))  # stable: request order on ties
        queue = [dataclasses.replace(requests[k], prompt_ids=list(requests[k].prompt_ids)) for k, _ in parts]
        limit = _slot_cap(engine, self.cfg.max_slots)
        with limit as cap:
            gens = engine.generate(queue, dataclasses.replace(params, n=g))
        out: list[Generation | None] = [None] * (len(requests) * n)
        for i, (k, start) in enumerate(parts):
            for j in range(g):
                gen = gens[i * g + j]
                gen.sample_index = start + j
                out[k * n + start + j] = gen
        done = [x for x in out if x is not None]
        self._remember(requests, done, n)
        self._counters = {"tokens_generated": float(sum(len(x.token_ids) for x in done)),
                          "micro_groups/slots": float(min(len(queue) * g, cap // g * g)),
                          "micro_groups/slots_whole_groups": float(min(len(requests) * n, limit.engine_limit // n * n))}
        return done

    def _predicted(self, request: GenerationRequest, params: SamplingParams) -> float:
        return self.lengths.get(request.request_id, float(params.max_new_tokens))

    def _remember(self, requests: Sequence[GenerationRequest], gens: list[Generation], n: int) -> None:
        for k, r in enumerate(requests):
            self.lengths.pop(r.request_id, None)  # re-inserted last: the newest prompts are kept
            self.lengths[r.request_id] = sum(len(x.token_ids) for x in gens[k * n:(k + 1) * n]) / n
        while len(self.lengths) > self.cfg.max_prompts:
            self.lengths.pop(next(iter(self.lengths)))

    def counters(self) -> dict[str, float]:
        return dict(self._counters)

    def state_dict(self) -> dict[str, Any]:
        return {"lengths": dict(self.lengths)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lengths = {str(k): float(v) for k, v in state.get("lengths", {}).items()}


class _slot_cap:
    """``engine.max_batch_sequences`` set to ``cap`` for one call (0: left as it is); yields the cap in force."""

    def __init__(self, engine: Any, cap: int) -> None:
        self.engine, self.cap = engine, cap
        self.before = getattr(engine, "max_batch_sequences", None)
        self.engine_limit = int(self.before) if self.before is not None else 1 << 30  # whole groups' slots
        if cap and self.before is None:
            raise ReinforgeError(f"rollout.group_sampler.max_slots: {type(engine).__name__} has no slot limit "
                                 "to set (max_batch_sequences; rollout.engine: torch)")

    def __enter__(self) -> int:
        if self.cap:
            self.engine.max_batch_sequences = self.cap
        return int(self.engine.max_batch_sequences) if self.before is not None else 1 << 30

    def __exit__(self, *exc: object) -> None:
        if self.cap:
            self.engine.max_batch_sequences = self.before
