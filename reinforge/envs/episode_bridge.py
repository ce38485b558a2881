"""A coroutine that drives an episode (it asks for model turns), played as ``reset``/``step`` calls.

Other frameworks write an episode as one coroutine that calls ``await turn(text)`` each time it wants
the model's reply (verifiers' ``Env.run`` and its ``Interaction.turn``). Our collector drives episodes
from the outside instead: ``reset`` gives the first observation, ``step`` takes the model's reply. An
`EpisodeBridge` runs the coroutine on an event loop thread shared by all bridges and trades turns
with it through a queue: ``start`` runs it until it first asks for a turn (or ends), ``reply`` hands
it the model's text and runs it until the next ask (or the end). Each wait is bounded by
``timeout_s``; a coroutine that raises, or never asks and never ends, makes ``start`` / ``reply``
raise, so the episode fails as any environment step does (``reward.on_error``). ``cancel`` (also when
the bridge is garbage-collected) cancels a coroutine left waiting, e.g. by an episode cut short by
the collector's limits.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_PID = 0
_LOOP_LOCK = threading.Lock()


def shared_loop() -> asyncio.AbstractEventLoop:
    """The event loop (in a daemon thread) that every bridge's coroutines run on; a forked process (a
    rollout worker) starts its own, the parent's thread does not exist there."""
    global _LOOP, _LOOP_PID
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed() or _LOOP_PID != os.getpid():
            _LOOP, _LOOP_PID = asyncio.new_event_loop(), os.getpid()
            threading.Thread(target=_LOOP.run_forever, name="reinforge-episode-bridge", daemon=True).start()
        return _LOOP


class EpisodeEnded(RuntimeError):
    """``reply`` after the coroutine finished."""


@dataclass
class Ask:
    """The coroutine asks for a model turn, after the observation ``text`` (None: answer what is there)."""

    text: Any


@dataclass
class Done:
    """The coroutine finished; ``value`` is what it returned."""

    value: Any


class EpisodeBridge:
    """``play(turn)`` is the episode's coroutine; it calls ``await turn(observation)`` for each model turn
    and gets the model's reply text."""

    def __init__(self, play: Callable[[Callable[[Any], Awaitable[str]]], Awaitable[Any]], timeout_s: float) -> None:
        self._play, self.timeout_s = play, timeout_s
        self._events: queue.Queue = queue.Queue()
        self._pending: asyncio.Future | None = None
        self._future: Future | None = None
        self._loop = shared_loop()
        self.finished = False

    async def _turn(self, observation: Any) -> str:
        self._pending = self._loop.create_future()
        self._events.put(Ask(observation))
        return await self._pending

    async def _run(self) -> None:
        try:
            value = await self._play(self._turn)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            self._events.put(e)
            if isinstance(e, asyncio.CancelledError):
                raise
        else:
            self._events.put(Done(value))

    def start(self) -> Ask | Done:
        """Run the coroutine until it first asks for a turn or ends."""
        self._future = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        return self._next()

    def reply(self, text: str) -> Ask | Done:
        """Answer the pending ask with ``text``; run until the next ask or the end."""
        pending = self._pending
        if self.finished or pending is None:
            raise EpisodeEnded("the episode's coroutine already finished")
        self._pending = None
        self._loop.call_soon_threadsafe(_resolve, pending, text)
        return self._next()

    def _next(self) -> Ask | Done:
        try:
            event = self._events.get(timeout=self.timeout_s or None)
        except queue.Empty:
            self.cancel()
            raise TimeoutError(f"the episode's coroutine neither asked for a turn nor ended within {self.timeout_s:g} s") \
                from None
        if isinstance(event, BaseException):
            self.finished = True
            raise event
        if isinstance(event, Done):
            self.finished = True
        return event

    def cancel(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.cancel()
        self.finished = True

    def __del__(self) -> None:
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)
