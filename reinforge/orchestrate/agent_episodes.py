"""Black-box agent episodes: OpenAI-API agent code played through an ``AgentProxy``.

``run_agent_episodes`` runs ``agent(base_url, task)`` ``group_size`` times per task in threads;
each run gets its own unguessable episode id (``t<task>s<sample>-`` and 128 random bits) and
``base_url`` (``<proxy>/episodes/<id>/v1``), which the agent gives to its OpenAI client. The agent
reports the reward by returning a number, or by posting it with the episode's reward token, which
the base URL does not carry (``reinforge.serve.agent_auth.post_reward(base_url, reward)``; a
posted reward wins over the return value). One group per task: group ids ``group_offset + task index``.

Failures fail loudly (``AgentError`` naming the task and episode, after every run has ended, with
the batch's episodes dropped from the proxy): an agent that raises, returns something other than a
number or None, reports no reward, or makes no model call.

``load_agent("package.module:function")`` resolves an agent named in a recipe;
``BackgroundServer`` runs an ASGI app (the proxy's) with uvicorn in a daemon thread on loopback.
"""

from __future__ import annotations

import importlib
import numbers
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import quote

from reinforge.errors import ReinforgeError
from reinforge.types import Task, Trajectory

if TYPE_CHECKING:  # the proxy needs the serve extra (fastapi); this module does not
    from reinforge.serve.proxy import AgentProxy

Agent = Callable[[str, Task], float | None]
"""``agent(base_url, task)``: plays one episode against ``base_url``; returns the reward or None."""


class AgentError(ReinforgeError):
    """Agent runs failed; the message names each task and episode."""


