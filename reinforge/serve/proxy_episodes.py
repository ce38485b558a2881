"""The agent proxy's episode records: segments (token-exact sequences), episodes and claimed calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from reinforge.rollout.chat_splice import Message
from reinforge.rollout.types import Generation
from reinforge.serve.proxy_app import Scalar


@dataclass(frozen=True)
class EpisodeStatus:
    calls: int
    segments: int
    in_flight: int
    reward: float | None
    done: bool


@dataclass(eq=False)
class _Segment:
    """One token-exact sequence: a first prompt, then per call its completion (mask 1), then the
    turn end and the next observation (mask 0)."""

    tools_key: str
    ids: list[int]
    tip: list[Message] = field(default_factory=list)  # what the next call must extend
    last_completion: list[int] = field(default_factory=list)
    busy: bool = False
    version: int | None = None
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=list)
    model_inputs: dict = field(default_factory=dict)  # its first prompt's pictures (pixel_values), for every call
    prompt_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.ids)
        self.mask, self.logprobs, self.versions = [0] * len(self.ids), [0.0] * len(self.ids), [-1] * len(self.ids)

    def append_context(self, ids: Sequence[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def append_call(self, gen: Generation, messages: list[Message], reply: Message, temperature: float) -> None:
        start = len(self.ids)
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.logprobs += gen.logprobs
        self.versions += gen.token_versions
        self.spans.append((start, len(self.ids)))
        self.finish_reasons.append(gen.finish_reason)
        self.temperatures.append(temperature)
        self.tip = [*messages, reply]
        self.last_completion = list(gen.token_ids)
        if self.version is None:
            self.version = gen.version


@dataclass(eq=False)
class _Episode:
    id: str
    segments: list[_Segment] = field(default_factory=list)
    calls: int = 0
    in_flight: int = 0
    reward: float | None = None
    info: dict[str, Scalar] = field(default_factory=dict)
    done: bool = False
    echo_mismatches: int = 0
    reward_token: str | None = field(default=None, repr=False)


@dataclass
class _Plan:
    """A claimed call: the segment it extends (None: a new one) and the prompt sent to the engine."""

    episode: _Episode
    segment: _Segment | None
    tools_key: str
    context: list[int]
    prompt: list[int]
    echo_mismatch: str | None = None
    model_inputs: dict = field(default_factory=dict)


def _status(ep: _Episode) -> EpisodeStatus:
    return EpisodeStatus(ep.calls, len(ep.segments), ep.in_flight, ep.reward, ep.done)


