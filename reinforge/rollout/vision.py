"""Images into model inputs: read a task's pictures, place them in its prompt, run the model's processor.

A task's ``images`` (``types.Task``) are PIL images, file paths or encoded bytes; ``read_image`` opens one
and checks it (readable, at most ``MAX_PIXELS``, converted to RGB), naming the row and column of a bad one.
``encode_vision_prompt`` gives the prompt's token ids, with the model's image tokens expanded by its
processor (``AutoProcessor``: LLaVA's, Idefics3's, Qwen2-VL's), and the processor's other outputs (``pixel_values``
and whatever the family adds), each with a leading dimension of 1 (models/vlm_inputs.py): the row's ``model_inputs``, which the
engine's prefill and the learner's forwards pass to the model (docs/vision.md).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from reinforge.errors import ConfigError
from reinforge.models.vlm_inputs import to_rows

MAX_PIXELS = 4096 * 4096  # a larger picture is refused: it is almost surely a mistake, and memory is finite


def read_image(image: Any, where: str, base_dir: Path | None = None) -> Any:
    """``image`` (a PIL image, a path, relative to ``base_dir`` when given, or encoded bytes) as an RGB PIL
    image; ``where`` names the row and column in the error of an unreadable, empty or too large one."""
    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(image, Image.Image):
            opened = image
        elif isinstance(image, bytes | bytearray):
            opened = Image.open(io.BytesIO(bytes(image)))
        elif isinstance(image, str | Path):
            path = Path(image) if base_dir is None or Path(image).is_absolute() else base_dir / image
            if not path.is_file():
                raise ConfigError(f"{where}: image file {str(path)!r} does not exist")
            opened = Image.open(path)
        else:
            raise ConfigError(f"{where}: an image is a PIL image, a file path or encoded bytes, not "
                              f"{type(image).__name__}")
        width, height = opened.size
        if width * height > MAX_PIXELS:
            raise ConfigError(f"{where}: image of {width} x {height} pixels is larger than the limit of {MAX_PIXELS}")
        if width * height == 0:
            raise ConfigError(f"{where}: image has no pixels ({width} x {height})")
        return opened.convert("RGB") if opened.mode != "RGB" else opened
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ConfigError(f"{where}: unreadable image ({type(e).__name__}: {e})") from None


def refuse_pictures(tasks: Any, path: str) -> None:
    """A path that cannot show pictures yet refuses tasks that have them, naming the first (docs/vision.md)."""
    task = next((t for t in tasks if getattr(t, "images", ())), None)
    if task is not None:
        raise ConfigError(f"task {task.id!r} has images, but {path} cannot show pictures yet: use a single-turn "
                          "environment (docs/vision.md)")


def with_image_parts(prompt: str | list[dict[str, Any]], n_images: int) -> list[dict[str, Any]]:
    """Chat messages whose parts place ``n_images`` pictures: as they are when their parts already hold that
    many image parts; else the prompt (raw text or messages with string contents) with ``n_images`` image
    parts put before the first user message's text."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    placed = sum(1 for m in messages if isinstance(m.get("content"), list)
                 for part in m["content"] if part.get("type") in ("image", "image_url"))
    if placed == n_images:
        return messages
    if placed:
        raise ConfigError(f"the prompt has {placed} image parts but the task has {n_images} images")
    first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first is None:
        raise ConfigError("a task with images needs a user message to show them in")
    text = messages[first]["content"]
    messages[first]["content"] = [*({"type": "image"} for _ in range(n_images)), {"type": "text", "text": text}]
    return messages


def encode_vision_prompt(processor: Any, prompt: str | list[dict[str, Any]], images: tuple[Any, ...],
                         where: str = "task") -> tuple[list[int], dict[str, Any]]:
    """The prompt's token ids (image tokens expanded) and its other model inputs (leading dimension 1)."""
    if processor is None:
        raise ConfigError(f"{where} has images but the model has no image processor (its directory has no "
                          "processor_config.json / preprocessor_config.json): use a vision-language model, e.g. "
                          "tiny-vlm")
    pictures = [read_image(img, f"{where}, images[{i}]") for i, img in enumerate(images)]
    messages = with_image_parts(prompt, len(pictures))
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=pictures, return_tensors="pt")
    ids = out["input_ids"][0]
    keep = out["attention_mask"][0].bool() if "attention_mask" in out else None
    ids = ids[keep] if keep is not None else ids
    return ids.tolist(), to_rows(out, where)  # the batch record's row layout of the family (models/vlm_inputs.py)


# ---------------------------------------------------------------- pictures in chat messages (OpenAI content parts)
MAX_IMAGES = 8  # pictures in one prompt (a table row, a request); more is refused, naming the limit
REMOTE_SCHEMES = ("http://", "https://", "ftp://", "s3://", "gs://")


