"""The service's state: sessions, training clients, sampling sessions, checkpoints and futures.

Every request that computes (create a model, forward, forward_backward, optim_step, save, load,
sample) is validated when it arrives, then queued as a job and answered at once with a future id;
``/api/v1/retrieve_future`` long-polls it. Training jobs run one at a time, in arrival order, on one
thread (the Tinker client sends a training client's requests in its own order, one after another);
sampling jobs run on a second thread. A job is queued only once its request body has been read and
checked whole, so a client that disconnects mid-request leaves nothing behind.

Paths: ``tinker://<model_id>/weights/<name>`` (``save_state``: the weights and optimizer, under
``<checkpoint_dir>/<model_id>/weights/<name>``, written atomically) and
``tinker://<model_id>/sampler_weights/<name>`` (a weights snapshot for sampling, in memory).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.service.sampler import BASE, Sampler
from reinforge.service.schema import FieldError, LoraConfig, ServiceLimits
from reinforge.service.trainer import OwnCopyTrainer, TrainingState

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_MODEL_ID = re.compile(r"^[0-9a-f]{32}:train:\d+$")
KEEP_FUTURES = 4096


@dataclass
class Result:
    """A job's answer: JSON, and for forward passes and samples the protobuf the client asks for."""

    json: dict[str, Any]
    proto: Callable[[], bytes] | None = None


