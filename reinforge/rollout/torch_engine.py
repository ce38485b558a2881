"""Batched sampling with a KV cache over any HF causal LM, in plain torch.

All sequences of a chunk advance together: one forward per decode step for the whole batch,
sampling on tensors, finished rows masked. Prompts are left-padded; position ids come from the
attention mask, so every row sees exactly the positions it would see alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from reinforge.errors import ConfigError, ReinforgeError
from reinforge.models.lean_llama import SUPPORTED_MODEL_TYPES, LeanLlama
from reinforge.models.lean_llama import supports as lean_supports
from reinforge.models.lean_lora import AdapterWeights
from reinforge.models.loading import load_processor
from reinforge.models.precision import compute_dtype
from reinforge.models.vlm_inputs import image_token_id, stack_rows
from reinforge.rollout.continuous import StepCallback, generate_continuous
from reinforge.rollout.decoding import HFDecoder, LeanDecoder, left_pad
from reinforge.rollout.engines import own_copy, register_engine
from reinforge.rollout.sampling import sample_tokens
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams

log = logging.getLogger(__name__)

WeightPoll = Callable[[], "tuple[Mapping[str, Tensor] | nn.Module, int] | None"]
"""Called between decode steps: returns new weights and their version for the engine to apply, or
None (it may also apply them itself with ``update_weights``, e.g. under a shared-memory lock)."""


@register_engine("torch", description="the in-process engine: continuous batching over the policy's own copy",
                 replicable=True, takes_adapters=True)
class TorchRolloutEngine:
    """Rollout engine over an HF causal LM that it owns (a copy of the learner's weights).

    ``update_weights`` copies new weights into the engine's model in place (no reload, no
    reallocation) and bumps the policy version that every generation carries; call it between
    ``generate`` calls (the "wait for in-flight requests" mode).

    In-flight updates: ``stage_weights`` (from any thread) or a ``weight_poll`` hook hands the
    engine new weights that it applies between two decode steps of a running ``generate``
    (continuous batching with the lean forward; other paths apply them when the call ends).
    Sequences in flight continue: their earlier tokens keep the old version, the tokens sampled
    after the switch carry the new one (``Generation.token_versions``), and the keys/values
    already cached were computed by the old weights (as in AReaL and PipelineRL; the learner's
    recomputed log-probs and the mismatch correction account for it).

    LoRA adapters, unmerged (adapter-only sync, docs/lora.md): ``update_adapter(name, weights)`` loads
    one adapter's A and B (``AdapterWeights``) beside the base, which stays as it is; a request names
    its adapter (``GenerationRequest.adapter``, else ``default_adapter``; until that one has arrived,
    the base), and one generation batch may mix adapters (models/lean_lora.py). Needs the lean forward
    (Llama, Qwen2).
    """

    @classmethod
    def from_config(cls, rollout: Any, policy: nn.Module, tokenizer, device: str, seed: int, model_path: str,
                    copy_policy: bool = True, adapter_rank: int | None = None) -> TorchRolloutEngine:
        """An engine over a copy of ``policy`` (``copy_policy=False``: over ``policy`` itself); with the model's
        image processor when it has one (``processor``: a vision-language model, rollout/vision.py).
        ``adapter_rank`` is not needed: the lean forward applies adapters of any rank."""
        engine = cls(own_copy(policy) if copy_policy else policy, tokenizer, device, seed=seed)
        engine.processor = processor_of(model_path)
        return engine

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_batch_sequences: int = 512,
        use_lean_forward: bool = True,
        continuous: bool = True,
        sync_every: int | None = None,
    ) -> None:
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.max_batch_sequences = max_batch_sequences
        self.version = 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = _eos_ids(model, tokenizer)
        self._lean = LeanLlama(self.model) if use_lean_forward and lean_supports(self.model) else None
        self._lean_stale = False  # the HF weights changed since the lean forward's fused copies were built
        self.continuous = continuous
        # decode steps between two host read-backs (rollout/continuous.py): a read-back stalls a GPU's queue,
        # and costs a CPU nothing while a masked step of a finished slot costs it a full one
        self.sync_every = sync_every or (8 if self.device.type == "cuda" else 1)
        self.weight_poll: WeightPoll | None = None
        self.processor: Any = None  # a vision-language model's AutoProcessor (from_config sets it)
        self._logged_pictures = False
        self._logprob_dtype = compute_dtype(next(self.model.parameters()).dtype)
        self._staged: tuple[Mapping[str, Tensor] | nn.Module, int] | None = None
        self._staged_lock = threading.Lock()
        self.default_adapter: str | None = None  # the adapter of requests that name none

    def stage_weights(self, state: Mapping[str, Tensor] | nn.Module, version: int) -> None:
        """Hand over new weights to apply at the next decode step (or the next ``generate``); the
        caller must not modify ``state`` until the engine's ``version`` reaches ``version``."""
        with self._staged_lock:
            self._staged = (state, version)

    def _apply_pending(self) -> bool:
        """Apply staged or polled weights, if any; True when the weights changed."""
        with self._staged_lock:
            update, self._staged = self._staged, None
        if update is None and self.weight_poll is not None:
            update = self.weight_poll()
        if update is None:
            return False
        self.update_weights(*update)
        return True

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def update_weights(self, state: Mapping[str, Tensor] | nn.Module, version: int) -> None:
        """Copy ``state`` (a state dict or a module with the same parameter names) in place. The lean forward's
        fused copies are rebuilt from them when it next runs (``lean``): an engine that only evaluates now and
        then (the loop's own in asynchronous RL) does not rebuild them at every update."""
        source = dict(state.named_parameters()) if isinstance(state, nn.Module) else state
        for name, param in self.model.named_parameters():
            param.copy_(source[name])
        self._lean_stale = True
        self.version = version

    @property
    def lean(self) -> LeanLlama | None:
        """The lean forward (None: the model's own), its fused weights up to date with the model's."""
        if self._lean is not None and self._lean_stale:
            self._lean.sync()
            self._lean_stale = False
        return self._lean

    @lean.setter
    def lean(self, lean: LeanLlama | None) -> None:
        self._lean, self._lean_stale = lean, False

    # ------------------------------------------------------------------ adapters
    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters this engine serves."""
        return list(self._lean.adapters.adapters) if self._lean is not None else []

    def update_adapter(self, name: str, weights: AdapterWeights, version: int | None = None) -> None:
        """Serve adapter ``name`` with ``weights`` (added, or replaced in place of the old ones; the engine
        copies them); ``version``: the policy version its generations carry from now on."""
        if self._lean is None:
            raise ReinforgeError(f"unmerged LoRA adapters need the lean forward, which supports model types "
                                 f"{sorted(SUPPORTED_MODEL_TYPES)}; this model is "
                                 f"{getattr(self.model.config, 'model_type', '?')!r} (use model.lora.sync=merged)")
        param = next(self.model.parameters())
        self._lean.adapters.set(name, weights.to(param.device, param.dtype))
        if version is not None:
            self.version = version

    def remove_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise KeyError(f"no adapter {name!r} (served: {self.adapters})")
        self._lean.adapters.remove(name)  # type: ignore[union-attr]

    def _adapter_rows(self, requests: list[GenerationRequest]) -> Tensor | None:
        """Each request's adapter index (-1: the base), or None when no request runs an adapter."""
        served = self.adapters
        names = [r.adapter or self.default_adapter for r in requests]
        unknown = {n for r, n in zip(requests, names, strict=True) if r.adapter is not None and n not in served}
        if unknown:
            raise ReinforgeError(f"requests name adapters {sorted(unknown)} that this engine does not serve "
                                 f"(it serves {served})")
        index = [served.index(n) if n in served else -1 for n in names]
        return torch.tensor(index, device=self.device) if any(i >= 0 for i in index) else None

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        on_step: StepCallback | None = None,
    ) -> list[Generation]:
        """``params.n`` completions for every request, in request order (sample index fastest).

        ``generator`` replaces the engine's own (e.g. a per-request seed); ``on_step`` sees every
        decode step (streaming, top log-probs)."""
        self._apply_pending()
        config = self.model.config
        limit = getattr(getattr(config, "get_text_config", lambda: config)(), "max_position_embeddings", None)
        longest = max((len(r.prompt_ids) for r in requests), default=0)
        if limit is not None and longest + params.max_new_tokens > limit:
            raise ReinforgeError(
                f"a prompt of {longest} tokens plus max_new_tokens={params.max_new_tokens} exceeds the model's "
                f"context of {limit} positions (max_position_embeddings); shorten the prompts or lower "
                "rollout.max_new_tokens"
            )
        pictures = any(r.model_inputs for r in requests)  # the HF forward's prefill takes them (docs/vision.md)
        if pictures and not self._logged_pictures:
            self._logged_pictures = True
            log.info("prompts with pictures: sampled through the model's own forward and cache (HF), a batch per "
                     "chunk: the lean forward and continuous batching have no vision tower")
        if self.lean is not None and self.continuous and not pictures:
            return generate_continuous(self, requests, params, generator or self.generator, on_step)
        per_chunk = max(1, self.max_batch_sequences // params.n)
        out: list[Generation] = []
        for start in range(0, len(requests), per_chunk):
            out.extend(self._generate_chunk(requests[start : start + per_chunk], params, generator, on_step, len(out)))
        return out

    @torch.no_grad()
    def _generate_chunk(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        on_step: StepCallback | None = None,
        row_offset: int = 0,
    ) -> list[Generation]:
        """Sample ``params.n`` completions per request; each prompt is prefilled once and its cache shared."""
        chunk = [(req, i) for req in requests for i in range(params.n)]
        unique_ids, unique_attention = left_pad([req.prompt_ids for req in requests], self.pad_id, self.device)
        attention = unique_attention.repeat_interleave(params.n, dim=0)
        batch = attention.shape[0]
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        eos = torch.tensor(sorted(self.eos_ids), device=self.device)

        tokens = torch.full((batch, params.max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros(batch, params.max_new_tokens, device=self.device, dtype=self._logprob_dtype)
        lengths = torch.full((batch,), params.max_new_tokens, dtype=torch.long, device=self.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)

        extra = prefill_inputs(requests, self.device)
        rows = self._adapter_rows(requests)
        if extra and rows is not None:
            raise ReinforgeError("prompts with pictures cannot be sampled with an unmerged LoRA adapter "
                                 "(model.lora.sync=adapter): use sync=merged")
        decoder = HFDecoder(self.model) if extra else self._decoder(
            len(requests), unique_ids.shape[1] + params.max_new_tokens, rows)
        logits = self._banned(decoder.start(unique_ids, unique_attention, params.n, **extra), extra)
        next_pos = positions[:, -1:] + 1
        steps_done = 0
        for t in range(params.max_new_tokens):
            tok, lp = sample_tokens(
                logits, params.temperature, params.top_k, params.top_p, params.greedy, generator or self.generator
            )
            tok = torch.where(finished, self.pad_id, tok)
            tokens[:, t], logprobs[:, t] = tok, torch.where(finished, 0.0, lp)
            if on_step is not None:
                live = (~finished).nonzero().squeeze(-1)
                on_step(live + row_offset, logits[live], tok[live], lp[live])
            newly_done = ~finished & torch.isin(tok, eos) & (not params.ignore_eos)
            if params.stop:
                newly_done |= ~finished & self._hits_stop(tokens[:, : t + 1], params.stop)
            lengths = torch.where(newly_done, t + 1, lengths)
            finished |= newly_done
            steps_done = t + 1
            if t + 1 == params.max_new_tokens or (t + 1) % self.sync_every == 0 and bool(finished.all()):
                break  # finished rows decode masked steps until the next check (one host read every sync_every)
            attention = torch.cat([attention, (~finished).long()[:, None]], dim=1)
            logits = self._banned(decoder.step(tok[:, None], attention, next_pos), extra)
            next_pos = next_pos + 1
        return self._collect(chunk, tokens[:, :steps_done], logprobs[:, :steps_done], lengths, finished)

    def _banned(self, logits: Tensor, extra: dict[str, Tensor]) -> Tensor:
        """With pictures, the image placeholder token is never sampled (a sampled one would be a picture
        without pixels in the learner's forward): its logit is -inf (the learner's softmax still counts it,
        a gap of log(1 - p(placeholder)) between the two log-probs, docs/vision.md)."""
        token = image_token_id(self.model) if extra else None
        return logits if token is None else logits.index_fill(-1, torch.tensor([token], device=logits.device),
                                                                float("-inf"))

    def _rows_hit_stop(self, tokens: Tensor, rows: Tensor, steps: Tensor, stop: Iterable[str]) -> Tensor:
        """For each (row, last step): does the row's text end with a stop string."""
        window = max(len(s) for s in stop)
        starts = (steps + 1 - window).clamp(min=0).tolist()
        ends = (steps + 1).tolist()
        seqs = [tokens[r, a:b].tolist() for r, a, b in zip(rows.tolist(), starts, ends, strict=True)]
        texts = self.tokenizer.batch_decode(seqs, skip_special_tokens=True)
        return torch.tensor([any(t.endswith(s) for s in stop) for t in texts], device=self.device)

    def _decoder(self, prompts: int, max_len: int, adapters: Tensor | None = None) -> HFDecoder | LeanDecoder:
        if self.lean is not None:
            return LeanDecoder(self.lean, prompts, max_len, adapters)
        return HFDecoder(self.model)

    def _hits_stop(self, tokens: Tensor, stop: Iterable[str]) -> Tensor:
        """Rows whose text ends with a stop string (a token holds >= 1 character, so the window suffices)."""
        window = max(len(s) for s in stop)
        texts = self.tokenizer.batch_decode(tokens[:, -window:].tolist(), skip_special_tokens=True)
        return torch.tensor([any(text.endswith(s) for s in stop) for text in texts], device=self.device)

    def _collect(self, chunk, tokens: Tensor, logprobs: Tensor, lengths: Tensor, finished: Tensor,
                 versions: Tensor | None = None) -> list[Generation]:
        lengths_l, finished_l = lengths.tolist(), finished.tolist()
        token_rows, logprob_rows = tokens.tolist(), logprobs.tolist()
        version_rows = versions.tolist() if versions is not None else None
        ids = [row[:n] for row, n in zip(token_rows, lengths_l, strict=True)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        out = []
        for i, (req, sample_index) in enumerate(chunk):
            token_versions = version_rows[i][: lengths_l[i]] if version_rows is not None else []
            out.append(Generation(
                request_id=req.request_id,
                prompt_ids=req.prompt_ids,
                token_ids=ids[i],
                logprobs=logprob_rows[i][: lengths_l[i]],
                finish_reason="stop" if finished_l[i] else "length",
                version=token_versions[0] if token_versions else self.version,
                text=texts[i],
                sample_index=sample_index,
                token_versions=token_versions,
            ))
        return out


def prefill_inputs(requests: list[GenerationRequest], device: torch.device) -> dict[str, Tensor]:
    """The requests' model inputs (``pixel_values``, ...) stacked along their first dimension (zero-padded:
    ``vlm_inputs.stack_rows``), for one prefill;
    {} when none has any. Requests with and without them cannot share a prefill: an error."""
    have = [bool(r.model_inputs) for r in requests]
    if not any(have):
        return {}
    if not all(have):
        raise ReinforgeError("a generation batch mixes prompts with pictures and prompts without: give every "
                             "task of a run images, or none")
    keys = set(requests[0].model_inputs)
    if any(set(r.model_inputs) != keys for r in requests):
        raise ReinforgeError(f"the prompts' model inputs differ in kind (expected {sorted(keys)} for every one)")
    return {k: stack_rows([r.model_inputs[k] for r in requests]).to(device) for k in sorted(keys)}


def processor_of(model_path: str | None) -> Any:
    """The model directory's processor (``models.loading.load_processor``), None for a text model or a path that
    is no model directory (an engine built over a model in memory)."""
    if not model_path:
        return None
    try:
        return load_processor(model_path)
    except ConfigError:
        return None


def _eos_ids(model: nn.Module, tokenizer) -> set[int]:
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    for value in (getattr(gen_cfg, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("the model and tokenizer define no EOS token; generation could never stop")
    return ids


