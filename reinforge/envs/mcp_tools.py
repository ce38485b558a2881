"""MCP tools: the tools of any Model Context Protocol server (a stdio command or a streamable-HTTP URL)
as the toolset of a tool environment, with the same interface and guarantees as `Toolbox`.

`MCPToolbox` connects once, lists the server's tools and turns each input JSON schema into the
chat-template schema ``{"type": "function", "function": {name, description, parameters}}``. `call`
never raises: a malformed call, an unknown tool, missing or unexpected arguments (checked here
against the listed schema; types are checked by the server), an error reported by the server, a
call over ``timeout_s`` and a server that died all come back as ``error: ...`` results, so a dead
server ends as failed tool calls inside episodes, never as a crashed run. After the server dies,
the next call reconnects (at most ``max_reconnects`` times in all; then every call reports the
session dead).

The SDK (``mcp``, the ``agents`` extra) is async: each toolbox runs one event loop in a daemon
thread of its own, holds the session open there, and callers from any thread submit calls to it;
at most ``max_concurrency`` calls are in flight at once (waiting for a slot counts toward
``timeout_s``). `close` (also at interpreter exit) ends the session and, for a stdio server, its
process.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import os
import threading
import weakref
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reinforge.envs.tools import MalformedToolCall, ToolCall, ToolResult, _cap

_OPEN: weakref.WeakSet[MCPToolbox] = weakref.WeakSet()


class MCPServerConfig(BaseModel):
    """Where the MCP server is (``command`` + ``args`` + ``env`` for stdio, or ``url`` for streamable
    HTTP) and how its tools are called."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = Field(None, description="stdio: the server's executable")
    args: tuple[str, ...] = Field((), description="stdio: its command-line arguments")
    env: dict[str, str] | None = Field(None, description="stdio: extra environment variables of the server process")
    cwd: str | None = Field(None, description="stdio: the server's working directory")
    url: str | None = Field(None, description="streamable HTTP: the server's MCP endpoint")
    tools: tuple[str, ...] | None = Field(None, description="only these of the server's tools (default: all it lists)")
    timeout_s: float = Field(10.0, gt=0, description="one tool call (queueing included); over it: an error result")
    connect_timeout_s: float = Field(30.0, gt=0, description="starting, initialising and listing the tools")
    max_concurrency: int = Field(8, ge=1, description="tool calls in flight at once")
    max_output_chars: int = Field(1000, ge=1, description="longer results are cut")
    max_reconnects: int = Field(3, ge=0, description="reconnections after the server died, in all")
    on_server_failure: Literal["tool_error", "episode_error"] = Field(
        "tool_error", description="a dead server: an error result the model sees (tool_error), or `call` raises "
        "MCPServerFailure so the environment step fails and reward.on_error decides (episode_error)")

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (a stdio server) or url (a streamable-HTTP server)")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd go with command (stdio), not with url")
        return self

    def __hash__(self) -> int:
        return hash(self.model_dump_json())


