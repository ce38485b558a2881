"""Rollouts through any OpenAI-compatible server (``reinforge serve``, vLLM, SGLang).

One ``/v1/completions`` request per chunk of prompts, prompts sent as token ids (no
re-tokenisation), ``n`` samples each, ``logprobs=0`` for the sampled tokens' log-probabilities.
The completion token ids come from the ``return_token_ids`` extension where the server has it
(reinforge, recent vLLM); otherwise the text is re-tokenised, which is not token-exact, and the
engine says so once. Each request carries a seed drawn from ``generator``, so a run is
reproducible (and resumable exactly) when the server honours seeds.

Prompts with pictures (``GenerationRequest.images``, rollout/vision.py) go one per ``/v1/chat/completions``
request instead: their messages with each picture as an ``image_url`` data-URL part (PNG), so any
OpenAI-compatible vision server takes them. The prompt's token ids the server reports (``return_token_ids``)
must equal the ones the collector encoded with the model's processor (what the learner trains on); a server
that renders the prompt differently is an error, never a silent mismatch. The engine loads the model's processor
(``processor``) so the collector can encode such prompts.

Weights: ``update_weights`` posts the learner's weights (safetensors) to ``/reinforge/weights``,
which a reinforge server applies between generations; with ``sync_weights=False`` (a server
whose weights are managed elsewhere) it only bumps the policy version.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor, nn

from reinforge.errors import ReinforgeError
from reinforge.rollout.engines import register_engine
from reinforge.rollout.torch_engine import processor_of
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.rollout.vision import with_image_urls


@register_engine("openai", description="any OpenAI-compatible server at rollout.server_url, its weights set "
                 "to the policy's over HTTP", replicable=False, needs_server=True)
class OpenAIRolloutEngine:
    reads_model_inputs = False  # the server is sent the pictures as image parts, never the processor's pixel values

    @classmethod
    def from_config(cls, rollout: Any, policy: nn.Module, tokenizer, device: str, seed: int, model_path: str,
                    copy_policy: bool = True) -> OpenAIRolloutEngine:
        """An engine driving ``rollout.server_url``, whose weights are set to ``policy``'s now (it keeps
        no copy: ``copy_policy`` does not apply); the server's API key, if it has one, comes from the
        ``REINFORGE_API_KEY`` environment variable (as ``reinforge serve --api-key`` reads it)."""
        engine = cls(rollout.server_url, rollout.server_model or model_path, tokenizer, seed=seed,
                     sync_weights=rollout.sync_weights, api_key=os.environ.get("REINFORGE_API_KEY") or "EMPTY")
        engine.processor = processor_of(model_path)
        engine.update_weights(policy, 0)
        return engine

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer,
        api_key: str = "EMPTY",
        seed: int = 0,
        prompts_per_request: int = 64,
        concurrency: int = 4,
        timeout_s: float = 600.0,
        sync_weights: bool = True,
    ) -> None:
        try:
            import openai
        except ImportError:
            raise ReinforgeError("rollout.engine=openai needs the openai package: pip install 'reinforge[serve]'") \
                from None
        self.base_url = base_url.rstrip("/")
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, timeout=timeout_s, max_retries=2)
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self.model_name = model
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.generator = torch.Generator().manual_seed(seed)
        self.prompts_per_request = prompts_per_request
        self.concurrency = concurrency
        self.sync_weights = sync_weights
        self.version = 0
        self._warned_retokenise = False
        self.processor: Any = None  # a vision-language model's (from_config sets it): the collector encodes pictures

    # ------------------------------------------------------------------ weights
    def update_weights(self, state: Mapping[str, Tensor] | nn.Module, version: int) -> None:
        if self.sync_weights:
            import httpx
            from safetensors.torch import save

            tensors = {k: v.detach().contiguous().cpu() for k, v in
                       (state.named_parameters() if isinstance(state, nn.Module) else state.items())}
            root = self.base_url.removesuffix("/v1")
            try:
                r = httpx.post(f"{root}/reinforge/weights", params={"version": version}, content=save(tensors),
                               headers=self._auth, timeout=self.client.timeout)
            except httpx.HTTPError as e:
                raise ReinforgeError(f"weight update to {root} failed: {e}") from None
            if r.status_code != 200:
                raise ReinforgeError(f"weight update to {root} failed ({r.status_code}): {r.text[:300]}. "
                                     "Only a reinforge server takes weights; set rollout.sync_weights=false "
                                     "for a server whose weights are managed elsewhere.")
        self.version = version

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Generation]:
        """``params.n`` completions for every request, in request order (sample index fastest)."""
        chunks: list[list[GenerationRequest]] = []  # runs of text prompts; a prompt with pictures alone
        for r in requests:
            if r.images or not chunks or chunks[-1][0].images or len(chunks[-1]) == self.prompts_per_request:
                chunks.append([r])
            else:
                chunks[-1].append(r)
        seeds = torch.randint(0, 2**31 - 1, (len(chunks),), generator=self.generator).tolist()
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(chunks)))) as pool:
            results = list(pool.map(lambda a: self._request(*a, params), zip(chunks, seeds, strict=True)))
        return [g for chunk in results for g in chunk]

    def _sampling(self, params: SamplingParams, seed: int) -> dict[str, Any]:
        return dict(model=self.model_name, n=params.n, max_tokens=params.max_new_tokens,
                    temperature=0.0 if params.greedy else params.temperature, top_p=params.top_p,
                    stop=list(params.stop) or None, seed=seed,
                    extra_body={"return_token_ids": True, **({"top_k": params.top_k} if params.top_k else {})})

    def _chat_request(self, req: GenerationRequest, seed: int, params: SamplingParams) -> list[Generation]:
        """``params.n`` completions of one prompt with pictures, through ``/v1/chat/completions``."""
        import openai

        try:
            response = self.client.chat.completions.create(
                messages=with_image_urls(req.messages or [], req.images), logprobs=True, **self._sampling(params, seed))
        except openai.OpenAIError as e:
            raise ReinforgeError(f"rollout request to {self.base_url} failed: {e}") from None
        choices = sorted(response.choices, key=lambda c: c.index)
        if len(choices) != params.n:
            raise ReinforgeError(f"{self.base_url} returned {len(choices)} choices for one prompt x n={params.n}")
        out = []
        for choice in choices:
            extra = choice.model_extra or {}
            if extra.get("prompt_token_ids") is not None and list(extra["prompt_token_ids"]) != req.prompt_ids:
                raise ReinforgeError(f"{self.base_url} rendered request {req.request_id!r}'s messages and pictures to "
                                     f"{len(extra['prompt_token_ids'])} prompt tokens, not the {len(req.prompt_ids)} "
                                     "the model's processor gives here: serve the same model directory")
            token_ids = extra.get("token_ids")
            if token_ids is None:
                token_ids = self._retokenise(choice.message.content or "")
            content = choice.logprobs.content if choice.logprobs and choice.logprobs.content else None
            logprobs = [c.logprob for c in content] if content else [0.0] * len(token_ids)
            out.append(self._generation(req, list(token_ids), logprobs, choice.finish_reason, choice.index))
        return out

    def _generation(self, req: GenerationRequest, token_ids: list[int], logprobs: list[float], finish: str | None,
                    index: int) -> Generation:
        if len(logprobs) != len(token_ids):
            raise ReinforgeError(f"{self.base_url}: {len(logprobs)} log-probs for {len(token_ids)} tokens")
        return Generation(
            request_id=req.request_id, prompt_ids=req.prompt_ids, token_ids=token_ids, logprobs=logprobs,
            finish_reason="stop" if finish == "stop" else "length", version=self.version,
            text=self.tokenizer.decode(token_ids, skip_special_tokens=True), sample_index=index,
        )

    def _request(self, chunk: list[GenerationRequest], seed: int, params: SamplingParams) -> list[Generation]:
        import openai

        if chunk[0].images:
            return self._chat_request(chunk[0], seed, params)

        try:
            response = self.client.completions.create(
                model=self.model_name, prompt=[r.prompt_ids for r in chunk], n=params.n,
                max_tokens=params.max_new_tokens, temperature=0.0 if params.greedy else params.temperature,
                top_p=params.top_p, stop=list(params.stop) or None, logprobs=0, seed=seed,
                extra_body={"return_token_ids": True, **({"top_k": params.top_k} if params.top_k else {})},
            )
        except openai.OpenAIError as e:
            raise ReinforgeError(f"rollout request to {self.base_url} failed: {e}") from None
        choices = sorted(response.choices, key=lambda c: c.index)
        if len(choices) != len(chunk) * params.n:
            raise ReinforgeError(f"{self.base_url} returned {len(choices)} choices for {len(chunk)} prompts x "
                                 f"n={params.n}")
        out = []
        for i, choice in enumerate(choices):
            req = chunk[i // params.n]
            extra = choice.model_extra or {}
            token_ids = extra.get("token_ids")
            text = choice.text
            if token_ids is None:
                token_ids = self._retokenise(choice.text)
            else:  # the text the tokens make, stop sequence included (as the torch engine returns it)
                text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
            logprobs = list(choice.logprobs.token_logprobs) if choice.logprobs else [0.0] * len(token_ids)
            if len(logprobs) != len(token_ids):
                raise ReinforgeError(f"{self.base_url}: {len(logprobs)} log-probs for {len(token_ids)} tokens")
            out.append(Generation(
                request_id=req.request_id, prompt_ids=req.prompt_ids, token_ids=list(token_ids), logprobs=logprobs,
                finish_reason="stop" if choice.finish_reason == "stop" else "length", version=self.version,
                text=text, sample_index=i % params.n,
            ))
        return out

    def _retokenise(self, text: str) -> list[int]:
        if not self._warned_retokenise:
            warnings.warn(f"{self.base_url} does not return token ids: completions are re-tokenised from text, "
                          "which may not match the sampled tokens", stacklevel=3)
            self._warned_retokenise = True
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
