"""What an agent function holds besides its ``base_url``: its episode's reward token and the proxy's API key.

The model-facing ``base_url`` (``<proxy>/episodes/<id>/v1``) carries neither: a model that reaches
the proxy through a generic HTTP or browsing tool cannot post its own reward, because a reward post
needs the episode's token in the ``X-Reinforge-Reward-Token`` header, and the token lives only in
the harness's process. Episode ids are random (``new_episode_id``: 128 bits), so no episode can
reach another's.

``run_agent_episodes`` registers each episode's ``Credentials`` under its ``base_url`` while the
agent runs; agent code posts the reward with ``post_reward(base_url, reward, info=...)`` (the token
and key are sent for it), or builds its own request with ``reward_headers(base_url)``, or gives
``api_key(base_url)`` to its OpenAI client when the proxy has a key. Needs httpx, not FastAPI.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx  # at import, not in post_reward: a first import racing agent threads leaves them a half-made module

from reinforge.errors import ReinforgeError

REWARD_TOKEN_HEADER = "X-Reinforge-Reward-Token"
"""The header a reward post carries the episode's reward token in."""


@dataclass(frozen=True)
class Credentials:
    """One episode's secrets: its reward token and the proxy's API key (None: the proxy has none)."""

    episode_id: str
    reward_token: str
    api_key: str | None = None


_registry: dict[str, Credentials] = {}
_lock = threading.Lock()


def new_secret() -> str:
    """A fresh random secret: 32 bytes (256 bits) from ``secrets``, URL-safe text."""
    return secrets.token_urlsafe(32)


def new_episode_id(label: str = "") -> str:
    """An unguessable episode id: 16 random bytes (128 bits), after ``label`` (e.g. ``t3s1``: task and
    sample, for logs only; it adds no guessable structure to the random part)."""
    token = secrets.token_urlsafe(16)
    return f"{label}-{token}" if label else token


def secret_matches(given: str | None, expected: str | None) -> bool:
    """``given == expected`` in constant time; never true without an expected secret."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def register(base_url: str, credentials: Credentials) -> None:
    """Hold ``credentials`` for the agent playing at ``base_url`` (the harness does this)."""
    with _lock:
        _registry[base_url] = credentials


def forget(base_urls: list[str]) -> None:
    with _lock:
        for url in base_urls:
            _registry.pop(url, None)


def credentials(base_url: str) -> Credentials:
    """The credentials of the episode at ``base_url`` (while its agent runs)."""
    with _lock:
        found = _registry.get(base_url)
    if found is None:
        raise ReinforgeError(f"no episode credentials for {base_url!r}: call this inside the agent function "
                             "that run_agent_episodes gave this base_url, while it runs")
    return found


def api_key(base_url: str) -> str:
    """The API key the agent's OpenAI client sends to the proxy (``"unused"`` when the proxy has none)."""
    return credentials(base_url).api_key or "unused"


def reward_headers(base_url: str) -> dict[str, str]:
    """The headers of a reward post for the episode at ``base_url``: its reward token (and the API key)."""
    creds = credentials(base_url)
    headers = {REWARD_TOKEN_HEADER: creds.reward_token}
    if creds.api_key:
        headers["Authorization"] = f"Bearer {creds.api_key}"
    return headers


def reward_url(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1") + "/reward"


def post_reward(base_url: str, reward: float, info: Mapping[str, Any] | None = None, done: bool = True,
                timeout: float = 60.0) -> dict[str, Any]:
    """Post the episode's reward (``POST <base_url without /v1>/reward``) with its token; raises on
    a refusal (``httpx.HTTPStatusError``). Returns the proxy's answer."""
    body: dict[str, Any] = {"reward": reward}
    if info is not None:
        body["info"] = dict(info)
    if not done:
        body["done"] = False
    response = httpx.post(reward_url(base_url), json=body, headers=reward_headers(base_url), timeout=timeout)
    response.raise_for_status()
    return response.json()