def mcp_schema(tool: Any) -> dict[str, Any]:
    """The chat-template schema of a listed MCP tool (its input schema as ``parameters``)."""
    parameters = copy.deepcopy(tool.input_schema) or {"type": "object", "properties": {}}
    parameters.pop("title", None)
    for prop in (parameters.get("properties") or {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    description = (tool.description or tool.name).strip()
    return {"type": "function", "function": {"name": tool.name, "description": description, "parameters": parameters}}


def _result_text(result: Any) -> str:
    parts = [getattr(block, "text", None) or f"[{getattr(block, 'type', 'content')}]" for block in result.content]
    return "\n".join(parts) if parts else "(no output)"


class MCPSessionDead(RuntimeError):
    """The server is gone and may not be reconnected."""


class MCPServerFailure(RuntimeError):
    """Raised by `MCPToolbox.call` under ``on_server_failure="episode_error"`` when the server is dead."""


class MCPToolbox:
    """The tools of one MCP server: ``names``, ``schemas`` and ``call`` like `Toolbox`; ``close`` ends it.

    Raises ``RuntimeError`` naming the server when it cannot be started, initialised or listed
    within ``connect_timeout_s`` (a bad recipe fails before training starts)."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.timeout_s = config.timeout_s
        self.max_output_chars = config.max_output_chars
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-tools", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._runner: Any = None
        self._dead_reason: str | None = None
        self._reconnects = 0
        self._closed = False
        self._pid = os.getpid()  # a forked child cannot use this loop thread: it opens its own toolbox
        self._slots = asyncio.Semaphore(config.max_concurrency)
        try:
            tools = self._connect()
        except BaseException:
            self.close()
            raise
        self._schemas = _chosen([mcp_schema(t) for t in tools], config.tools, self.where)
        self._params = {s["function"]["name"]: s["function"]["parameters"] for s in self._schemas}
        _OPEN.add(self)

    @property
    def where(self) -> str:
        c = self.config
        return c.url if c.url is not None else " ".join([c.command or "", *c.args])

    @property
    def names(self) -> list[str]:
        return list(self._params)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tool schemas, for ``tokenizer.apply_chat_template(messages, tools=...)`` (a fresh copy)."""
        return copy.deepcopy(self._schemas)

    # ------------------------------------------------------------ session lifetime

    def _connect(self) -> list[Any]:
        ready: asyncio.Future = self._loop.create_future()
        self._dead_reason = None
        self._runner = asyncio.run_coroutine_threadsafe(self._hold_session(ready), self._loop)
        waiter = asyncio.run_coroutine_threadsafe(_await(ready), self._loop)
        try:
            tools = waiter.result(self.config.connect_timeout_s)
        except FutureTimeout:
            raise RuntimeError(f"MCP server {self.where!r}: not ready within connect_timeout_s="
                               f"{self.config.connect_timeout_s:g}") from None
        except Exception as e:
            raise RuntimeError(f"MCP server {self.where!r}: cannot connect: {_describe(e)}") from None
        return tools

    async def _hold_session(self, ready: asyncio.Future) -> None:
        """Open the transport and session, list the tools, then hold them open until told to stop."""
        from mcp import ClientSession

        stop = self._stop = asyncio.Event()
        try:
            async with self._transport() as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                listed = await session.list_tools()
                self._session = session
                if not ready.done():
                    ready.set_result(list(listed.tools))
                await stop.wait()
        except BaseException as e:  # the server died, or never started
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            if self._stop is stop:
                self._dead_reason = self._dead_reason or _describe(e)
        finally:
            if self._stop is stop:  # still the current session (a reconnection makes a new one)
                self._session = None
                if self._dead_reason is None and not self._closed:
                    self._dead_reason = "the server closed the connection"

    def _transport(self) -> Any:
        from mcp import StdioServerParameters, stdio_client

        c = self.config
        if c.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(c.url)
        params = StdioServerParameters(command=c.command, args=list(c.args), env=c.env, cwd=c.cwd)
        return stdio_client(params)

    def _ensure_session(self) -> None:
        """Reconnect after the server died (``max_reconnects`` in all), else raise `MCPSessionDead`."""
        with self._lock:
            if self._closed:
                raise MCPSessionDead("the MCP toolbox is closed")
            if self._session is not None:
                return
            reason = self._dead_reason or "the session ended"
            if self._reconnects >= self.config.max_reconnects:
                raise MCPSessionDead(f"MCP server {self.where!r} is dead ({reason}); "
                                     f"max_reconnects={self.config.max_reconnects} used")
            self._reconnects += 1
            try:
                self._connect()
            except RuntimeError as e:
                raise MCPSessionDead(f"MCP server died ({reason}); reconnecting failed: {e}") from None

    def close(self) -> None:
        """End the session (and a stdio server's process) and the event loop; idempotent."""
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._runner is not None:
            try:
                self._runner.result(10.0)
            except Exception:  # noqa: BLE001 - closing: the session's own failure is already recorded
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)

    # ------------------------------------------------------------ calls

    def call(self, call: ToolCall | MalformedToolCall) -> ToolResult:
        """Run one call on the server; every failure is an ``error: ...`` result, never an exception
        (except a dead server under ``on_server_failure="episode_error"``: `MCPServerFailure`)."""
        if isinstance(call, MalformedToolCall):
            return ToolResult(f"error: malformed tool call: {call.error}", False)
        params = self._params.get(call.name)
        if params is None:
            return ToolResult(f"error: unknown tool {call.name!r}; available: {', '.join(self._params)}", False)
        problems = _argument_problems(params, call.arguments)
        if problems:
            return ToolResult(f"error: bad arguments for {call.name}: {problems}", False)
        try:
            self._ensure_session()
        except MCPSessionDead as e:
            return self._server_failure(str(e))
        future = asyncio.run_coroutine_threadsafe(self._call(call), self._loop)
        try:
            result = future.result(self.timeout_s)
        except FutureTimeout:
            future.cancel()
            return ToolResult(f"error: timed out after {self.timeout_s:g}s", False)
        except MCPSessionDead as e:
            return self._server_failure(str(e))
        except Exception as e:  # noqa: BLE001 - the transport failed
            return ToolResult(_cap(f"error: MCP server {self.where!r}: {_describe(e)}", self.max_output_chars), False)
        text = _result_text(result)
        if result.is_error:
            return ToolResult(_cap(f"error: {text}", self.max_output_chars), False)
        return ToolResult(_cap(text, self.max_output_chars), True)

    def _server_failure(self, message: str) -> ToolResult:
        if self.config.on_server_failure == "episode_error":
            raise MCPServerFailure(message)
        return ToolResult(_cap(f"error: {message}", self.max_output_chars), False)

    async def _call(self, call: ToolCall) -> Any:
        from mcp import MCPError

        async with self._slots:
            session = self._session
            if session is None:
                raise MCPSessionDead(self._dead_reason or "the session ended")
            try:
                return await session.call_tool(call.name, call.arguments)
            except MCPError as e:
                if e.error.code != _CONNECTION_CLOSED:
                    raise
                self._end_session(_describe(e))
                raise MCPSessionDead(f"MCP server {self.where!r} died during the call ({_describe(e)})") from None
            except (OSError, EOFError) as e:  # a broken transport
                self._end_session(_describe(e))
                raise MCPSessionDead(f"MCP server {self.where!r}: the connection broke ({_describe(e)})") from None

    def _end_session(self, reason: str) -> None:
        """On the loop: record why the session ended and let its holder exit (a stdio server is stopped)."""
        if self._dead_reason is None:
            self._dead_reason = reason
        self._session = None
        if self._stop is not None:
            self._stop.set()


_CONNECTION_CLOSED = -32000  # the SDK's code for 'Connection closed'


def _chosen(schemas: list[dict[str, Any]], names: tuple[str, ...] | None, where: str) -> list[dict[str, Any]]:
    listed = [s["function"]["name"] for s in schemas]
    if names is None:
        return schemas
    missing = [n for n in names if n not in listed]
    if missing:
        raise ValueError(f"tools: MCP server {where!r} has no tool {', '.join(map(repr, missing))}; it lists: "
                         f"{', '.join(listed) or 'none'}")
    return [s for s in schemas if s["function"]["name"] in names]


def _argument_problems(parameters: dict[str, Any], arguments: dict[str, Any]) -> str:
    """Missing required and unexpected arguments by the listed schema ('' when none)."""
    properties = parameters.get("properties") or {}
    problems = [f"missing required argument {k!r}" for k in parameters.get("required", []) if k not in arguments]
    if parameters.get("additionalProperties", True) is False or properties:
        problems += [f"unexpected argument {k!r} (takes: {', '.join(properties) or 'nothing'})"
                     for k in arguments if k not in properties]
    return "; ".join(problems)


def _describe(e: BaseException) -> str:
    inner = getattr(e, "exceptions", None)  # an ExceptionGroup from the SDK's task groups
    if inner:
        return _describe(inner[0])
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


async def _await(future: asyncio.Future) -> Any:
    return await future


_TOOLBOXES: dict[MCPServerConfig, MCPToolbox] = {}
_TOOLBOXES_LOCK = threading.Lock()


def mcp_toolbox(config: MCPServerConfig | dict[str, Any]) -> MCPToolbox:
    """The shared toolbox of a server config (one connection per config and process, opened on first use)."""
    if not isinstance(config, MCPServerConfig):
        config = MCPServerConfig.model_validate(config)
    with _TOOLBOXES_LOCK:
        box = _TOOLBOXES.get(config)
        if box is None or box._closed or box._pid != os.getpid():
            box = _TOOLBOXES[config] = MCPToolbox(config)
        return box


def mcp_toolbox_of(settings: dict[str, Any]) -> MCPToolbox:
    """`mcp_toolbox` for a recipe's ``env.mcp``: every problem is a ``ValueError`` naming ``mcp.<field>``."""
    from pydantic import ValidationError

    if not isinstance(settings, dict):
        raise ValueError(f"mcp: expected a mapping {{command: ..., args: [...]}} or {{url: ...}}, got {settings!r}")
    try:
        config = MCPServerConfig.model_validate(settings)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"mcp{'.' + where if where else ''}: {message}") from None
    try:
        return mcp_toolbox(config)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"mcp: {e}") from None


@atexit.register
def close_all() -> None:
    """Close every open MCP toolbox (their stdio servers exit)."""
    for box in list(_OPEN):
        box.close()
    _TOOLBOXES.clear()
