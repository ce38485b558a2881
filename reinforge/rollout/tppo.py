"""T-PPO's truncated rollouts (Fan et al. 2025, Truncated Proximal Policy Optimization, arXiv:2506.15050).

Every generation decodes at most ``window`` tokens (the paper's window length l) per step; one that has
neither ended (EOS, stop string) nor reached ``rollout.max_new_tokens`` (the paper's L) is carried to the
next step and continued there, from its prompt and every token it has so far, by the policy of that step.
A response thus spans up to ceil(L / l) steps, each of its windows sampled by the weights of its step:
the sampler keeps each token's policy version (``token_versions``) with the carried tokens.

What a step trains on (the paper's token filtering): each generation's *new* window only. Its earlier
windows are context, like the prompt (``Generation.prompt_ids`` = prompt + earlier tokens), trained on in
the steps that sampled them; the window's tokens are on-policy (sampled by this step's weights), so the
PPO ratio needs no correction for the older context. A window cut with budget left is marked
``extra['continues']``: it is not scored (no outcome yet), and the ``egae`` estimator bootstraps its
advantage with V(s_l) = V(s_{l-1}) (algo/advantage_estimators.py); the critic takes no target from it (learn/critic.py
``value_mask``). The window that ends a response is scored on the whole completion (``text``).

Successive batching: ``held()`` names the prompts with generations in flight and how many; the batch
source puts them first in the next step's tasks (each with that many samples) and draws only the rest
from the task sampler, so a step has ``rollout.prompts_per_step`` prompts with K = held + new in flight.
The carried generations are this part's state (``state_dict``: JSON in ``state.json``), restored exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from reinforge.registry import Settings
from reinforge.rollout.continuation import cut_at_stop
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams


class TPPOSettings(Settings):
    window: int = Field(256, ge=1, description="tokens each generation decodes per step (the paper's window "
                        "length l); a longer one is continued at the next step, up to rollout.max_new_tokens")


@GROUP_SAMPLERS.register(
    "tppo",
    formula="per step: y[j l : (j+1) l] ~ pi_step(. | x, y[:j l]) for each generation in flight; ended ones are "
            "replaced by new prompts (successive batching); train on the new window only",
    paper="Fan et al. 2025, Truncated Proximal Policy Optimization (arXiv:2506.15050)",
    settings=TPPOSettings,
    needs=("carry_over",),
)
class TruncatedRollouts:
    """T-PPO's truncated rollouts with carried generations (module docstring)."""

    def __init__(self, cfg: TPPOSettings | None = None) -> None:
        self.cfg = cfg or TPPOSettings()
        # request id -> {"prompt": ids, "samples": [{"tokens", "logprobs", "versions", "windows"}]}
        self.carried: dict[str, dict[str, Any]] = {}
        self._counters: dict[str, float] = {}

    def held(self) -> dict[str, int]:
        """The prompts (request ids) with generations in flight, and how many each has."""
        return {rid: len(e["samples"]) for rid, e in self.carried.items()}

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        if params.greedy:
            raise ValueError("rollout.group_sampler=tppo: greedy sampling (e.g. a ReMax baseline) is not supported")
        slots: list[tuple[GenerationRequest, dict[str, Any] | None]] = []
        fresh: list[GenerationRequest] = []
        for r in requests:
            entry = self.carried.get(r.request_id)
            if entry is not None and entry["prompt"] == list(r.prompt_ids) and len(entry["samples"]) == params.n:
                del self.carried[r.request_id]  # continued now; re-carried below if still unfinished
                slots += [(r, s) for s in entry["samples"]]
            else:
                fresh.append(r)
                slots += [(r, None)] * params.n
        first = self._decode_fresh(engine, fresh, params)
        rest = self._decode_carried(engine, [(r, s) for r, s in slots if s is not None], params)
        out = [self._piece(engine, r, s, rest.pop(0) if s is not None else first.pop(0), params) for r, s in slots]
        for k, g in enumerate(out):
            g.sample_index = k % params.n
        self._count(out, slots)
        return out

    def _decode_fresh(self, engine: Any, requests: list[GenerationRequest], params: SamplingParams) -> list[Generation]:
        if not requests:
            return []
        budget = min(self.cfg.window, params.max_new_tokens)
        return engine.generate(requests, dataclasses.replace(params, max_new_tokens=budget))

    def _decode_carried(self, engine: Any, slots: list[tuple[GenerationRequest, dict[str, Any]]],
                        params: SamplingParams) -> list[Generation]:
        """One window more of each carried generation (n = 1 each, one engine call per distinct budget)."""
        budgets = [min(self.cfg.window, params.max_new_tokens - len(s["tokens"])) for _, s in slots]
        out: list[Generation | None] = [None] * len(slots)
        for budget in sorted(set(budgets)):
            idx = [i for i, b in enumerate(budgets) if b == budget]
            reqs = [dataclasses.replace(slots[i][0], prompt_ids=list(slots[i][0].prompt_ids) + slots[i][1]["tokens"])
                    for i in idx]
            for i, g in zip(idx, engine.generate(reqs, dataclasses.replace(params, n=1, max_new_tokens=budget)),
                            strict=True):
                out[i] = g
        return [g for g in out if g is not None]

    def _piece(self, engine: Any, request: GenerationRequest, state: dict[str, Any] | None, gen: Generation,
               params: SamplingParams) -> Generation:
        """This step's window of one generation, its state carried on when it neither ended nor hit the limit."""
        state = state or {"tokens": [], "logprobs": [], "versions": [], "windows": 0}
        before = state["tokens"]
        tokens, logps, versions, finish = list(gen.token_ids), list(gen.logprobs), list(gen.token_versions), None
        cut = cut_at_stop(engine.tokenizer, before + tokens, params.stop, start=len(before) + 1) if before else None
        if cut is not None:  # a stop string that began in an earlier window ends here
            keep = cut - len(before)
            tokens, logps, versions, finish = tokens[:keep], logps[:keep], versions[:keep], "stop"
        elif gen.finish_reason == "stop":
            finish = "stop"
        total = len(before) + len(tokens)
        if finish is None and total >= params.max_new_tokens:
            finish = "length"
        state = {"tokens": before + tokens, "logprobs": state["logprobs"] + logps,
                 "versions": state["versions"] + versions, "windows": state["windows"] + 1}
        if finish is None:  # carried to the next step, in request order
            entry = self.carried.setdefault(request.request_id, {"prompt": list(request.prompt_ids), "samples": []})
            entry["samples"].append(state)
        text = engine.tokenizer.decode(state["tokens"], skip_special_tokens=True)
        extra = {"continues": finish is None, "tppo/window": state["windows"] - 1, "tppo/context_tokens": len(before)}
        return Generation(request.request_id, list(request.prompt_ids) + before, tokens, logps,
                          finish or "length", versions[0] if versions else gen.version, text,
                          extra=extra, token_versions=versions)

    def _count(self, out: list[Generation], slots: list[tuple[GenerationRequest, Any]]) -> None:
        self._counters = {
            "tokens_generated": float(sum(len(g.token_ids) for g in out)),
            "tppo/continuing": float(sum(g.extra["continues"] for g in out)),
            "tppo/ended": float(sum(not g.extra["continues"] for g in out)),
            "tppo/resumed": float(sum(s is not None for _, s in slots)),
            "tppo/context_tokens": float(sum(g.extra["tppo/context_tokens"] for g in out)),
        }

    def counters(self) -> dict[str, float]:
        return dict(self._counters)

    def state_dict(self) -> dict[str, Any]:
        return {"carried": {rid: {"prompt": e["prompt"], "samples": [dict(s) for s in e["samples"]]}
                            for rid, e in self.carried.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.carried = {rid: {"prompt": list(e["prompt"]), "samples": [dict(s) for s in e["samples"]]}
                        for rid, e in state.get("carried", {}).items()}
