"""The service's request bodies (the Tinker client's JSON, tinker 0.38) and its limits.

Unknown fields are ignored (newer clients add some); a wrong type or value is a 422 that names the
field's path (``forward_backward_input.data.0.loss_fn_inputs.target_tokens``). Shapes and sizes that
depend on several fields (a target per input token, tokens inside the vocabulary) are checked by
``check_datums``, with the same kind of message, before anything is queued.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from reinforge.errors import ReinforgeError


class FieldError(ReinforgeError):
    """A request the service refuses (422), naming the field at fault by its path."""

    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.status = field, message, status


class ServiceLimits(BaseModel):
    """What one request may ask for (``reinforge service --max-...``)."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(64 << 20, ge=1024, description="largest request body; 413 above")
    max_datums: int = Field(1024, ge=1, description="datums in one forward/forward_backward request")
    max_tokens: int = Field(65536, ge=1, description="tokens over all datums of one request")
    max_samples: int = Field(64, ge=1, description="num_samples of one sample request")
    max_new_tokens: int = Field(1024, ge=1, description="max_tokens of one sample request")
    max_models: int = Field(8, ge=1, description="training clients held at once (each its own model copy)")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class Chunk(_Body):
    type: Literal["encoded_text"] = "encoded_text"
    tokens: list[int]


class ModelInput(_Body):
    chunks: list[Chunk]

    def ints(self) -> list[int]:
        return [t for c in self.chunks for t in c.tokens]


class Tensor(_Body):
    data: list[float]
    dtype: Literal["float32", "int64"]
    shape: list[int] | None = None

    @field_validator("data", mode="before")
    @classmethod
    def _flat(cls, v: Any) -> Any:
        while isinstance(v, list) and v and isinstance(v[0], list):  # nested lists: flattened (shape says the rest)
            v = [x for row in v for x in row]
        return v


class Datum(_Body):
    model_input: ModelInput
    loss_fn_inputs: dict[str, Tensor]


class ForwardBackwardInput(_Body):
    data: list[Datum] = Field(min_length=1)
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None = None


class ForwardBackwardRequest(_Body):
    forward_backward_input: ForwardBackwardInput
    model_id: str
    seq_id: int | None = None
    forward_only: bool = False


class LoraConfig(_Body):
    rank: int = Field(32, ge=1, le=1024)
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


class CreateModelRequest(_Body):
    session_id: str
    model_seq_id: int = 0
    base_model: str
    lora_config: LoraConfig | None = None
    user_metadata: dict[str, Any] | None = None


class AdamParams(_Body):
    learning_rate: float = Field(1e-4, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)


class OptimStepRequest(_Body):
    model_id: str
    adam_params: AdamParams = Field(validation_alias=AliasChoices("adam_params", "optim_params"))
    seq_id: int | None = None


class ModelRequest(_Body):
    model_id: str
    seq_id: int | None = None


class SaveWeightsRequest(ModelRequest):
    path: str | None = None


class SaveForSamplerRequest(ModelRequest):
    path: str | None = None
    sampling_session_seq_id: int | None = None


class LoadWeightsRequest(_Body):
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    path: str
    optimizer: bool = False


class CreateSessionRequest(_Body):
    tags: list[str] = []
    user_metadata: dict[str, Any] | None = None
    sdk_version: str = ""


class SessionRequest(_Body):
    session_id: str


class CreateSamplingSessionRequest(_Body):
    session_id: str
    sampling_session_seq_id: int = 0
    base_model: str | None = None
    model_path: str | None = None


class SamplingParams(_Body):
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(1.0, ge=0)
    top_k: int = -1
    top_p: float = Field(1.0, gt=0, le=1)


class SampleRequest(_Body):
    prompt: ModelInput
    sampling_params: SamplingParams
    num_samples: int = Field(1, ge=1)
    sampling_session_id: str | None = None
    base_model: str | None = None
    model_path: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = Field(0, le=0, description="top-k prompt log-probs are not served")
    topk_sample_logprobs: int = Field(0, le=0, description="top-k sample log-probs are not served")


class RetrieveFutureRequest(_Body):
    request_id: str
    allow_metadata_only: bool = False


def check_datums(req: ForwardBackwardRequest, vocab: int, limits: ServiceLimits) -> None:
    """Every datum's shape against its inputs; ``FieldError`` naming the first field at fault."""
    data = req.forward_backward_input.data
    if len(data) > limits.max_datums:
        raise FieldError("forward_backward_input.data", f"{len(data)} datums; at most {limits.max_datums} (max_datums)")
    total = 0
    for i, datum in enumerate(data):
        where = f"forward_backward_input.data.{i}"
        tokens = datum.model_input.ints()
        total += len(tokens)
        if not tokens:
            raise FieldError(f"{where}.model_input", "no tokens")
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise FieldError(f"{where}.model_input", f"token {bad[0]} outside the vocabulary [0, {vocab})")
        for name, tensor in datum.loss_fn_inputs.items():
            if len(tensor.data) != len(tokens):
                raise FieldError(f"{where}.loss_fn_inputs.{name}",
                                 f"{len(tensor.data)} values for {len(tokens)} input tokens (one per token)")
            if not all(math.isfinite(x) for x in tensor.data):
                raise FieldError(f"{where}.loss_fn_inputs.{name}", "every value must be a finite number")
        _check_targets(datum, tokens, vocab, f"{where}.loss_fn_inputs.target_tokens")
    if total > limits.max_tokens:
        raise FieldError("forward_backward_input.data", f"{total} tokens; at most {limits.max_tokens} (max_tokens)")


def _check_targets(datum: Datum, tokens: list[int], vocab: int, where: str) -> None:
    """``target_tokens`` is the input shifted by one (the next token at every position), in the vocabulary."""
    target = datum.loss_fn_inputs.get("target_tokens")
    if target is None:
        raise FieldError(where, "required (the next token at every input position)")
    if any(x != int(x) for x in target.data):
        raise FieldError(where, "token ids are whole numbers")
    ints = [int(x) for x in target.data]
    if ints[:-1] != tokens[1:]:
        raise FieldError(where, "must be model_input shifted by one (target_tokens[i] = model_input[i + 1], "
                                "the last one the sequence's next token); other targets are not supported")
    if not 0 <= ints[-1] < vocab:
        raise FieldError(where, f"token {ints[-1]} outside the vocabulary [0, {vocab})")
