"""A conversation with a simulated user served through an OpenAI-compatible chat-completions API.

The policy plays the ``assistant`` role (``role()``); the user is a model behind ``user_url`` (``reinforge
serve``, vLLM, an API), never trained: its messages are observations in the trajectory (loss mask 0).

- **Opening.** The task's prompt is the user's first message (a message-list prompt: its messages as they
  are); ``task.system_prompt`` goes to the policy only.
- **The user's view.** After each assistant turn the simulator is asked for the user's next message
  with the conversation *flipped*: the simulator sees itself as the assistant, so the user's own messages
  (the task's prompt first) are ``assistant`` messages and the policy's turns are ``user`` messages,
  after ``user_system_prompt`` (its persona; ``{stop}`` in it is replaced by ``user_stop``). A chat model
  served through chat completions writes the assistant's turn of the conversation it is given; flipping
  the roles is what makes it write the user's side (a chat template's generation prompt is always the
  assistant's), and the system prompt says who it plays.
- **End.** The episode ends when the user's reply contains ``user_stop`` (the reply is kept in
  ``metadata["observations"]``, not in the tokens), or at the collector's limits (``env.max_turns``,
  tokens). ``user_stop: null``: only the limits end it.
- **Reward.** The task's verifier on the assistant's last turn, or 0 without a verifier. The environment
  cannot know which turn is the last (a limit may end the episode), so it scores every assistant turn
  and rewards the change: turn ``k`` gets ``r_k = s_k - s_{k-1}`` (``s_0 = 0``, ``s_k`` the verifier's
  score of turn ``k``), and the episode's reward ``sum_k r_k = s_K`` is the score of its last turn,
  whatever ended it. ``info["correct"]``: the last turn's verdict.
- **Failures.** A server that cannot be reached, an HTTP error, a reply without text, or no answer
  within ``user_timeout_s`` (the HTTP client's own limit) raise ``SimulatedUserError`` from ``step``;
  ``env.step_timeout_s`` bounds the whole step (a call past it ends its episode as ``env_timeout``). Each
  ends the episode as an environment error and ``reward.on_error`` decides (``zero``: the episode ends
  and the run goes on; ``raise``: the run stops). The client does not retry (``max_retries=0``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reinforge.envs.base import Message, StepResult
from reinforge.rewards.verifiers import Verifier
from reinforge.types import Task

ASSISTANT, USER = "assistant", "user"
DEFAULT_USER_PROMPT = ("You are the user in this conversation, talking to an assistant about the request you "
                       "opened it with. Reply as that user, briefly. When you are satisfied, end your reply with {stop}")


class SimulatedUserError(RuntimeError):
    """The simulated user's server failed: unreachable, an HTTP error, no answer in time, a reply without text."""


class SimulatedUserSettings(BaseModel):
    """``env.user_*``: where the simulated user is served and how it is sampled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user_url: str = Field(description="the OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    user_model: str = Field(min_length=1, description="the served model's name")
    user_system_prompt: str | None = Field(description="the simulator's system prompt ({stop}: user_stop); "
                                           "null: none")
    user_max_tokens: int = Field(ge=1, description="tokens per user reply")
    user_temperature: float = Field(ge=0, le=2, description="the user's sampling temperature")
    user_api_key: str | None = Field(description="sent as 'Authorization: Bearer KEY'; null: none")
    user_stop: str | None = Field(description="a user reply containing it ends the episode; null: never")
    user_timeout_s: float = Field(gt=0, description="the HTTP client's limit on one user reply")

    @field_validator("user_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s):// base URL of an OpenAI-compatible server, got {v!r}")
        return v.rstrip("/")

    @field_validator("user_stop")
    @classmethod
    def _stop(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise ValueError("must not be empty (every reply contains ''); null: only the limits end the episode")
        return v


def simulated_user_settings(**params: Any) -> SimulatedUserSettings:
    """The validated settings; a bad one raises ValueError naming ``env.<field>``."""
    try:
        return SimulatedUserSettings.model_validate(params)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"env.{where}: {first['msg'].removeprefix('Value error, ')}") from None


def flip(message: Message) -> Message:
    """A message of the policy's conversation as the simulator sees it: ``user`` and ``assistant`` swapped."""
    role = {USER: ASSISTANT, ASSISTANT: USER}.get(message.get("role", ""), message.get("role", ""))
    return {"role": role, "content": str(message.get("content") or "")}