def load_agent(spec: str) -> Agent:
    """The agent named ``"package.module:function"`` (as a recipe gives it)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ReinforgeError(f"agent {spec!r}: expected 'package.module:function'")
    try:
        agent = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ReinforgeError(f"agent {spec!r}: cannot load it ({type(e).__name__}: {e})") from None
    if not callable(agent):
        raise ReinforgeError(f"agent {spec!r}: {type(agent).__name__} is not callable")
    return agent


def episode_base_url(server_url: str, episode_id: str) -> str:
    """The OpenAI ``base_url`` of one episode on the proxy at ``server_url``."""
    return f"{server_url.rstrip('/')}/episodes/{quote(episode_id, safe='')}/v1"


def run_agent_episodes(tasks: Sequence[Task], agent: Agent, proxy: AgentProxy, server_url: str, group_size: int,
                       max_workers: int = 8, group_offset: int = 0) -> list[Trajectory]:
    """``group_size`` concurrent agent episodes per task, as trajectories in task order (episode
    index next, then the episode's segments)."""
    if group_size < 1 or max_workers < 1:
        raise ValueError(f"group_size and max_workers must be >= 1, got {group_size} and {max_workers}")
    from reinforge.serve import agent_auth

    runs = [(t, agent_auth.new_episode_id(f"t{t}s{j}")) for t in range(len(tasks)) for j in range(group_size)]
    urls = [episode_base_url(server_url, eid) for _, eid in runs]
    for (_, eid), url in zip(runs, urls, strict=True):
        token = agent_auth.new_secret()
        proxy.open_episode(eid, reward_token=token)
        agent_auth.register(url, agent_auth.Credentials(eid, token, proxy.api_key))
    try:
        with ThreadPoolExecutor(max_workers, thread_name_prefix="reinforge-agent") as pool:
            futures = [pool.submit(agent, url, tasks[t]) for (t, _), url in zip(runs, urls, strict=True)]
            outcomes = [(f.result(), None) if f.exception() is None else (None, f.exception()) for f in futures]
    finally:
        agent_auth.forget(urls)
    failures: list[str] = []
    first_exc: BaseException | None = None
    for (t, eid), (value, exc) in zip(runs, outcomes, strict=True):
        if exc is not None:
            problems = [f"the agent raised {type(exc).__name__}: {exc}"]
            first_exc = first_exc or exc
        elif value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            problems = [f"the agent returned {value!r}; return the reward (a number) or None"]
        else:
            problems = _settle(proxy, eid, value)
        if problems:
            failures.append(f"task {tasks[t].id!r}, episode {eid!r}: " + ", ".join(problems))
    if failures:
        proxy.discard([eid for _, eid in runs])
        raise AgentError(f"{len(failures)} of {len(runs)} agent episodes failed: " + "; ".join(failures)) from first_exc
    return [traj for t, task in enumerate(tasks)
            for traj in proxy.take_trajectories([eid for u, eid in runs if u == t], group_offset + t, task.id)]


def _settle(proxy: AgentProxy, episode_id: str, value: float | None) -> list[str]:
    """Record the returned reward unless one was posted; the problems of a finished episode."""
    status = proxy.status(episode_id)
    if status.reward is None and value is not None:
        try:
            status = proxy.set_reward(episode_id, float(value))
        except ValueError as e:
            return [str(e)]
    problems = []
    if status.reward is None:
        problems.append("no reward (the agent returned None and posted none)")
    if status.calls == 0:
        problems.append("the agent made no model call through its base_url")
    if status.in_flight:
        problems.append(f"the agent returned with {status.in_flight} model call(s) still in flight")
    return problems


class BackgroundServer:
    """Serve an ASGI ``app`` with uvicorn in a daemon thread; ``with BackgroundServer(app) as url:``.

    ``port=0`` takes a free port (the socket is bound before the thread starts, so there is no race)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 30.0,
                 log_level: str = "warning") -> None:
        import uvicorn

        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        self.startup_timeout_s = startup_timeout_s
        self._server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="reinforge-proxy-server", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ReinforgeError(f"the server on {self.url} did not start within {self.startup_timeout_s}s")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class AgentRunner:
    """What the training loop needs to train a black-box agent: the proxy over the rollout engine,
    served on loopback, and the agent named in the recipe.

    Training episodes sample at the run's fixed temperature (``fixed_sampling``: the learner
    assumes one); greedy episodes (held-out evaluation, ReMax's baseline) run at temperature 0. The
    proxy serves only the episodes it opened, under ``api_key`` when one is given; with
    ``reward_endpoint=False`` rewards come only from the agent function's return value."""

    def __init__(self, spec: str, engine, *, max_tokens: int, temperature: float, top_p: float, top_k: int,
                 workers: int, api_key: str | None = None, reward_endpoint: bool = True) -> None:
        from reinforge.serve.proxy import AgentProxy

        self.agent, self.workers = load_agent(spec), workers
        self.proxy = AgentProxy(engine, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                fixed_sampling=True, api_key=api_key, reward_endpoint=reward_endpoint,
                                open_on_call=False)
        self.server = BackgroundServer(self.proxy.app)
        self.url = self.server.start()
        self._lock = threading.Lock()

    def run(self, tasks: Sequence[Task], group_size: int, group_offset: int = 0,
            greedy: bool = False) -> list[Trajectory]:
        with self._lock:
            sampled = self.proxy.temperature
            self.proxy.temperature = 0.0 if greedy else sampled
            try:
                return run_agent_episodes(tasks, self.agent, self.proxy, self.url, group_size, self.workers,
                                          group_offset)
            finally:
                self.proxy.temperature = sampled

    def player(self):
        """An ``eval.heldout`` player: an episode is correct when the agent reported ``correct``
        (``info``) or, without it, a reward of at least 1; majority voting is not defined (None)."""
        import numpy as np

        def play(tasks: Sequence[Task], params, per_task: int):
            trajs = self.run(tasks, per_task, greedy=params.greedy)
            by_group: dict[int, list[Trajectory]] = {}
            for t in trajs:  # a rewritten history splits an episode into segments: count the episode once
                by_group.setdefault(t.group_id, []).append(t)
            correct = np.zeros((len(tasks), per_task))
            for g, group in by_group.items():
                episodes = {t.metadata.get("episode_id", id(t)): t for t in group}
                for j, t in enumerate(list(episodes.values())[:per_task]):
                    ok = t.metadata.get("correct")
                    correct[g, j] = float(ok) if ok is not None else float(t.reward >= 1.0)
            return correct, [[None] * per_task for _ in tasks]

        return play

    def close(self) -> None:
        self.server.stop()
        self.proxy.close()
