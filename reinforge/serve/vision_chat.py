"""Chat requests with pictures (OpenAI ``image_url`` content parts) into a vision-language model's prompt.

A part is ``{"type": "image_url", "image_url": {"url": URL}}``; URL is a base64 data URL
(``data:image/png;base64,...``) or, when the server has an ``image_root``, a file path inside that directory
(relative to it). Remote URLs are refused: the server fetches nothing. Each picture is decoded and checked
(rollout/vision.py: readable, an ``image/*`` type, at most ``MAX_PIXELS``, at most ``max_images`` per request);
the messages, their image parts as placeholders, are rendered by the model's processor's chat template and
the processor gives the token ids (image tokens expanded) and ``pixel_values``, which the engine's prefill
takes (``GenerationRequest.model_inputs``). A bad part is a 400 whose ``param`` names it, e.g.
``messages[0].content[1].image_url.url``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reinforge.errors import ConfigError
from reinforge.rollout.vision import ImagePartError, image_part_url, split_image_parts, to_rows
from reinforge.serve.schema import APIError


def image_parts(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(field, part)`` of every image part, the field ``messages[i].content[j]``."""
    return [(f"messages[{i}].content[{j}]", part) for i, m in enumerate(messages)
            for j, part in enumerate(m.get("content") if isinstance(m.get("content"), list) else [])
            if isinstance(part, dict) and part.get("type") == "image_url"]


def image_part_fields(messages: list[dict[str, Any]]) -> list[str]:
    """The ``messages[i].content[j]`` fields that are image parts (none: a text request, served as before)."""
    return [field for field, _ in image_parts(messages)]


def vision_chat_prompt(processor: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       template_kwargs: dict[str, Any], suffix: str, max_images: int,
                       image_root: Path | None = None) -> tuple[list[int], dict[str, Any]]:
    """The prompt's token ids (the rendered messages, then ``suffix``) and its model inputs (leading dimension
    1); a 400 naming the field for a bad picture, and for pictures sent to a model without an image processor."""
    if processor is None:
        field = image_part_fields(messages)[0]
        raise APIError(400, f"{field}: this model takes no pictures (it has no image processor); send text only",
                       param=field)
    _confine_paths(messages, image_root)
    try:
        placed, pictures = split_image_parts(messages, "", image_root, allow_paths=image_root is not None,
                                             max_images=max_images)
    except ImagePartError as e:
        raise APIError(400, str(e), param=e.field) from None
    try:
        text = processor.apply_chat_template(placed, tools=tools, tokenize=False, add_generation_prompt=True,
                                             **template_kwargs)
        out = processor(text=[text + suffix], images=list(pictures), return_tensors="pt")
    except Exception as e:
        raise APIError(400, f"messages: the model's processor failed on the pictures and text: {e}",
                       param="messages") from None
    ids = out["input_ids"][0]
    if "attention_mask" in out:
        ids = ids[out["attention_mask"][0].bool()]
    try:
        return ids.tolist(), to_rows(out, "messages")  # the family's row layout (models/vlm_inputs.py)
    except ConfigError as e:  # e.g. several pictures for a family that places one per row
        raise APIError(400, str(e), param="messages") from None


def _confine_paths(messages: list[dict[str, Any]], root: Path | None) -> None:
    """A file-path URL must name a file inside ``root`` (no ``..`` or absolute path out of it)."""
    if root is None:
        return
    for field, part in image_parts(messages):
        url = image_part_url(part)
        if not isinstance(url, str) or url.startswith("data:") or "://" in url.removeprefix("file://"):
            continue  # not a path: decode_image_url reads or refuses it
        path = (root / url.removeprefix("file://")).resolve()
        if not path.is_relative_to(root.resolve()):
            raise APIError(400, f"{field}.image_url.url: a file path must stay inside the server's image root",
                           param=f"{field}.image_url.url")


def check_image_root(image_root: str | Path | None) -> Path | None:
    """The server's image root as a directory, or None (file paths refused)."""
    if image_root is None:
        return None
    root = Path(image_root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--image-root: {str(root)!r} is not a directory")
    return root
