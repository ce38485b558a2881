"""``model``: the policy to train (its path, dtype and device) and its LoRA adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from reinforge.config.base import _Strict


class LoraConfig(_Strict):
    """LoRA adapters (via peft) instead of full fine-tuning; docs/lora.md."""

    enabled: bool = Field(False, description="train LoRA adapters; the reference policy is the base (adapters off)")
    r: int = Field(8, ge=1, description="adapter rank")
    alpha: int = Field(16, ge=1, description="scaling numerator: the update is (alpha / r) * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input (training forward only)")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="module names (suffixes) that get adapters, e.g. q_proj, gate_proj, up_proj, down_proj",
    )
    bias: Literal["none", "all", "lora_only"] = Field("none", description="which biases train (peft's bias option)")
    sync: Literal["merged", "adapter"] = Field(
        "merged", description="what reaches the rollout engine after an update: merged weights W + (alpha/r) B A, "
        "or the adapter tensors alone (A, B), which the engine applies unmerged (torch engine, or vLLM LoRA "
        "requests; sync mode)")
    vision_tower: Literal["frozen", "lora"] = Field(
        "frozen", description="a vision-language model's vision tower and projector: frozen (target_modules match in "
        "the language model only), or lora (adapters on every linear layer of the tower and projector as well); "
        "docs/vision.md")

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        if any(not name.strip() for name in v):
            raise ValueError("module names must be non-empty, e.g. [q_proj, v_proj]")
        return v

    @model_validator(mode="after")
    def _adapter_sync(self) -> LoraConfig:
        if self.sync == "adapter" and self.bias != "none":
            raise ValueError(f"model.lora.sync=adapter sends A and B alone, not the trained biases of "
                             f"bias={self.bias}: use bias=none or sync=merged")
        return self


class ModelConfig(_Strict):
    path: str = Field("tiny-base", description="HF model directory, or a shipped alias ('tiny-base')")
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = Field(
        "float32", description="weights' dtype; float64 is for exact-arithmetic checks (slow)")
    device: str = Field("cpu", description="torch device for learner and rollout, e.g. 'cpu' or 'cuda'; 'auto': "
                        "cuda when a GPU is present, else cpu (chosen when the run's config is resolved; config.yaml "
                        "records the choice)")
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @field_validator("device")
    @classmethod
    def _a_device(cls, v: str) -> str:
        if v != "auto":
            import torch

            try:
                torch.device(v)
            except RuntimeError as e:
                raise ValueError(f"not a torch device nor 'auto' ({e})") from None
        return v

    def resolved_device(self) -> str:
        """``device``, with ``auto`` as the device it stands for here: ``cuda`` when a GPU is present, else ``cpu``."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

