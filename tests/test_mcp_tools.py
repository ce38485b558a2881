"""MCP tools (reinforge/envs/mcp_tools.py) against a local stdio MCP server (tests/mcp_calculator_server.py):
listing, calls, error results, timeouts, concurrency, a server dying mid-episode, clean close, recipe config."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the agents extra (mcp) is not installed")
psutil = pytest.importorskip("psutil")

from reinforge.envs.mcp_tools import MCPServerConfig, MCPToolbox  # noqa: E402
from reinforge.envs.tools import MalformedToolCall, ToolCall, ToolResult  # noqa: E402

SERVER = str(Path(__file__).with_name("mcp_calculator_server.py"))


def _server(**options) -> MCPServerConfig:
    return MCPServerConfig(command=sys.executable, args=(SERVER,), **options)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def box():
    toolbox = MCPToolbox(_server(timeout_s=5.0))
    yield toolbox
    toolbox.close()


def test_the_servers_tools_are_listed_as_chat_template_schemas(box):
    assert box.names == ["calc", "sleep", "die"]
    assert box.schemas[0] == {"type": "function", "function": {
        "name": "calc", "description": "Evaluate integer arithmetic with + - * and parentheses.",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}
    only = MCPToolbox(_server(tools=("calc",)))
    try:
        assert only.names == ["calc"]
    finally:
        only.close()


def test_calls_return_results_and_every_failure_is_an_error_result(box):
    assert box.call(ToolCall("calc", {"expr": "482*37"})).content == "17834"
    assert box.call(ToolCall("calc", {"expr": "(2+3)*-4"})).ok
    cases = [
        (ToolCall("nope", {}), "error: unknown tool 'nope'; available: calc, sleep, die"),
        (ToolCall("calc", {}), "error: bad arguments for calc: missing required argument 'expr'"),
        (ToolCall("calc", {"expr": "1", "x": 2}), "error: bad arguments for calc: unexpected argument 'x' (takes: expr)"),
        (MalformedToolCall("<tool_call>{", "invalid JSON"), "error: malformed tool call: invalid JSON"),
    ]
    for call, message in cases:
        assert box.call(call) == ToolResult(message, False)
    server_side = box.call(ToolCall("calc", {"expr": "7/2"}))  # the server's own error, passed on
    assert not server_side.ok and "only integers, + - * and parentheses are allowed, not '7 / 2'" in server_side.content
    wrong_type = box.call(ToolCall("calc", {"expr": 5}))  # types are checked by the server
    assert not wrong_type.ok and "valid string" in wrong_type.content


def test_timeouts_and_the_concurrency_bound_hold():
    box = MCPToolbox(_server(timeout_s=1.6, max_concurrency=1))
    try:
        results = [None, None]

        def call(i: int) -> None:
            results[i] = box.call(ToolCall("sleep", {"seconds": 1.0}))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # one slot: the second call waits ~1 s for it, then would need 1 s more: over 1.6 s
        assert sorted(r.ok for r in results) == [False, True]
        assert "error: timed out after 1.6s" in [r.content for r in results]
        assert box.call(ToolCall("calc", {"expr": "2*3"})).content == "6"  # the session survives a timeout
    finally:
        box.close()


def test_a_server_dying_mid_episode_is_an_error_result_then_a_reconnection():
    before = _children()
    box = MCPToolbox(_server(max_reconnects=1))
    try:
        (first,) = _children() - before
        died = box.call(ToolCall("die", {}))
        assert not died.ok and "died during the call" in died.content and "Connection closed" in died.content
        assert box.call(ToolCall("calc", {"expr": "20*21"})).content == "420"  # reconnected: a new process
        assert first not in _children() and len(_children() - before) == 1
        box.call(ToolCall("die", {}))
        dead = box.call(ToolCall("calc", {"expr": "1+1"}))
        assert not dead.ok and "is dead" in dead.content and "max_reconnects=1 used" in dead.content
    finally:
        box.close()


def test_a_dead_server_can_fail_the_environment_step_instead():
    """on_server_failure=episode_error: the step raises, and the loop ends the episode as env_error (or stops
    the run) by reward.on_error; tool errors and timeouts are still results."""
    from reinforge.envs.calculator import CalculatorEnv
    from reinforge.envs.mcp_tools import MCPServerFailure
    from reinforge.types import Task

    box = MCPToolbox(_server(on_server_failure="episode_error", max_reconnects=0))
    try:
        env = CalculatorEnv(toolbox=box)
        env.reset(Task(id="t", prompt="6*7=", answer="42"))
        ok = env.step({"role": "assistant", "content": '<tool_call>{"name": "calc", "arguments": {"expr": "6/7"}}</tool_call>'})
        assert ok.info["tool_errors"] == 1 and not ok.done  # the tool's own error: a result
        with pytest.raises(MCPServerFailure, match="died during the call"):
            env.step({"role": "assistant", "content": '<tool_call>{"name": "die", "arguments": {}}</tool_call>'})
        with pytest.raises(MCPServerFailure, match="is dead"):
            box.call(ToolCall("calc", {"expr": "1"}))
    finally:
        box.close()


def test_close_stops_the_server_process():
    before = _children()
    box = MCPToolbox(_server())
    (pid,) = _children() - before
    box.close()
    box.close()  # idempotent
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid not in _children()
    assert box.call(ToolCall("calc", {"expr": "1"})).content == "error: the MCP toolbox is closed"


def test_config_errors_name_the_field():
    from reinforge.envs.registry import EnvironmentConfigError, build_environment

    with pytest.raises(ValueError, match="exactly one of command"):
        MCPServerConfig()
    with pytest.raises(ValueError, match="args, env and cwd go with command"):
        MCPServerConfig(url="http://127.0.0.1:1/mcp", args=("x",))
    bad = {
        "mcp: give exactly one of command": {"args": ["x"]},
        "mcp.bogus: Extra inputs are not permitted": {"command": "x", "bogus": 1},
        "mcp.timeout_s: Input should be greater than 0": {"command": "x", "timeout_s": 0},
        "mcp: MCP server '/no/such/server': cannot connect": {"command": "/no/such/server"},
        "mcp: tools: MCP server .* has no tool 'nope'; it lists: calc, sleep, die": {
            "command": sys.executable, "args": [SERVER], "tools": ["nope"]},
    }
    for message, mcp in bad.items():
        with pytest.raises(EnvironmentConfigError, match=f"env: 'calculator': {message}"):
            build_environment("calculator", None, None, {"mcp": mcp})


@pytest.mark.slow
def test_tiny_agent_tools_trains_on_the_calculator_with_tools_served_over_mcp(tmp_path):
    """A training step of agent_calculator whose ``calc`` runs in the MCP server: the episodes call it there
    (the server logs every expression) and are scored."""
    from reinforge.config import load_config
    from reinforge.envs.mcp_tools import close_all
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    log = tmp_path / "calc.log"
    mcp = f"{{command: {sys.executable}, args: [{SERVER}], tools: [calc], env: {{MCP_CALC_LOG: {log}}}}}"
    try:
        result = train(load_config("agent_calculator", [
            f"output_dir={tmp_path}", "model.path=tiny-agent-tools", "train.steps=1", "rollout.prompts_per_step=2",
            "rollout.group_size=4", "task.heldout_size=4", "eval.every=0", "eval.final_samples=0",
            "checkpoint.every=0", "log.report=false", f"env.mcp={mcp}"]))
    finally:
        close_all()
    (row,) = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if m["step"] == 1]
    calls = log.read_text().splitlines()
    assert calls and all("*" in expr for expr in calls)  # 3-digit x 2-digit products, computed by the server
    assert len(calls) >= row["episode/tool_calls_mean"] * 8 > 0  # the 8 training episodes' calls reached the server
    assert row["episode/tool_errors_mean"] * 8 < len(calls) and "reward/mean" in row


@pytest.mark.slow
def test_an_agent_through_the_proxy_calls_tools_served_over_mcp(tmp_path, monkeypatch):
    """examples/agents/mcp_calculator.py: the proxy's function calling with the MCP server's tools; the
    episodes are token-exact single segments and their calls reached the server."""
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    import importlib

    from reinforge.data.agent_tasks import calculator_task
    from reinforge.envs.mcp_tools import close_all
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.orchestrate.agent_episodes import BackgroundServer, run_agent_episodes
    from reinforge.rollout.torch_engine import TorchRolloutEngine
    from reinforge.serve.proxy import AgentProxy

    log = tmp_path / "calc.log"
    monkeypatch.setenv("MCP_SERVER", f"env MCP_CALC_LOG={log} {sys.executable} {SERVER}")  # (a minimal environment)
    monkeypatch.setenv("MCP_TOOLS", "calc")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples" / "agents"))
    module = importlib.import_module("mcp_calculator")
    module.toolbox.cache_clear()
    tok = load_tokenizer("tiny-agent-tools")
    proxy = AgentProxy(TorchRolloutEngine(load_model("tiny-agent-tools", "float32", "cpu"), tok, "cpu", seed=0),
                       max_tokens=64, temperature=1.0, fixed_sampling=True)
    try:
        with BackgroundServer(proxy.app) as url:
            tasks = [calculator_task(i * 997, (3, 2), "*") for i in range(2)]
            trajs = run_agent_episodes(tasks, module.agent, proxy, url, group_size=4, max_workers=4)
    finally:
        proxy.close()
        close_all()
        module.toolbox.cache_clear()
    called = [t for t in trajs if t.metadata["turns"] >= 2]
    assert len(trajs) == 8 and called and all(t.metadata["echo_mismatches"] == 0 for t in trajs)
    assert len(log.read_text().splitlines()) >= len(called)  # each calling episode's calc ran on the server


def test_a_streamable_http_server_is_reached_by_url():
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:  # wait for the server to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the HTTP server did not start"
                time.sleep(0.1)
        box = MCPToolbox(MCPServerConfig(url=f"http://127.0.0.1:{port}/mcp", tools=("calc",), timeout_s=5))
        try:
            assert box.names == ["calc"] and box.call(ToolCall("calc", {"expr": "12*12"})) == ToolResult("144", True)
            assert "unknown tool 'sleep'" in box.call(ToolCall("sleep", {"seconds": 0})).content
            server.terminate()
            server.wait(10)
            gone = box.call(ToolCall("calc", {"expr": "1+1"}))  # the server stopped: an error result
            assert not gone.ok and "died during the call" in gone.content
            again = box.call(ToolCall("calc", {"expr": "1+1"}))  # reconnecting to nothing fails, also as a result
            assert not again.ok and "reconnecting failed" in again.content
        finally:
            box.close()
    finally:
        server.terminate()
        server.wait(10)


def test_episodes_share_one_toolbox_per_server_config():
    from reinforge.envs.mcp_tools import close_all
    from reinforge.envs.registry import build_environment

    before = _children()
    make = build_environment("calculator", None, None, {"mcp": {"command": sys.executable, "args": [SERVER],
                                                                "tools": ["calc"]}})
    try:
        first, second = make(), make()
        assert first.tools is second.tools and first.tools.names == ["calc"]
        assert len(_children() - before) == 1  # one server process for every episode
    finally:
        close_all()
