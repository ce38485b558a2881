"""A vision-language model's processor (tokenizer and image processor), with or without torchvision.

``load_processor`` gives the directory's ``AutoProcessor``. Some families' processors (Qwen2-VL, Qwen2.5-VL,
SmolVLM2) also hold a video processor, which transformers builds only with torchvision; where torchvision cannot
be imported, such a processor is built without it (``images_only``): the same class over the image processor
(transformers picks its PIL backend) and the tokenizer, so pictures work and videos are refused. It saves under
the family's own class name, so the checkpoint loads with ``AutoProcessor`` where torchvision is installed.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def load_processor(directory: str) -> Any:
    """The processor of the model ``directory`` (which has a processor or preprocessor config)."""
    import transformers

    name = _processor_class(Path(directory))
    cls = getattr(transformers, name, None) if name else None
    if cls is not None and "video_processor" in cls.get_attributes() and not torchvision_available():
        log.info("%s: %s without its video processor (torchvision is not installed): pictures only", directory, name)
        return images_only(cls).from_pretrained(directory)
    return transformers.AutoProcessor.from_pretrained(directory)


@functools.cache
def images_only(cls: type) -> type:
    """``cls`` (a processor class whose attributes include a video processor) built from its image processor and
    tokenizer alone; same name, so ``save_pretrained`` records the family's class."""

    def __init__(self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None,
                 **kwargs: Any) -> None:  # named as the family's (from_pretrained passes what the signature names)
        cls.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": __name__,
                                       "__doc__": f"{cls.__name__} without its video processor (pictures only)."})


def torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def _processor_class(directory: Path) -> str | None:
    """The ``processor_class`` a saved processor (or its tokenizer) records."""
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = directory / name
        if path.is_file():
            found = json.loads(path.read_text()).get("processor_class")
            if found:
                return str(found)
    return None