class ImagePartError(ConfigError):
    """A bad image part of a chat message; ``field`` names it (``messages[0].content[1].image_url.url``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def image_part_url(part: dict[str, Any]) -> Any:
    """The URL of an OpenAI ``image_url`` part: ``{"image_url": {"url": ...}}`` (or the older bare string)."""
    value = part.get("image_url")
    return value.get("url") if isinstance(value, dict) else value


def decode_image_url(url: Any, where: str, allow_paths: bool = True) -> bytes | Path:
    """An image part's URL as the picture's encoded bytes (a base64 ``data:image/...`` URL) or a file path
    (``file://`` or a plain path, when ``allow_paths``); remote URLs are refused (nothing is fetched)."""
    import base64
    import binascii

    if not isinstance(url, str) or not url:
        raise ConfigError(f"{where}: expected a non-empty string URL, got {type(url).__name__}")
    if url.startswith("data:"):
        header, sep, payload = url[5:].partition(",")
        mime, *params = header.split(";")
        if not sep or "base64" not in params:
            raise ConfigError(f"{where}: a data URL must be base64: data:image/png;base64,...")
        if not mime.lower().startswith("image/"):
            raise ConfigError(f"{where}: data URL of type {mime or 'text/plain'!r} is no picture (image/png, "
                              "image/jpeg, ...)")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ConfigError(f"{where}: the data URL's base64 does not decode ({e})") from None
    if url.lower().startswith(REMOTE_SCHEMES) or ("://" in url and not url.startswith("file://")):
        raise ConfigError(f"{where}: {url[:60]!r} is a remote URL; pictures are read from data URLs "
                          "(data:image/png;base64,...) or file paths, never fetched over the network")
    if not allow_paths:
        raise ConfigError(f"{where}: file paths are not read here; send the picture as a data URL "
                          "(data:image/png;base64,...)")
    return Path(url.removeprefix("file://"))


def split_image_parts(messages: list[dict[str, Any]], where: str = "", base_dir: Path | None = None,
                      allow_paths: bool = True, max_images: int = MAX_IMAGES) -> tuple[list[dict[str, Any]], tuple]:
    """Messages whose ``image_url`` parts became ``{"type": "image"}`` placeholders (what the processor's chat
    template renders), and their pictures read in order (RGB PIL images). A bad part raises ``ImagePartError``
    whose ``field`` is ``messages[i].content[j].image_url.url`` (``where`` prefixes the message: a row, a column)."""
    out, pictures = [], []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "image_url":
                parts.append(part)
                continue
            field = f"messages[{i}].content[{j}].image_url.url"
            if len(pictures) == max_images:
                raise ImagePartError(field, f"{where}{field}: more than {max_images} pictures in one prompt (the "
                                            f"limit, max_images)")
            try:
                source = decode_image_url(image_part_url(part), f"{where}{field}", allow_paths)
                pictures.append(read_image(source, f"{where}{field}", base_dir))
            except ImagePartError:
                raise
            except ConfigError as e:
                raise ImagePartError(field, str(e)) from None
            parts.append({"type": "image"})
        out.append({**message, "content": parts})
    return out, tuple(pictures)


def image_data_url(image: Any, max_side: int | None = None) -> str:
    """A picture (anything ``read_image`` reads) as a PNG data URL, shrunk to at most ``max_side`` pixels a side
    when given (thumbnails in a report)."""
    import base64

    picture = read_image(image, "image")
    if max_side is not None and max(picture.size) > max_side:
        picture = picture.copy()
        picture.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def with_image_urls(messages: list[dict[str, Any]], images: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Messages whose image placeholders (``{"type": "image"}``, as ``with_image_parts`` places them) carry the
    pictures as OpenAI ``image_url`` data-URL parts, in order: what a request to an OpenAI-compatible server sends."""
    urls = iter(image_data_url(img) for img in images)
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [{"type": "image_url", "image_url": {"url": next(urls)}} if part.get("type") == "image" else part
                       for part in content]
        out.append({**message, "content": content})
    return out


def vision_request(processor: Any, prompt: str | list[dict[str, Any]], images: tuple[Any, ...], request_id: str,
                   where: str = "task") -> Any:
    """The ``GenerationRequest`` of a prompt with pictures: its expanded token ids and ``model_inputs``
    (``encode_vision_prompt``), and the messages and pictures an engine over an HTTP server sends instead."""
    from reinforge.rollout.types import GenerationRequest

    if processor is None:
        encode_vision_prompt(processor, prompt, images, where)  # raises, naming what is missing
    pictures = tuple(read_image(img, f"{where}, images[{i}]") for i, img in enumerate(images))
    ids, inputs = encode_vision_prompt(processor, prompt, pictures, where)
    return GenerationRequest(ids, request_id, inputs, messages=with_image_parts(prompt, len(pictures)),
                             images=pictures)
