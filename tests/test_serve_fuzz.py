"""`reinforge serve` and the agent proxy under bad input and load: every bad request gets a 4xx whose
message names the field, the server keeps answering, 64 concurrent clients are all served, clients
that disconnect mid-stream leave nothing behind, memory stays flat, and concurrent proxy episodes
never mix their trajectories."""

from __future__ import annotations

import json
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from reinforge.orchestrate.agent_episodes import BackgroundServer, run_agent_episodes  # noqa: E402
from reinforge.rollout.torch_engine import TorchRolloutEngine  # noqa: E402
from reinforge.serve.launch import build_server_app  # noqa: E402
from reinforge.serve.proxy import AgentProxy  # noqa: E402
from reinforge.serve.schema import ServeLimits  # noqa: E402
from reinforge.types import Task  # noqa: E402

MODEL = "tiny-base"
C, CHAT = "/v1/completions", "/v1/chat/completions"
GOOD = {"model": MODEL, "prompt": "12+34=", "max_tokens": 4}
LIMITS = ServeLimits(max_body_bytes=1 << 20, max_prompts=16, max_sequences=64, max_pending=256)

# (what, path, body, expected status, the field the message must name)
BAD = [
    ("malformed JSON", C, b"{not json", 400, None),
    ("a JSON array", C, b"[1, 2]", 400, None),
    ("temperature of the wrong type", C, {**GOOD, "temperature": "hot"}, 400, "temperature"),
    ("NaN temperature", C, b'{"model": "tiny-base", "prompt": "1+1=", "temperature": NaN}', 400, "temperature"),
    ("negative temperature", C, {**GOOD, "temperature": -1}, 400, "temperature"),
    ("infinite top_p", C, b'{"model": "tiny-base", "prompt": "1+1=", "top_p": Infinity}', 400, "top_p"),
    ("unknown model", C, {**GOOD, "model": "gpt-9"}, 404, "model"),
    ("no model", C, {"prompt": "1+1="}, 400, "model"),
    ("empty prompt", C, {**GOOD, "prompt": ""}, 400, "prompt"),
    ("empty prompt list", C, {**GOOD, "prompt": []}, 400, "prompt"),
    ("prompt longer than the context", C, {**GOOD, "prompt": "1+" * 5000}, 400, "max_tokens"),
    ("body over max_body_bytes", C, {**GOOD, "prompt": "1" * (2 << 20)}, 413, "body"),
    ("absurd n", C, {**GOOD, "n": 10**9}, 400, "n"),
    ("absurd max_tokens", C, {**GOOD, "max_tokens": 10**12}, 400, "max_tokens"),
    ("zero max_tokens", C, {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("too many prompts", C, {**GOOD, "prompt": ["1+1="] * 5000}, 400, "prompt"),
    ("n x prompts over max_sequences", C, {**GOOD, "prompt": ["1+1="] * 16, "n": 8}, 400, "n"),
    ("token id out of the vocabulary", C, {**GOOD, "prompt": [10**9]}, 400, "prompt"),
    ("negative token id", C, {**GOOD, "prompt": [-1]}, 400, "prompt"),
    ("seed beyond 64 bits", C, {**GOOD, "seed": 10**30}, 400, "seed"),
    ("five stop sequences", C, {**GOOD, "stop": ["a"] * 5}, 400, "stop"),
    ("stream of the wrong type", C, {**GOOD, "stream": "yes please"}, 400, "stream"),
    ("too many logprobs", C, {**GOOD, "logprobs": 1000}, 400, "logprobs"),
    ("negative top_k", C, {**GOOD, "top_k": -3}, 400, "top_k"),
    ("no messages", CHAT, {"model": MODEL, "messages": []}, 400, "messages"),
    ("a role that is a number", CHAT, {"model": MODEL, "messages": [{"role": 5, "content": "x"}]}, 400, "role"),
    ("an image part without a URL", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url"}]}]}, 400, "content.0.image_url.url"),
    ("a picture for a text model", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "1+1="}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]}]},
     400, "messages[0].content[1]"),
    ("an unknown content part", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "input_audio"}]}]}, 400, "content.0"),
    ("deeply nested JSON", C, b'{"model": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400, None),
]


@pytest.fixture(scope="module")
def server():
    app = build_server_app(MODEL, seed=0, limits=LIMITS)
    with BackgroundServer(app, log_level="error") as url:
        yield app, url


def _post(client: httpx.Client, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body)
    return client.post(path, content=content, headers={"content-type": "application/json"})


