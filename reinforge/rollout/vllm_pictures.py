"""Prompts with pictures as vLLM's token prompts (``rollout.engine: vllm``; docs/vision.md).

A ``GenerationRequest`` with pictures holds the prompt as the model's processor expanded it: each picture's
placeholder token repeated once per image feature (LLaVA's ``<image>`` 16 times for tiny-vlm's 32 x 32
pictures, Qwen2-VL's ``<|image_pad|>`` t * h * w / merge^2 times). The learner trains on those ids. vLLM 0.32
takes a token prompt with ``multi_modal_data`` and expands each placeholder itself (its multi-modal processor's
``PromptReplacement`` of ``[image_token]`` by the picture's feature count); given the expanded prompt it would
expand its first image token again. So ``vllm_prompt`` sends the prompt with each picture's run of image tokens
collapsed back to one token, and the pictures (the request's RGB PIL images, in order) as
``{"image": [...]}``; ``check_expanded`` then requires vLLM's expanded prompt (``RequestOutput.prompt_token_ids``)
to equal the request's, so the log-probs vLLM reports are those of the sequence the learner scores.

Weights: transformers 5 names a CLIP or SigLIP vision tower's weights ``vision_tower.embeddings...``, vLLM 0.32's
LLaVA loads transformers 4's ``vision_tower.vision_model.embeddings...``; ``tower_name`` puts the level back, in
the checkpoint written for vLLM (``rename_checkpoint``) and in every weight update.

Families (``model_type``): LLaVA, Qwen2-VL and Qwen2.5-VL, whose processors expand a picture into one run of
its image token. Idefics3 / SmolVLM wrap each (sub-)picture in boundary and row/column tokens that vLLM's
processor writes itself from one ``<image>``: refused (``rollout.engine=torch`` runs them). Pictures per prompt
(vLLM's ``limit_mm_per_prompt``): 1 for LLaVA (its batch-record row holds one picture, models/vlm_inputs.py),
``MAX_IMAGES`` for the Qwen-VL families.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reinforge.errors import ReinforgeError
from reinforge.rollout.types import GenerationRequest
from reinforge.rollout.vision import MAX_IMAGES

# model_type -> pictures per prompt, for the families whose processor expands a picture into one run of tokens
RUN_EXPANDED = {"llava": 1, "qwen2_vl": MAX_IMAGES, "qwen2_5_vl": MAX_IMAGES}
TOWER_LEVEL = ("clip_vision_model", "siglip_vision_model")  # towers vLLM loads under ``vision_model.``


def tower_name(name: str, config: Any) -> str:
    """``name`` as vLLM loads it: a CLIP / SigLIP tower's ``vision_tower.X`` as ``vision_tower.vision_model.X``."""
    if getattr(getattr(config, "vision_config", None), "model_type", None) not in TOWER_LEVEL:
        return name
    head, sep, rest = name.partition("vision_tower.")
    if not sep or rest.startswith("vision_model."):
        return name
    return f"{head}vision_tower.vision_model.{rest}"


