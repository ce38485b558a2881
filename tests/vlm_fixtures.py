"""Tiny random vision-language models of the families docs/vision.md lists, built offline in a test.

Each builder writes a model directory (``config.json``, weights, tokenizer, processor) the way an HF checkpoint of
that family is laid out, from local pieces only: a character-level tokenizer with the family's special tokens and
chat template (image parts rendered as the family's placeholder), the family's PIL image processor and a random
model of a few ten thousand parameters. ``llava`` is the shipped tiny-vlm. Nothing reaches the hub.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz +-=?.,")
BASE = ["<pad>", "<bos>", "<eos>", "<unk>"]


def _template(image: str) -> str:
    """``<bos>`` + the messages' texts, each image part rendered as ``image``, assistant turns closed by ``<eos>``."""
    return ("{{ bos_token }}{% for message in messages %}{% if message['content'] is string %}"
            "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
            + image + "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
            "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}")


def char_tokenizer(specials: list[str], template: str):
    """A character-level fast tokenizer over ``CHARS`` with ``<pad> <bos> <eos> <unk>`` and ``specials``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(BASE + specials + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", additional_special_tokens=specials, model_max_length=512)
    tok.chat_template = template
    return tok


def _text(tok, **extra) -> dict:
    """A 2-layer language model config over ``tok``'s vocabulary."""
    return dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **extra)


def build_qwen_vl(out: Path, version: str = "2", seed: int = 0) -> Path:
    """Qwen2-VL (``version`` "2") or Qwen2.5-VL ("2.5"): 8 x 8 patches merged 2 x 2, so a 32 x 32 picture is a 4 x 4
    grid of 16 patches and 4 image tokens; the processor is built without a video processor (no torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from reinforge.models.processors import images_only

    if version == "2":
        from transformers import Qwen2VLConfig as Config
        from transformers import Qwen2VLForConditionalGeneration as Model
        from transformers import Qwen2VLProcessor as Processor
        vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2)
    else:
        from transformers import Qwen2_5_VLConfig as Config
        from transformers import Qwen2_5_VLForConditionalGeneration as Model
        from transformers import Qwen2_5_VLProcessor as Processor
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=32,
                      fullatt_block_indexes=[1], window_size=16)
    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    template = _template("<|vision_start|><|image_pad|><|vision_end|>")
    tok = char_tokenizer(specials, template)
    images = Qwen2VLImageProcessorPil(min_pixels=16 * 16, max_pixels=64 * 64, patch_size=8, merge_size=2,
                                      temporal_patch_size=2)
    processor = images_only(Processor)(image_processor=images, tokenizer=tok, chat_template=template)
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in zip(
        ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), specials, strict=True)}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    config = Config(text_config=_text(tok, rope_parameters=rope),
                    vision_config=dict(vision, patch_size=8, spatial_merge_size=2, temporal_patch_size=2), **ids)
    return _save(Model, config, processor, out, seed)


def build_idefics3(out: Path, seed: int = 0) -> Path:
    """Idefics3 (SmolVLM's architecture): a 2-layer SigLIP tower over 32 x 32 pictures in 8 x 8 patches, pixel
    shuffle by 2: 4 image tokens per picture, no splitting into sub-images."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    specials = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    template = _template("<image>")
    tok = char_tokenizer(specials, template)
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 32},
                                       max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=4, chat_template=template)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8)
    config = Idefics3Config(text_config=_text(tok), vision_config=vision, scale_factor=2,
                            image_token_id=tok.convert_tokens_to_ids("<image>"))
    return _save(Idefics3ForConditionalGeneration, config, processor, out, seed)


def _save(model_cls, config, processor, out: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model = model_cls(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def build_family(family: str, out: Path) -> str:
    """The model directory of ``family`` (``llava``: the shipped tiny-vlm's alias)."""
    if family == "llava":
        return "tiny-vlm"
    builders = {"qwen2_vl": lambda: build_qwen_vl(out, "2"), "qwen2_5_vl": lambda: build_qwen_vl(out, "2.5"),
                "idefics3": lambda: build_idefics3(out)}
    return str(builders[family]())


FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava", "idefics3")
