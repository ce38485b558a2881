"""Plain data passed to and from a rollout engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``n`` completions per request; ``greedy`` ignores temperature/top-p/top-k.

    Log-probabilities are those of the temperature-scaled distribution softmax(z / T) (what the
    learner recomputes); top-p and top-k only restrict which tokens can be drawn.
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    greedy: bool = False
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # generate exactly max_new_tokens (benchmarks)


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt; ``adapter`` names the LoRA adapter to sample it with on an engine that serves
    several (``TorchRolloutEngine.update_adapter``; None: the engine's ``default_adapter``);
    ``model_inputs``: the model's other inputs for it (an image's ``pixel_values`` and what its family
    adds, each with a leading dimension of 1: rollout/vision.py), passed at prefill. A prompt with pictures also
    keeps ``messages`` (its chat messages, one ``{"type": "image"}`` part per picture) and ``images`` (the RGB
    pictures, in the parts' order): what an engine over an HTTP server sends instead of token ids."""

    prompt_ids: list[int]
    request_id: str = ""
    model_inputs: dict = field(default_factory=dict)
    adapter: str | None = None
    messages: list | None = None
    images: tuple = ()


@dataclass
class Generation:
    """One completion: its tokens, their sampling log-probabilities and the policy version.

    ``token_versions[t]`` is the policy version that sampled token t (an engine that takes new
    weights between decode steps gives one sequence several versions); ``version`` is the version
    of its first token. ``extra['tokens_reused']`` (optional): how many of ``token_ids`` a group sampler
    took from elsewhere (a reused prefix, a shared tree segment) instead of decoding them for this
    sample; the step reports the sum as ``rollout/tokens_reused``. ``model_inputs``: its request's (pictures),
filled by the collector that made the request."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    version: int
    text: str = ""
    sample_index: int = 0
    extra: dict = field(default_factory=dict)
    token_versions: list[int] = field(default_factory=list)
    model_inputs: dict = field(default_factory=dict)  # its request's (the prompt's pictures), for the trajectory

    def __post_init__(self) -> None:
        if not self.token_versions:
            self.token_versions = [self.version] * len(self.token_ids)
