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
