"""OpenEnv environments (openenv-core 0.3) served over HTTP, played by our collector.

``url`` is an OpenEnv server (``http://host:port``; ``openenv serve``, a Docker image, a Hugging Face
Space). An OpenEnv server's plain ``POST /reset`` and ``POST /step`` routes make a fresh environment per
request, so an episode of several steps uses the WebSocket route the official client uses: each of our
episodes is one ``GenericEnvClient`` connection (its WebSocket ``/ws`` under ``url``, its own environment
instance on the server), opened at ``reset`` and closed when the episode ends.

What maps to what:

- a task is a reset seed (``task: {kind: env}``: ``episodes`` seeds, `openenv_splits`): ``reset(seed=s,
  **reset_args)`` (``seeded: false`` sends no seed);
- an observation (the server's observation fields, without ``done`` / ``reward`` / ``metadata``) is one
  user message: its ``observation_field`` as text, or, when that is empty, every field as ``key: value``
  lines;
- the model's turn is the action ``{action_field: text, **action_args}``;
- each step's ``reward`` (None: 0) is that turn's reward; the trajectory's reward is their sum; the
  server's ``done`` ends the episode (or our ``env.max_turns``).

Failures (as MCP tools' ``on_server_failure: episode_error``): a server that cannot be reached, is full, times out
(``timeout_s``) or answers an error, and a malformed observation (no ``observation_field``) raise from
``reset`` / ``step``, so the episode ends as an environment error and ``reward.on_error`` decides
(``zero``: the episode scores 0 and the run goes on; a reset that fails leaves an untrained episode).

The client's calls run on one event loop thread shared by all episodes (its connections belong to it);
``env.concurrency`` bounds the calls in flight, as for any environment.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

from reinforge.data.base import TaskSplits
from reinforge.envs.base import Message, StepResult
from reinforge.envs.episode_bridge import shared_loop
from reinforge.types import Task

EXTRA = 'pip install "reinforge[envs]"'
RESERVED = ("done", "reward", "metadata")


def import_client() -> Any:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as e:
        raise ImportError(f"env.name=openenv needs the openenv-core package: {EXTRA}") from e
    return GenericEnvClient


class OpenEnvError(RuntimeError):
    """The server failed (unreachable, full, an error answer, a timeout) or sent a malformed observation."""


def openenv_splits(episodes: int, heldout_size: int, seed: int, url: str) -> TaskSplits:
    """``episodes`` tasks, task ``i`` resetting with seed ``i``, split (seeded) into train / held-out."""
    from reinforge.envs.adapter_tasks import seeded_splits

    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 2:
        raise ValueError(f"env.episodes must be an integer >= 2, got {episodes!r}")
    tasks = [Task(id=f"openenv-{i}", prompt=f"openenv episode {i}", answer="", metadata={"reset_seed": i})
             for i in range(episodes)]
    return seeded_splits(tasks, heldout_size, seed, f"openenv({url})")


def _check(url: Any, action_field: Any, observation_field: Any, reset_args: Any, action_args: Any,
           timeout_s: Any) -> None:
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"env.url must be an http(s):// or ws(s):// URL of an OpenEnv server, got {url!r}")
    if not isinstance(action_field, str) or not action_field:
        raise ValueError(f"env.action_field must name the action's text field, got {action_field!r}")
    if not isinstance(observation_field, str):
        raise ValueError(f"env.observation_field must be a string ('' = every field), got {observation_field!r}")
    for name, value in (("reset_args", reset_args), ("action_args", action_args)):
        if not isinstance(value, dict):
            raise ValueError(f"env.{name} must be a mapping, got {value!r}")
    if action_field in action_args:
        raise ValueError(f"env.action_args must not set env.action_field ({action_field!r}): the model's text goes there")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise ValueError(f"env.timeout_s must be a number > 0, got {timeout_s!r}")


class OpenEnvEnv:
    """One episode on the OpenEnv server at ``url`` (module docstring). ``info``: ``openenv_steps``."""

    def __init__(self, url: str, action_field: str = "message", observation_field: str = "",
                 reset_args: dict | None = None, action_args: dict | None = None, seeded: bool = True,
                 timeout_s: float = 30.0, system_prompt: str | None = None) -> None:
        reset_args = {} if reset_args is None else reset_args
        action_args = {} if action_args is None else action_args
        _check(url, action_field, observation_field, reset_args, action_args, timeout_s)
        import_client()
        self.url, self.action_field, self.observation_field = url, action_field, observation_field
        self.reset_args, self.action_args, self.seeded = dict(reset_args), dict(action_args), bool(seeded)
        self.timeout_s, self.system_prompt = float(timeout_s), system_prompt
        self.client: Any = None
        self.steps = 0

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        self._close()
        kwargs = dict(self.reset_args)
        if self.seeded:
            kwargs["seed"] = task.metadata.get("reset_seed", seed)
        self.client = import_client()(base_url=self.url, connect_timeout_s=self.timeout_s,
                                      message_timeout_s=self.timeout_s)
        result = self._call(self.client.reset(**kwargs), "reset")
        self.steps = 0
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if result.done:
            self._close()
            raise OpenEnvError(f"OpenEnv server {self.url}: the episode was over at reset")
        return system + [{"role": "user", "content": self._text(result.observation)}]

    def step(self, assistant: Message) -> StepResult:
        if self.client is None:
            raise RuntimeError("step() needs a running episode: call reset() first")
        action = {**self.action_args, self.action_field: assistant.get("content") or ""}
        result = self._call(self.client.step(action), "step")
        self.steps += 1
        reward = float(result.reward or 0.0)
        info = {"openenv_steps": self.steps}
        if result.done:
            self._close()
            return StepResult([], reward, True, info)
        return StepResult([{"role": "user", "content": self._text(result.observation)}], reward, False, info)

    def _text(self, observation: Any) -> str:
        if not isinstance(observation, dict):
            self._close()
            raise OpenEnvError(f"OpenEnv server {self.url}: malformed observation {observation!r} (not an object)")
        if self.observation_field:
            if self.observation_field not in observation:
                self._close()
                raise OpenEnvError(f"OpenEnv server {self.url}: malformed observation, no field "
                                   f"env.observation_field={self.observation_field!r} (fields: {sorted(observation)})")
            value = observation[self.observation_field]
            return value if isinstance(value, str) else json.dumps(value)
        return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}"
                         for k, v in observation.items() if k not in RESERVED)

    def _call(self, coroutine: Coroutine, what: str) -> Any:
        """Run one client call on the shared loop, bounded by ``timeout_s``; any failure is an OpenEnvError."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, self.timeout_s), shared_loop())
        try:
            return future.result(self.timeout_s + 5.0)
        except Exception as e:  # noqa: BLE001 - every failure of the server ends the episode the same way
            future.cancel()
            self._close()
            why = f"no answer within {self.timeout_s:g} s" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            raise OpenEnvError(f"OpenEnv server {self.url}: {what} failed ({why})") from e

    def _close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            asyncio.run_coroutine_threadsafe(client.close(), shared_loop())  # best effort, not awaited

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
