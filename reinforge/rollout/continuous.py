"""The torch engine's continuous batching (lean forward): slots on the device, their bookkeeping on the host.

Every decode step is device work only: sample a token for every slot, write it to its output row (a free
slot writes to a scratch row), mark the slots that finished (EOS, a stop string, the token limit) free,
and run one forward over the slots. The host reads the slots' state back once every ``sync_every``
steps (one synchronisation): then the freed slots take waiting requests (prefill once per prompt, its
keys/values copied into its n slots) and, when nothing waits and at most half of the slots are busy, the
cache is compacted to the busy slots. Between two reads the host knows upper bounds of the slots'
positions and steps (from the step each was admitted at: ``HostSlots``), enough to size the attention
window and to stop at the token limit without asking the device. A slot that finishes between two reads
decodes masked steps until the next read (at most ``sync_every - 1``): the price of not synchronising
every token. Streaming callbacks and stop strings need the host every step and read back every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from reinforge.models.precision import at_least_float32
from reinforge.rollout.decoding import SlotOutputs, Slots, right_pad
from reinforge.rollout.sampling import sample_tokens
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams

StepCallback = Callable[[Tensor, Tensor, Tensor, Tensor], None]
"""``on_step(rows, logits, tokens, logprobs)`` after every decode step: output row ``rows[i]`` (in
``generate``'s order) sampled ``tokens[i]`` with log-prob ``logprobs[i]`` from ``logits[i]``."""

TorchRolloutEngine = Any  # rollout/torch_engine.py's engine, which imports this module (no import back)


@dataclass
class HostSlots:
    """The host's view of the slots since the last read: each slot's output row (-1 free), the decode
    step ``t`` it was admitted at and its prompt's length. With ``t`` the steps decoded so far, a slot
    still going is at position ``length + t - admitted`` and has sampled ``t - admitted`` tokens; one that
    finished since the last read is counted as going (upper bounds: enough for the attention window
    and the token limit)."""

    row: list[int]
    admitted: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    t: int = 0

    @classmethod
    def empty(cls, n: int) -> HostSlots:
        return cls([-1] * n, [0] * n, [0] * n)

    def busy(self) -> list[int]:
        return [i for i, r in enumerate(self.row) if r >= 0]

    def keep(self, kept: list[int]) -> None:
        self.row, self.admitted, self.length = ([xs[i] for i in kept] for xs in (self.row, self.admitted, self.length))

    def bounds(self, busy: list[int], max_new: int) -> tuple[int, int]:
        """(steps until every busy slot reaches the token limit, the largest ``length - admitted``): the
        attention window of a later step is that plus ``t + 1``."""
        latest = max(self.admitted[i] for i in busy)
        return max_new - (self.t - latest), max(self.length[i] - self.admitted[i] for i in busy)


def generate_continuous(engine: TorchRolloutEngine, requests: list[GenerationRequest], params: SamplingParams,
                        generator: torch.Generator, on_step: StepCallback | None) -> list[Generation]:
    """``params.n`` completions per request over ``engine.max_batch_sequences`` slots."""
    n, max_new, dev = params.n, params.max_new_tokens, engine.device
    if n > engine.max_batch_sequences:
        raise ValueError(f"n={n} samples per prompt exceed max_batch_sequences={engine.max_batch_sequences}")
    if any(not r.prompt_ids for r in requests):
        raise ValueError("empty prompt: a prompt needs at least one token (e.g. BOS)")
    n_slots = min(len(requests) * n, engine.max_batch_sequences // n * n)
    cache = engine.lean.new_slot_cache(n_slots, max(len(r.prompt_ids) for r in requests) + max_new)
    rows = len(requests) * n  # the output rows; row `rows` is the scratch row of free slots
    out = SlotOutputs.empty(rows + 1, max_new, engine.pad_id, engine.version, engine._logprob_dtype, dev)
    slots = Slots.empty(n_slots, engine.lean.embed.shape[0], engine._logprob_dtype, dev)
    host = HostSlots.empty(n_slots)
    adapters = engine._adapter_rows(requests)  # each request's adapter index, None: the base for all
    eos = torch.tensor(sorted(engine.eos_ids), device=dev)
    every = 1 if on_step is not None or params.stop else max(1, engine.sync_every)
    next_request, pending = 0, None
    while True:
        host.row = slots.row.tolist()  # the one read-back of these steps
        if pending is not None and max(host.row) >= 0:  # the last step's forward, if a slot goes on
            _forward(engine, slots, cache, *pending, adapters is not None)
        pending = None
        next_request += _admit(engine, requests, next_request, n, slots, host, cache, adapters)
        busy = host.busy()
        if not busy:
            break
        if next_request == len(requests) and 2 * len(busy) <= len(host.row):
            kept = torch.tensor(busy, device=dev)
            cache.keep(kept)
            slots.keep(kept)
            host.keep(busy)
            busy = list(range(len(busy)))
        left, offset = host.bounds(busy, max_new)
        for _ in range(min(every, left)):
            if pending is not None:
                _forward(engine, slots, cache, *pending, adapters is not None)
            pending = _sample_step(engine, out, slots, host, eos, params, generator, on_step, rows, offset)
    chunk = [(req, i) for req in requests for i in range(n)]
    return engine._collect(chunk, out.tok[:rows], out.lp[:rows], out.len[:rows], out.stop[:rows], out.ver[:rows])


def _sample_step(engine: TorchRolloutEngine, out: SlotOutputs, slots: Slots, host: HostSlots, eos: Tensor,
                 params: SamplingParams, generator: torch.Generator, on_step: StepCallback | None,
                 scratch: int, offset: int) -> tuple[Tensor, Tensor, int]:
    """Sample every slot's next token, record it and free the finished slots; returns the forward that
    feeds the tokens back (ids, the slots going on, the attention window), run only if a step follows."""
    live = slots.row >= 0
    tok, lp = sample_tokens(slots.logits, params.temperature, params.top_k, params.top_p, params.greedy, generator)
    row = torch.where(live, slots.row, scratch)
    step = slots.step.clamp(max=params.max_new_tokens - 1)
    # tensors on both sides: a Python scalar set through an index is copied from the host (a sync on a GPU)
    out.tok[row, step], out.lp[row, step], out.ver[row, step] = tok, lp, torch.full_like(tok, engine.version)
    if on_step is not None:  # read back every step (every == 1): the busy slots are exact
        busy = torch.tensor(host.busy(), device=slots.row.device)
        on_step(slots.row[busy], slots.logits[busy], tok[busy], lp[busy])
    done = live & _finished(engine, out, row, step, tok, eos, params)
    slots.row = torch.where(done, -1, slots.row)
    going = live & ~done
    width = offset + host.t + 1  # an upper bound of every going slot's position, plus one
    host.t += 1
    return torch.where(going, tok, engine.pad_id), going, width


def _forward(engine: TorchRolloutEngine, slots: Slots, cache, ids: Tensor, going: Tensor,
             width: int, adapted: bool = False) -> None:  # type: ignore[no-untyped-def]
    """One decode forward over the slots: the going slots' last tokens in, their next logits out
    (``adapted``: each slot under its LoRA adapter)."""
    if engine._staged is not None or engine.weight_poll is not None:
        engine._apply_pending()  # in-flight weight update: the next tokens get the new version
    slots.logits = at_least_float32(engine.lean.decode_slots(ids, torch.where(going, slots.pos, 0), cache, width,
                                                             slots.adapter if adapted else None))
    slots.pos += going
    slots.step += going


def _finished(engine: TorchRolloutEngine, out: SlotOutputs, row: Tensor, step: Tensor, tok: Tensor, eos: Tensor,
              params: SamplingParams) -> Tensor:
    """Which slots that just sampled ``tok`` at ``step`` are done (EOS, a stop string, the token limit);
    records their length and whether they stopped in their output ``row`` (free slots: the scratch row)."""
    done = torch.isin(tok, eos) if not params.ignore_eos else torch.zeros_like(tok, dtype=torch.bool)
    if params.stop:
        done |= engine._rows_hit_stop(out.tok, row, step, params.stop)
    out.stop[row] = done
    done = done | (step + 1 == params.max_new_tokens)
    out.len[row] = torch.where(done, step + 1, out.len[row])
    return done


def _admit(engine: TorchRolloutEngine, requests: list[GenerationRequest], start: int, n: int, slots: Slots,
           host: HostSlots, cache, adapters: Tensor | None = None) -> int:  # type: ignore[no-untyped-def]
    """Admit waiting requests from ``start`` into the free slots (prefill once per prompt, n slots each;
    ``adapters``: every request's adapter index)."""
    free = [i for i, r in enumerate(host.row) if r < 0]
    admit = min(len(free) // n, len(requests) - start)
    if not admit:
        return 0
    dev = slots.row.device
    batch = requests[start : start + admit]
    taken_l = free[: admit * n]
    taken = torch.tensor(taken_l, device=dev)
    lengths_l = [len(r.prompt_ids) for r in batch]
    lengths = torch.tensor(lengths_l, device=dev)
    ids = right_pad([r.prompt_ids for r in batch], engine.pad_id, dev)
    source = torch.arange(admit, device=dev).repeat_interleave(n)
    mine = adapters[start : start + admit] if adapters is not None else None
    prompt_logits = engine.lean.prefill_slots(ids, lengths, cache, taken, source, mine)
    if mine is not None:
        slots.adapter[taken] = mine[source]
    slots.logits[taken] = at_least_float32(prompt_logits[source])
    slots.row[taken] = torch.arange(start * n, (start + admit) * n, device=dev)
    slots.pos[taken] = lengths[source]
    slots.step.index_fill_(0, taken, 0)
    for j, i in enumerate(taken_l):
        host.row[i], host.admitted[i], host.length[i] = start * n + j, host.t, lengths_l[j // n]
    return admit
