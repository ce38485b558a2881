"""SPEC-RL (Liu et al. 2025, arXiv:2509.23232): the previous rollout of the same prompt as a draft.

Sample i of prompt x reuses, as a speculative draft, sample i of the last group this sampler drew for
x (the previous epoch's), whose tokens x_1..x_D were drawn from q_t (the policy of that time, the
distribution of each token recorded when it was sampled). The current policy pi scores the whole
draft in one forward (rollout/continuation.py) and keeps its tokens by speculative sampling
(rollout/speculative.py):

    a_t = min(1, pi_t(x_t) / q_t(x_t)); stop at the first rejection t*;
    resample t* from norm(max(0, pi_t* - q_t*)); decode on from there with pi.

``variant: exact`` (default) is that rule: the sample is distributed exactly as one drawn from pi,
given a draft drawn from q, and every returned log-prob is pi's (the accepted tokens' from the
verification forward, the others from the engine). It needs q_t's whole support at the rejected
position: a draft is used up to the first position whose recorded support has more than
``max_support`` tokens (with top-k <= max_support, or a vocabulary that small, always all of it).
``variant: lenient`` is the paper's rule: a_t = min(1, l * pi_t(x_t) / q_t(x_t)) with lenience
l = ``lenience`` >= 1, and position t* sampled afresh from pi; it needs only q_t(x_t) but biases the
sample towards the draft (even at l = 1, the token at t* then has law min(pi, q) + (1 - sum min) pi).

The cache (the last group of each prompt: tokens, finish, distributions) is this part's state
(``state_dict``, saved in checkpoints), bounded by ``max_cached_prompts`` (oldest dropped first).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from reinforge.registry import Settings
from reinforge.rollout.continuation import (
    Recorded,
    Sparse,
    continue_from,
    cut_at_stop,
    generate_recording,
    probability_of,
    rows_to_sparse,
    score_drafts,
    sparse_from_lists,
    sparse_to_lists,
    to_dense,
    to_sparse,
)
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.speculative import first_rejection, residual_distribution
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams


class SpecRLSettings(Settings):
    variant: Literal["exact", "lenient"] = Field("exact", description="exact: speculative sampling with the "
                                                 "residual (samples exactly from pi); lenient: the paper's rule")
    lenience: float = Field(1.0, ge=1.0, description="l in a_t = min(1, l pi/q) (lenient only)")
    max_support: int = Field(64, ge=1, description="exact: a draft is used up to the first token whose drafting "
                             "distribution had more than this many possible tokens")
    max_cached_prompts: int = Field(4096, ge=1, description="prompts whose last group is kept (oldest dropped)")

    @model_validator(mode="after")
    def _lenience_only_when_lenient(self) -> SpecRLSettings:
        if self.variant == "exact" and self.lenience != 1.0:
            raise ValueError("lenience: only the lenient variant takes a lenience (exact sampling needs l = 1)")
        return self


@dataclass
class Draft:
    tokens: list[int]
    complete: bool  # the draft ended by itself (EOS / stop string), not by a length limit or a cut
    dists: list[Sparse]


@dataclass
class _Piece:
    """One sample being built: the verified prefix (with pi's log-probs and distributions), and how it ended."""

    tokens: list[int]
    logps: list[float]
    dists: list[Sparse | None]
    accepted: int = 0
    finish: str | None = None  # set when the prefix is already the whole completion


@GROUP_SAMPLERS.register(
    "spec_rl",
    formula="draft = last rollout of (x, i); keep x_t w.p. min(1, l pi(x_t)/q(x_t)) until the first rejection t*; "
            "resample t* from norm(max(0, pi - q)) [exact] or pi [lenient]; decode on from pi",
    paper="Liu et al. 2025, SPEC-RL (arXiv:2509.23232); speculative sampling of Leviathan et al. 2023 "
          "(arXiv:2211.17192)",
    settings=SpecRLSettings,
)
class SpecRL:
    """SPEC-RL's speculative rollouts (module docstring)."""

    def __init__(self, cfg: SpecRLSettings | None = None) -> None:
        self.cfg = cfg or SpecRLSettings()
        self.cache: dict[str, dict[str, Any]] = {}
        self._counters: dict[str, float] = {}
        self._s_per_token: float | None = None

    # ------------------------------------------------------------------ sampling
    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        if params.greedy:  # nothing to speculate on, and greedy samples are no drafts
            out = engine.generate(list(requests), params)
            self._counters = {"tokens_generated": float(sum(len(g.token_ids) for g in out))}
            return out
        t0 = time.perf_counter()
        slots = [(r, i) for r in requests for i in range(params.n)]
        drafts = [self._draft(r, i, params) for r, i in slots]
        pieces = self._verify(engine, slots, drafts, params)
        t_verify = time.perf_counter()
        fresh = [r for k, r in enumerate(requests) if all(p is None for p in pieces[k * params.n:(k + 1) * params.n])]
        recorded = self._decode(engine, slots, pieces, fresh, params)
        gen_s = time.perf_counter() - t_verify
        out = [self._assemble(engine, r, i, piece, rec, params) for (r, i), piece, rec in zip(slots, pieces, recorded,
                                                                                               strict=True)]
        decoded = sum(len(rec.generation.token_ids) for rec in recorded if rec is not None)
        reused = sum(p.accepted for p in pieces if p is not None)
        resampled = sum(len(p.tokens) - p.accepted for p in pieces if p is not None)
        verify_s = t_verify - t0
        self._counters = {
            "tokens_generated": float(decoded + resampled), "tokens_reused": float(reused),
            "spec_rl/draft_tokens": float(sum(len(d.tokens) for d in drafts if d is not None)),
            "spec_rl/verify_s": verify_s,
        }
        if decoded:  # seconds per decoded token, smoothed over calls (for the estimate of the time saved)
            rate = gen_s / decoded
            self._s_per_token = rate if self._s_per_token is None else 0.8 * self._s_per_token + 0.2 * rate
        if self._s_per_token is not None:  # estimate: the reused tokens at the decoding rate, less the verification
            self._counters["spec_rl/time_saved_s"] = reused * self._s_per_token - verify_s
        return out

    def _draft(self, request: GenerationRequest, i: int, params: SamplingParams) -> Draft | None:
        entry = self.cache.get(request.request_id)
        if entry is None or entry["prompt"] != list(request.prompt_ids) or i >= len(entry["samples"]):
            return None
        s = entry["samples"][i]
        if s is None:
            return None
        tokens, dists = s["tokens"], s["dists"]
        usable = len(tokens)
        if self.cfg.variant == "exact":
            usable = next((t for t, d in enumerate(dists) if d is None), usable)  # None: a support too large
        usable = min(usable, params.max_new_tokens)
        complete = s["finish"] == "stop" and usable == len(tokens)
        return Draft(tokens[:usable], complete, dists[:usable]) if usable else None

    def _verify(self, engine: Any, slots: list[tuple[GenerationRequest, int]], drafts: list[Draft | None],
                params: SamplingParams) -> list[_Piece | None]:
        """The verified prefix of every slot with a draft (None for the others), all drafts at once."""
        have = [k for k, d in enumerate(drafts) if d is not None]
        pieces: list[_Piece | None] = [None] * len(slots)
        if not have:
            return pieces
        ds: list[Draft] = [drafts[k] for k in have]  # type: ignore[misc]
        probs, logp = score_drafts(engine, [slots[k][0].prompt_ids for k in have], [d.tokens for d in ds], params)
        probs, logp = probs.cpu(), logp.cpu()
        lengths = torch.tensor([len(d.tokens) for d in ds])
        toks = torch.zeros(probs.shape[:2], dtype=torch.long)
        q_tok = torch.ones(probs.shape[:2])
        for b, d in enumerate(ds):
            toks[b, : len(d.tokens)] = torch.tensor(d.tokens)
            q_tok[b, : len(d.tokens)] = torch.tensor([probability_of(q, x) for x, q in zip(d.tokens, d.dists,
                                                                                           strict=True)])
        u = torch.rand(probs.shape[:2], generator=engine.generator, device=engine.generator.device).cpu()
        first = first_rejection(probs.gather(-1, toks[..., None])[..., 0], q_tok, u, self.cfg.lenience,
                                lengths).tolist()
        kept_logp = logp.gather(-1, toks[..., None])[..., 0].tolist()
        dists = self._dists(probs.flatten(0, 1), toks.flatten())
        width = probs.shape[1]
        for b, (k, d, j) in enumerate(zip(have, ds, first, strict=True)):
            pieces[k] = _Piece(d.tokens[:j], kept_logp[b][:j], dists[b * width : b * width + j], accepted=j)
        self._resample(engine, [(pieces[k], d, probs[b, j], logp[b, j]) for b, (k, d, j)  # type: ignore[misc]
                                in enumerate(zip(have, ds, first, strict=True)) if j < len(d.tokens)], params)
        for k, d in zip(have, ds, strict=True):
            piece = pieces[k]
            assert piece is not None
            if piece.finish is None and piece.accepted == len(d.tokens) and d.complete:
                piece.finish = "stop"
            if piece.finish is None and len(piece.tokens) >= params.max_new_tokens:
                piece.finish = "length"
        return pieces

    def _resample(self, engine: Any, rejected: list[tuple[_Piece, Draft, torch.Tensor, torch.Tensor]],
                  params: SamplingParams) -> None:
        """Each first rejected position drawn from the residual norm(max(0, pi - q)) (exact) or pi (lenient)."""
        if not rejected:
            return
        targets = torch.stack([residual_distribution(p, to_dense(d.dists[piece.accepted], p.numel()).to(p))
                               if self.cfg.variant == "exact" else p for piece, d, p, _ in rejected])
        drawn = torch.multinomial(targets, 1, generator=engine.generator).squeeze(-1).tolist()
        for (piece, _, p, logp), y in zip(rejected, drawn, strict=True):
            piece.tokens.append(y)
            piece.logps.append(float(logp[y]))
            piece.dists.append(self._dist(p, y))
            if y in engine.eos_ids and not params.ignore_eos:
                piece.finish = "stop"

    def _dists(self, probs: torch.Tensor, tokens: torch.Tensor) -> list[Sparse | None]:
        """``_dist`` of every row of [N, V] (the token each row drew: ``tokens``)."""
        if self.cfg.variant == "lenient":
            return [(tokens[i : i + 1], probs[i, tokens[i]].reshape(1)) for i in range(tokens.numel())]
        return rows_to_sparse(probs, self.cfg.max_support)

    def _dist(self, probs: torch.Tensor, token: int) -> Sparse | None:
        """What the cache keeps of the distribution a token was drawn from (its probability only, lenient)."""
        if self.cfg.variant == "lenient":
            return torch.tensor([token]), probs[token : token + 1].cpu()
        return to_sparse(probs, self.cfg.max_support)

    def _decode(self, engine: Any, slots: list[tuple[GenerationRequest, int]], pieces: list[_Piece | None],
                fresh: list[GenerationRequest], params: SamplingParams) -> list[Recorded | None]:
        """Every unfinished slot's continuation: whole groups of prompts without drafts in one call (each
        prompt prefilled once), the others after their verified prefix."""
        support = self.cfg.max_support if self.cfg.variant == "exact" else 10**9
        out: list[Recorded | None] = [None] * len(slots)
        fresh_ids = {id(r) for r in fresh}
        if fresh:
            recs = iter(generate_recording(engine, list(fresh), params, support))
            for k, (r, _) in enumerate(slots):
                if id(r) in fresh_ids:
                    out[k] = next(recs)
        todo = [k for k, p in enumerate(pieces) if id(slots[k][0]) not in fresh_ids and (p is None or p.finish is None)]
        if todo:
            prefixes = [pieces[k].tokens if pieces[k] is not None else [] for k in todo]  # type: ignore[union-attr]
            recs_ = continue_from(engine, [slots[k][0].prompt_ids for k in todo], prefixes,
                                  [params.max_new_tokens - len(p) for p in prefixes], params, support,
                                  [slots[k][0].request_id for k in todo])
            for k, rec in zip(todo, recs_, strict=True):
                out[k] = rec
        return out

    def _assemble(self, engine: Any, request: GenerationRequest, i: int, piece: _Piece | None,
                  rec: Recorded | None, params: SamplingParams) -> Generation:
        piece = piece or _Piece([], [], [])
        tokens, logps, dists, finish = list(piece.tokens), list(piece.logps), list(piece.dists), piece.finish
        if rec is not None:
            tokens += rec.generation.token_ids
            logps += rec.generation.logprobs
            dists += [self._dist_of_recorded(d, x) for d, x in zip(rec.dists, rec.generation.token_ids, strict=True)]
            finish = rec.generation.finish_reason
        end = cut_at_stop(engine.tokenizer, tokens, params.stop, piece.accepted + 1) if piece.tokens else None
        if end is not None:  # a stop string across the verified prefix and the continuation
            tokens, logps, dists, finish = tokens[:end], logps[:end], dists[:end], "stop"
        self._store(request, i, params.n, tokens, finish or "length", dists)
        gen = Generation(request.request_id, list(request.prompt_ids), tokens, logps, finish or "length",  # type: ignore[arg-type]
                         engine.version, engine.tokenizer.decode(tokens, skip_special_tokens=True), i)
        if piece.accepted:  # the accepted draft tokens were not decoded for this sample
            gen.extra["tokens_reused"] = min(piece.accepted, len(tokens))
        return gen

    def _dist_of_recorded(self, dist: Sparse | None, token: int) -> Sparse | None:
        if self.cfg.variant == "lenient" and dist is not None:
            return torch.tensor([token]), torch.tensor([probability_of(dist, token)])
        return dist

    # ------------------------------------------------------------------ cache (the part's state)
    def _store(self, request: GenerationRequest, i: int, n: int, tokens: list[int], finish: str,
               dists: list[Sparse | None]) -> None:
        key = request.request_id
        entry = self.cache.pop(key, None)
        if entry is None or entry["prompt"] != list(request.prompt_ids) or len(entry["samples"]) != n:
            entry = {"prompt": list(request.prompt_ids), "samples": [None] * n}
        entry["samples"][i] = {"tokens": tokens, "finish": finish, "dists": dists}
        self.cache[key] = entry  # most recent last
        while len(self.cache) > self.cfg.max_cached_prompts:
            self.cache.pop(next(iter(self.cache)))

    def state_dict(self) -> dict[str, Any]:
        """The cache, JSON-able (each distribution as its support's ids and probabilities; [] for none)."""
        def plain(s: dict[str, Any] | None) -> dict[str, Any] | None:
            if s is None:
                return None
            pairs = [sparse_to_lists(d) for d in s["dists"]]
            return {"tokens": s["tokens"], "finish": s["finish"], "ids": [a for a, _ in pairs],
                    "probs": [b for _, b in pairs]}

        return {"cache": {k: {"prompt": e["prompt"], "samples": [plain(s) for s in e["samples"]]}
                          for k, e in self.cache.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def live(s: dict[str, Any] | None) -> dict[str, Any] | None:
            if s is None:
                return None
            dists = [sparse_from_lists(a, b) for a, b in zip(s["ids"], s["probs"], strict=True)]
            return {"tokens": s["tokens"], "finish": s["finish"], "dists": dists}

        self.cache = {k: {"prompt": e["prompt"], "samples": [live(s) for s in e["samples"]]}
                      for k, e in state.get("cache", {}).items()}

    def counters(self) -> dict[str, float]:
        return dict(self._counters)