class TrainingService:
    """Training clients (each a ``TrainingState``), sampling sessions and the jobs' futures."""

    def __init__(self, models: dict[str, str], checkpoint_dir: Path, limits: ServiceLimits | None = None,
                 device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 make_state: Callable[..., TrainingState] | None = None) -> None:
        """``models``: the base models clients may name, each to its directory."""
        self.models, self.checkpoint_dir = models, Path(checkpoint_dir)
        self.limits = limits or ServiceLimits()
        self.device, self.dtype, self.seed = device, dtype, seed
        self.make_state = make_state or OwnCopyTrainer
        self.sessions: set[str] = set()
        self.trainers: dict[str, TrainingState] = {}
        self.sampling: dict[str, tuple[str, str]] = {}  # sampling session -> (base model, snapshot key)
        self.snapshot_paths: dict[str, tuple[str, str]] = {}  # sampler path -> (base model, snapshot key)
        self._samplers: dict[str, Sampler] = {}
        self._tokenizers: dict[str, Any] = {}
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._train = ThreadPoolExecutor(1, thread_name_prefix="service-train")
        self._sample = ThreadPoolExecutor(1, thread_name_prefix="service-sample")

    def close(self) -> None:
        self._train.shutdown(wait=False, cancel_futures=True)
        self._sample.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------------ futures
    def submit(self, fn: Callable[[], Result], sampling: bool = False, model_id: str | None = None
               ) -> dict[str, Any]:
        future = (self._sample if sampling else self._train).submit(fn)
        request_id = uuid.uuid4().hex
        with self._lock:
            self._futures[request_id] = future
            while len(self._futures) > KEEP_FUTURES and next(iter(self._futures.values())).done():
                self._futures.popitem(last=False)
        return {"request_id": request_id, "model_id": model_id}

    def future(self, request_id: str) -> Future:
        with self._lock:
            found = self._futures.get(request_id)
        if found is None:
            raise FieldError("request_id", f"no such request {request_id!r} (unknown, or answered long ago)", 404)
        return found

    # ------------------------------------------------------------------------------------------ lookups
    def session(self, session_id: str, field: str = "session_id") -> str:
        if session_id not in self.sessions:
            raise FieldError(field, f"no such session {session_id!r}; create one with /api/v1/create_session", 404)
        return session_id

    def trainer(self, model_id: str, field: str = "model_id") -> TrainingState:
        found = self.trainers.get(model_id)
        if found is None:
            raise FieldError(field, f"no such training client {model_id!r}", 404)
        return found

    def base_path(self, base_model: str, field: str = "base_model") -> str:
        if base_model not in self.models:
            raise FieldError(field, f"{base_model!r} is not served here; this service serves: {', '.join(self.models)}")
        return self.models[base_model]

    def tokenizer(self, base_model: str) -> Any:
        if base_model not in self._tokenizers:
            from reinforge.models.loading import load_tokenizer

            self._tokenizers[base_model] = load_tokenizer(self.base_path(base_model))
        return self._tokenizers[base_model]

    def sampler(self, base_model: str) -> Sampler:
        if base_model not in self._samplers:
            self._samplers[base_model] = Sampler(self.base_path(base_model), self.device, self.dtype, self.seed)
        return self._samplers[base_model]

    # ------------------------------------------------------------------------------------------ models
    def model_id(self, session_id: str, model_seq_id: int) -> str:
        """The id of a session's training client number ``model_seq_id`` (the client derives it the same way)."""
        self.session(session_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.trainers:
            raise FieldError("model_seq_id", f"{model_seq_id}: this session already has that training client")
        return model_id

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig | None) -> str:
        """A new training client's model (in the training thread); its id."""
        if len(self.trainers) >= self.limits.max_models:
            raise FieldError("base_model", f"this service holds at most {self.limits.max_models} training clients "
                             "(max_models)", 429)
        state = self.make_state(base_model, self.base_path(base_model), lora, self.device, self.dtype)
        self.trainers[model_id] = state
        return model_id

    def info(self, model_id: str) -> dict[str, Any]:
        state = self.trainer(model_id)
        path = self.base_path(state.base_model)
        return {"type": "get_info", "model_id": model_id, "model_name": state.base_model,
                "is_lora": state.lora is not None, "lora_rank": state.lora.rank if state.lora else None,
                "model_data": {"arch": "causal_lm", "model_name": state.base_model, "tokenizer_id": path}}

    # ------------------------------------------------------------------------------------------ checkpoints
    def checkpoint_path(self, model_id: str, kind: str, name: str | None, field: str = "path") -> tuple[str, Path]:
        """The tinker path of a checkpoint ``name`` (a fresh name when None) and its directory."""
        name = name or f"ckpt-{uuid.uuid4().hex[:12]}"
        if not _NAME.match(name):
            raise FieldError(field, f"{name!r}: a checkpoint name is 1-128 of A-Z a-z 0-9 . _ -")
        return f"tinker://{model_id}/{kind}/{name}", self.checkpoint_dir / model_id / kind / name

    def resolve_weights(self, path: str, field: str = "path") -> Path:
        """The checkpoint directory a ``tinker://<model_id>/weights/<name>`` path names."""
        parts = path.removeprefix("tinker://").split("/")
        if not path.startswith("tinker://") or len(parts) != 3 or parts[1] != "weights" or \
                not _MODEL_ID.match(parts[0]) or not _NAME.match(parts[2]):
            raise FieldError(field, f"{path!r}: expected tinker://<model_id>/weights/<name> (from save_state)")
        directory = self.checkpoint_dir / parts[0] / "weights" / parts[2] / "checkpoints" / "step_0"
        if not (directory / "manifest.json").is_file():
            raise FieldError(field, f"{path!r}: no such checkpoint", 404)
        return directory

    def snapshot_for_sampling(self, model_id: str, path: str | None) -> tuple[str, str]:
        """Copy the training client's weights for sampling; (sampler path or None, snapshot key)."""
        state = self.trainer(model_id)
        key = uuid.uuid4().hex
        self.sampler(state.base_model).add_snapshot(key, state.sampler_weights())
        if path is not None:
            self.snapshot_paths[path] = (state.base_model, key)
        return path or "", key

    def sampling_target(self, base_model: str | None, model_path: str | None) -> tuple[str, str]:
        """(base model, snapshot key) for a sampling session from a model path or a base model."""
        if model_path:
            if model_path not in self.snapshot_paths:
                raise FieldError("model_path", f"{model_path!r}: no such sampler weights (save_weights_for_sampler "
                                 "names them tinker://<model_id>/sampler_weights/<name>)", 404)
            return self.snapshot_paths[model_path]
        if not base_model:
            raise FieldError("base_model", "give base_model or model_path")
        self.base_path(base_model)
        return base_model, BASE

    def new_sampling_session(self, base_model: str, key: str) -> str:
        session = uuid.uuid4().hex
        self.sampling[session] = (base_model, key)
        return session
