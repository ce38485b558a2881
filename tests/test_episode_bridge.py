"""reinforge/envs/episode_bridge.py: a coroutine that asks for turns, played as start / reply calls."""

from __future__ import annotations

import asyncio
import time

import pytest

from reinforge.envs.episode_bridge import Ask, Done, EpisodeBridge, EpisodeEnded


async def _two_turns(turn):
    first = await turn(None)
    second = await turn(f"you said {first}")
    return first + second


def test_turns_are_traded_in_order_and_the_value_comes_back():
    bridge = EpisodeBridge(_two_turns, timeout_s=5)
    assert bridge.start() == Ask(None)
    assert bridge.reply("a") == Ask("you said a")
    assert bridge.reply("b") == Done("ab") and bridge.finished
    with pytest.raises(EpisodeEnded):
        bridge.reply("c")


def test_a_coroutine_that_raises_or_hangs_fails_the_call():
    async def broken(turn):
        await turn("go")
        raise ValueError("env bug")

    bridge = EpisodeBridge(broken, timeout_s=5)
    assert bridge.start() == Ask("go")
    with pytest.raises(ValueError, match="env bug"):
        bridge.reply("x")

    async def hangs(turn):
        await asyncio.sleep(60)

    with pytest.raises(TimeoutError, match="neither asked for a turn nor ended within 0.2 s"):
        EpisodeBridge(hangs, timeout_s=0.2).start()


def test_cancel_stops_a_coroutine_left_waiting():
    cancelled = []

    async def waits(turn):
        try:
            await turn("go")
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    bridge = EpisodeBridge(waits, timeout_s=5)
    bridge.start()
    bridge.cancel()
    for _ in range(100):
        if cancelled:
            break
        time.sleep(0.01)
    assert cancelled == [True]