def rename_checkpoint(directory: str | Path, config: Any) -> int:
    """Rename the weights of the safetensors checkpoint in ``directory`` by ``tower_name`` (and its index);
    returns how many were renamed (0: the files are left as they are)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    directory, renamed = Path(directory), 0
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names = {k: tower_name(k, config) for k in f.keys()}
            if all(k == v for k, v in names.items()):
                continue
            tensors, metadata = {names[k]: f.get_tensor(k) for k in names}, f.metadata()
        save_file(tensors, str(path), metadata=metadata)
        renamed += sum(k != v for k, v in names.items())
    index = directory / "model.safetensors.index.json"
    if renamed and index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {tower_name(k, config): v for k, v in data["weight_map"].items()}
        index.write_text(json.dumps(data, indent=2))
    return renamed


def image_limit(config: Any) -> dict[str, int] | None:
    """vLLM's ``limit_mm_per_prompt`` for a model ``config``: pictures per prompt for a family this engine
    sends pictures to, None for a text model or another family (vLLM's default; its pictures are refused)."""
    if getattr(config, "vision_config", None) is None:
        return None
    limit = RUN_EXPANDED.get(getattr(config, "model_type", ""))
    return None if limit is None else {"image": limit}


def image_token(config: Any) -> int | None:
    """The model's image placeholder token (``image_token_id`` or ``image_token_index``)."""
    token = getattr(config, "image_token_id", None)
    token = getattr(config, "image_token_index", None) if token is None else token
    return None if token is None else int(token)


def collapse_image_runs(ids: list[int], token: int, n_images: int) -> list[int]:
    """``ids`` with each picture's run of ``token`` collapsed to one ``token``. One run per picture; a run that
    holds k adjacent pictures (k times the per-picture count, when every picture expands alike) becomes k."""
    runs: list[tuple[int, int]] = []  # (start, length)
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    total = sum(length for _, length in runs)
    if len(runs) == n_images:
        counts = [1] * n_images
    elif n_images and total % n_images == 0 and all(length % (total // n_images) == 0 for _, length in runs):
        counts = [length // (total // n_images) for _, length in runs]
    else:
        raise ReinforgeError(f"rollout.engine=vllm: the prompt has {len(runs)} runs of the image token ({token}) "
                             f"for {n_images} pictures; they cannot be told apart to send vLLM one placeholder "
                             "per picture")
    out, prev = [], 0
    for (start, length), count in zip(runs, counts, strict=True):
        out.extend(ids[prev:start])
        out.extend([token] * count)
        prev = start + length
    out.extend(ids[prev:])
    return out


def vllm_prompt(request: GenerationRequest, config: Any) -> dict[str, Any]:
    """vLLM's token prompt for ``request``: its ids; with pictures, the ids with one placeholder per picture
    and ``multi_modal_data`` (module docstring)."""
    ids = list(request.prompt_ids)
    if not request.images:
        if request.model_inputs:
            raise ReinforgeError(f"rollout.engine=vllm: request {request.request_id!r} has model inputs "
                                 f"({sorted(request.model_inputs)}) but no pictures (GenerationRequest.images): vLLM "
                                 "is sent the pictures themselves; use rollout.engine=torch for such requests")
        return {"prompt_token_ids": ids}
    family = getattr(config, "model_type", "?")
    if getattr(config, "vision_config", None) is None:
        raise ReinforgeError(f"rollout.engine=vllm: request {request.request_id!r} has pictures but the model "
                             f"({family}) takes none")
    if family not in RUN_EXPANDED:
        raise ReinforgeError(f"rollout.engine=vllm does not send pictures to {family} models (their processor's "
                             f"expanded prompt is not vLLM's input; supported: {sorted(RUN_EXPANDED)}): use "
                             "rollout.engine=torch")
    if len(request.images) > RUN_EXPANDED[family]:
        raise ReinforgeError(f"rollout.engine=vllm: request {request.request_id!r} has {len(request.images)} "
                             f"pictures; {family} takes at most {RUN_EXPANDED[family]} a prompt here")
    token = image_token(config)
    if token is None:
        raise ReinforgeError(f"rollout.engine=vllm: the {family} config names no image token (image_token_id)")
    return {"prompt_token_ids": collapse_image_runs(ids, token, len(request.images)),
            "multi_modal_data": {"image": list(request.images)}}


def check_expanded(request: GenerationRequest, expanded: list[int] | None) -> None:
    """vLLM's expanded prompt must be the request's (the ids the learner scores); a difference is refused."""
    if not request.images or expanded is None or list(expanded) == list(request.prompt_ids):
        return
    raise ReinforgeError(f"rollout.engine=vllm expanded request {request.request_id!r}'s pictures to "
                         f"{len(expanded)} prompt tokens, not the {len(request.prompt_ids)} the model's processor "
                         "gives (the learner scores the processor's): use rollout.engine=torch for this model")