@pytest.mark.parametrize(("what", "path", "body", "status", "field"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_request_gets_a_4xx_naming_the_field_and_the_server_keeps_answering(server, what, path, body,
                                                                                   status, field):
    with httpx.Client(base_url=server[1], timeout=60) as client:
        reply = _post(client, path, body)
        assert reply.status_code == status, (what, reply.text[:300])
        error = reply.json()["error"]
        if field is not None:
            assert field in error["message"] or field in (error["param"] or ""), (what, error)
        assert _post(client, C, GOOD).status_code == 200


def test_busy_server_answers_503_and_recovers(server):
    state = server[0].state.server
    with httpx.Client(base_url=server[1], timeout=60) as client:
        state.pending = state.limits.max_pending
        try:
            reply = _post(client, C, GOOD)
        finally:
            state.pending = 0
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "server_busy"
        assert _post(client, C, GOOD).status_code == 200


def _completion(base: str, i: int) -> tuple[int, str]:
    with httpx.Client(base_url=base, timeout=120) as client:
        reply = _post(client, C, {**GOOD, "prompt": f"{i}+{i}=", "seed": i})
        return reply.status_code, reply.json()["choices"][0]["text"]


def test_64_concurrent_clients_are_all_served(server):
    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda i: _completion(server[1], i), range(64)))
    assert [status for status, _ in results] == [200] * 64
    assert all(isinstance(text, str) for _, text in results)
    assert server[0].state.server.pending == 0


def test_clients_that_disconnect_mid_stream_leave_nothing_behind(server):
    body = {**GOOD, "max_tokens": 32, "stream": True, "prompt": "1+"}
    for _ in range(8):
        with httpx.Client(base_url=server[1], timeout=60) as client:
            with client.stream("POST", C, json=body) as reply:
                assert reply.status_code == 200
                next(reply.iter_lines())  # one event, then hang up
    deadline = time.time() + 10
    while server[0].state.server.pending and time.time() < deadline:
        time.sleep(0.05)
    assert server[0].state.server.pending == 0
    with httpx.Client(base_url=server[1], timeout=60) as client:
        assert _post(client, C, GOOD).status_code == 200


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def test_memory_stays_flat_under_repeated_load(server):
    def burst() -> None:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: _completion(server[1], i), range(100)))

    burst()  # warm-up: allocator pools, caches
    after_warmup = _current_rss_mb()
    burst()
    burst()
    grown = _current_rss_mb() - after_warmup
    assert grown < 30, f"RSS grew {grown:.1f} MB over 200 more requests (max RSS {_max_rss_mb():.0f} MB)"


def test_64_concurrent_proxy_episodes_never_mix_their_trajectories():
    tok = ascii_chat_tokenizer()
    proxy = AgentProxy(TorchRolloutEngine(tiny_random_llama(tok), tok, "cpu", seed=0), max_tokens=4)
    tasks = [Task(f"t{i}", f"task number {i}", "") for i in range(32)]
    replies: dict[str, list[str]] = {}
    lock = threading.Lock()

    def agent(base_url: str, task: Task) -> float:
        client = httpx.Client(base_url=base_url, timeout=120)
        messages = [{"role": "user", "content": task.prompt}]
        seen = []
        for _ in range(2):
            reply = client.post("/chat/completions", json={"model": "m", "messages": messages}).json()
            content = reply["choices"][0]["message"]["content"]
            seen.append(content)
            messages = [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": "go"}]
        with lock:
            replies[base_url] = seen
        return 1.0

    try:
        with BackgroundServer(proxy.app) as url:
            trajs = run_agent_episodes(tasks, agent, proxy, url, group_size=2, max_workers=64)
    finally:
        proxy.close()
    assert len(trajs) == 64 and len({t.metadata["episode_id"] for t in trajs}) == 64
    for t in trajs:
        task = next(x for x in tasks if x.id == t.task_id)
        assert tok.decode(t.token_ids[: t.turn_spans[0][0]]).count(task.prompt) == 1  # its own prompt only
        others = [x.prompt for x in tasks if x.id != t.task_id and x.prompt not in task.prompt]
        text = tok.decode(t.token_ids)
        assert not any(f"{p}<" in text for p in others)
        own = next(v for k, v in replies.items() if t.metadata["episode_id"] in k)
        for (start, end), content in zip(t.turn_spans, own, strict=True):
            assert tok.decode(t.token_ids[start:end], skip_special_tokens=True).startswith(content)