@lru_cache(maxsize=16)
def _client(url: str, api_key: str | None, timeout_s: float) -> Any:
    """One client per server (thread-safe; its connection pool is shared by the episodes)."""
    import openai

    return openai.OpenAI(base_url=url, api_key=api_key or "none", timeout=timeout_s, max_retries=0)


class SimulatedUserEnv:
    """The policy as ``assistant``, the user's replies from a chat-completions server (module docstring)."""

    def __init__(self, settings: SimulatedUserSettings, verifier: Verifier | None = None,
                 system_prompt: str | None = None) -> None:
        self.settings, self.verifier, self.system_prompt = settings, verifier, system_prompt
        self.task: Task | None = None
        self.user_view: list[Message] = []
        self.score, self.done = 0.0, True

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        self.task, self.score, self.done = task, 0.0, False
        system = self.settings.user_system_prompt
        persona = [] if system is None else [{"role": "system",
                                              "content": system.replace("{stop}", self.settings.user_stop or "")}]
        opening = [{"role": USER, "content": task.prompt}] if isinstance(task.prompt, str) else list(task.prompt)
        self.user_view = [*persona, *(flip(m) for m in opening if m.get("role") != "system")]
        return [*([] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]), *opening]

    def role(self) -> str:
        return ASSISTANT

    def flipped(self) -> list[Message]:
        """The conversation as the simulator is shown it (its own messages as ``assistant``)."""
        return list(self.user_view)

    def step(self, assistant: Message) -> StepResult:
        if self.done or self.task is None:
            raise RuntimeError("step() needs a running episode: call reset() first")
        text = assistant.get("content") or ""
        reward, info = self._scored(text)
        self.user_view.append({"role": USER, "content": text})
        reply = self._ask()
        self.user_view.append({"role": ASSISTANT, "content": reply})
        stop = self.settings.user_stop
        self.done = stop is not None and stop in reply
        info |= {"user_turns": sum(m["role"] == ASSISTANT for m in self.user_view) - 1, "user_stopped": self.done}
        return StepResult([{"role": USER, "content": reply}], reward, self.done, info)

    def _scored(self, text: str) -> tuple[float, dict[str, Any]]:
        """This turn's reward ``s_k - s_{k-1}`` and its verdict."""
        if self.verifier is None:
            return 0.0, {"correct": False}
        assert self.task is not None
        result = self.verifier(self.task, text)
        info: dict[str, Any] = {"correct": bool(result.correct)}
        if getattr(result, "status", "ok") != "ok":  # a failed call the reward pool scored 0 (rewards/pool.py)
            info["reward_status"], info["reward_error"] = result.status, result.error
        reward, self.score = float(result.reward) - self.score, float(result.reward)
        return reward, info

    def _ask(self) -> str:
        s = self.settings
        try:
            response = _client(s.user_url, s.user_api_key, s.user_timeout_s).chat.completions.create(
                model=s.user_model, messages=self.flipped(), max_tokens=s.user_max_tokens,
                temperature=s.user_temperature)
        except Exception as e:  # noqa: BLE001 - every failure of the server ends the episode the same way
            raise SimulatedUserError(f"simulated user at {s.user_url}: {type(e).__name__}: {e}") from e
        content = response.choices[0].message.content if response.choices else None
        if content is None:
            raise SimulatedUserError(f"simulated user at {s.user_url}: a reply without text ({response!r:.200})")
        return content
