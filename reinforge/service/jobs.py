"""What each computing request does, once validated: a function that returns the job to queue.

Each ``*_job`` checks what can be checked at once (the model exists, the datums fit it, the loss and its
config are known: ``FieldError`` otherwise, a 422 before anything is queued) and returns the work to
run on the service's thread, which builds the answer (``core.Result``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from reinforge.service import wire
from reinforge.service.core import Result, TrainingService
from reinforge.service.losses import resolve_loss
from reinforge.service.schema import (
    CreateModelRequest,
    ForwardBackwardRequest,
    LoadWeightsRequest,
    OptimStepRequest,
    SampleRequest,
    SaveForSamplerRequest,
    SaveWeightsRequest,
    check_datums,
)

Job = Callable[[], Result]


def create_model_job(svc: TrainingService, req: CreateModelRequest) -> Job:
    model_id = svc.model_id(req.session_id, req.model_seq_id)
    svc.base_path(req.base_model)

    def run() -> Result:
        return Result({"type": "create_model", "model_id": svc.create_model(model_id, req.base_model, req.lora_config)})
    return run


def forward_backward_job(svc: TrainingService, req: ForwardBackwardRequest) -> Job:
    state = svc.trainer(req.model_id)
    check_datums(req, state.vocab_size, svc.limits)
    fbi = req.forward_backward_input
    loss, config = resolve_loss(fbi.loss_fn, fbi.loss_fn_config)
    rows = [d.model_input.ints() for d in fbi.data]
    raw = [{k: t.data for k, t in d.loss_fn_inputs.items()} for d in fbi.data]
    targets = [[int(x) for x in r["target_tokens"]] for r in raw]
    for i, inputs in enumerate(raw):  # the loss's inputs must be there before the job is queued
        missing = [k for k in loss.inputs if k not in inputs and k != "weights"]
        if missing:
            from reinforge.service.schema import FieldError

            raise FieldError(f"forward_backward_input.data.{i}.loss_fn_inputs.{missing[0]}", f"required by {fbi.loss_fn}")

    def run() -> Result:
        out = state.run(rows, targets, raw, (fbi.loss_fn, loss, config), backward=not req.forward_only)
        outputs = [{"logprobs": lp} for lp in out.logprobs]
        body = {"loss_fn_output_type": "ArrayRecord", "metrics": out.metrics, "loss_fn_outputs": [
            {"logprobs": {"data": lp.astype(np.float32).tolist(), "dtype": "float32", "shape": [len(lp)]}}
            for lp in out.logprobs]}
        return Result(body, lambda: wire.encode_forward_backward_output(outputs, out.metrics))
    return run


def optim_step_job(svc: TrainingService, req: OptimStepRequest) -> Job:
    state = svc.trainer(req.model_id)
    return lambda: Result({"type": "optim_step", "metrics": state.optim_step(req.adam_params)})


def save_weights_job(svc: TrainingService, req: SaveWeightsRequest) -> Job:
    state = svc.trainer(req.model_id)
    path, directory = svc.checkpoint_path(req.model_id, "weights", req.path)

    def run() -> Result:
        state.save(directory, svc.tokenizer(state.base_model))
        return Result({"type": "save_weights", "path": path})
    return run


def load_weights_job(svc: TrainingService, req: LoadWeightsRequest) -> tuple[Job, str | None]:
    """Into an existing training client (``model_id``), or into a new one (``session_id``: the
    checkpoint's base model and LoRA settings)."""
    checkpoint = svc.resolve_weights(req.path)
    if req.model_id is None:
        import json

        from reinforge.service.schema import LoraConfig

        model_id = svc.model_id(req.session_id or "", req.model_seq_id or 0)
        saved = json.loads((checkpoint / "state.json").read_text())
        lora = LoraConfig(**saved["lora"]) if saved.get("lora") else None

        def create_and_load() -> Result:
            svc.create_model(model_id, saved["base_model"], lora)
            try:
                svc.trainer(model_id).load(checkpoint, req.optimizer)
            except Exception:
                svc.trainers.pop(model_id, None)  # no half-made training client
                raise
            return Result({"type": "load_weights", "path": req.path, "model_id": model_id})
        return create_and_load, model_id
    state = svc.trainer(req.model_id)

    def run() -> Result:
        state.load(checkpoint, req.optimizer)
        return Result({"type": "load_weights", "path": req.path, "model_id": req.model_id})
    return run, req.model_id


def save_for_sampler_job(svc: TrainingService, req: SaveForSamplerRequest) -> Job:
    svc.trainer(req.model_id)
    path = svc.checkpoint_path(req.model_id, "sampler_weights", req.path)[0] if req.path else None

    def run() -> Result:
        saved, key = svc.snapshot_for_sampling(req.model_id, path)
        body: dict[str, Any] = {"type": "save_weights_for_sampler", "path": saved or None}
        if path is None:  # no name: a sampling session over the snapshot, as the client's
            body["sampling_session_id"] = svc.new_sampling_session(svc.trainer(req.model_id).base_model, key)
        return Result(body)
    return run


def sample_job(svc: TrainingService, req: SampleRequest) -> Job:
    from reinforge.service.schema import FieldError

    if req.sampling_session_id is not None:
        if req.sampling_session_id not in svc.sampling:
            raise FieldError("sampling_session_id", f"no such sampling session {req.sampling_session_id!r}", 404)
        base, key = svc.sampling[req.sampling_session_id]
    else:
        base, key = svc.sampling_target(req.base_model, req.model_path)
    limits = svc.limits
    if req.num_samples > limits.max_samples:
        raise FieldError("num_samples", f"{req.num_samples}; at most {limits.max_samples} (max_samples)")
    if (req.sampling_params.max_tokens or 0) > limits.max_new_tokens:
        raise FieldError("sampling_params.max_tokens", f"at most {limits.max_new_tokens} (max_new_tokens)")
    prompt = req.prompt.ints()
    if not prompt:
        raise FieldError("prompt", "no tokens")

    def run() -> Result:
        out = svc.sampler(base).sample(key, req)
        plp = out["prompt_logprobs"]
        body = {"type": "sample", "sequences": out["sequences"],
                "prompt_logprobs": None if plp is None else [None if np.isnan(x) else x for x in plp]}
        return Result(body, lambda: wire.encode_sample_response(out["sequences"], plp))
    return run
