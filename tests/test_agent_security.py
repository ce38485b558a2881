"""What the agent proxy and ``reinforge serve`` keep out (docs/agents.md, "Security"): a model that
posts its own reward through a tool, an episode reaching another's, requests without the API key."""

from __future__ import annotations

import base64
import json
import logging
import re
from types import SimpleNamespace

import httpx
import pytest
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

openai = pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from fastapi.testclient import TestClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from reinforge.errors import ReinforgeError  # noqa: E402
from reinforge.orchestrate.agent_episodes import BackgroundServer, run_agent_episodes  # noqa: E402
from reinforge.orchestrate.collectors import AgentDriven  # noqa: E402
from reinforge.rollout.openai_engine import OpenAIRolloutEngine  # noqa: E402
from reinforge.rollout.torch_engine import TorchRolloutEngine  # noqa: E402
from reinforge.rollout.types import Generation, SamplingParams  # noqa: E402
from reinforge.serve import agent_auth  # noqa: E402
from reinforge.serve.app import create_app  # noqa: E402
from reinforge.serve.proxy import AgentProxy  # noqa: E402
from reinforge.types import Task  # noqa: E402

HTTP_TOOL = [{"type": "function", "function": {"name": "http_post", "description": "POST JSON to a URL",
                                                "parameters": {"type": "object", "properties": {
                                                    "url": {"type": "string"}, "json": {"type": "object"}}}}}]
TASK = Task("t", "Say done.", "done")


class ScriptedModel(TorchRolloutEngine):
    """A "model" that reads the first reward URL in its context and, while no tool result is there,
    writes a tool call posting reward 1 to it; then it says it is done."""

    def generate(self, requests, params, generator=None, on_step=None):
        out = []
        for r in requests:
            context = self.tokenizer.decode(r.prompt_ids, skip_special_tokens=False)
            target = re.search(r"(http://\S+?)/v1\b", context)
            if target and "status" not in context:
                call = {"name": "http_post", "arguments": {"url": target.group(1) + "/reward", "json": {"reward": 1.0}}}
                text = f"<tool_call>{json.dumps(call)}</tool_call>"
            else:
                text = "done"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Generation(r.request_id, r.prompt_ids, ids, [-1.0] * len(ids), "stop", self.version, text))
        return out


@pytest.fixture(scope="module")
def tok():
    return ascii_chat_tokenizer()


def _proxy(tok, **options) -> AgentProxy:
    engine = ScriptedModel(tiny_random_llama(tok, max_positions=2048), tok, "cpu", seed=0)
    return AgentProxy(engine, max_tokens=300, **options)


def leaky_agent(base_url: str, task: Task) -> float:
    """An agent that shows the model its own base URL and runs whatever HTTP post the model asks for
    (a generic HTTP tool); the task's real score is 0."""
    client = openai.OpenAI(base_url=base_url, api_key=agent_auth.api_key(base_url), max_retries=0)
    messages = [{"role": "user", "content": f"{task.prompt} (you are served at {base_url})"}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=HTTP_TOOL).choices[0].message
    assert reply.tool_calls, reply  # the scripted model calls its tool
    args = json.loads(reply.tool_calls[0].function.arguments)
    response = httpx.post(args["url"], json=args["json"])  # the model's request: no reward token
    messages += [reply.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": f"status {response.status_code}"}]
    final = client.chat.completions.create(model="m", messages=messages, tools=HTTP_TOOL)
    assert final.choices[0].message.content == "done"
    return 0.0


def test_a_model_posting_its_own_reward_through_its_tool_is_refused_and_logged(tok, caplog):
    proxy = _proxy(tok)
    try:
        with BackgroundServer(proxy.app) as url, caplog.at_level(logging.WARNING, "reinforge.serve.proxy"):
            runner = SimpleNamespace(proxy=proxy, run=lambda tasks, n, group_offset, greedy:
                                     run_agent_episodes(tasks, leaky_agent, proxy, url, n))
            collected = AgentDriven(runner).collect([TASK], SamplingParams(n=2), seed=0)
    finally:
        proxy.close()
    trajs = collected.trajectories
    assert [t.reward for t in trajs] == [0.0, 0.0]  # the returned score, not the model's 1.0
    assert all("status 403" in t.completion_text for t in trajs)  # the tool result the model saw
    assert collected.metrics == {"agent/refused_rewards": 2.0}
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    episodes = sorted(t.metadata["episode_id"] for t in trajs)
    assert len(refused) == 2 and all("no reward token" in m for m in refused)
    assert sorted(next(e for e in episodes if e in m) for m in refused) == episodes  # each names its episode


def test_episode_ids_are_unguessable_and_unique():
    ids = [agent_auth.new_episode_id("t3s1") for _ in range(2000)]
    assert len(set(ids)) == 2000
    for eid in ids[:50]:
        label, random_part = eid.split("-", 1)
        assert label == "t3s1"
        assert len(base64.urlsafe_b64decode(random_part + "==")) == 16  # 128 random bits
    assert len(agent_auth.new_secret()) >= 43  # 256 bits
    assert agent_auth.secret_matches("abc", "abc") and not agent_auth.secret_matches("abd", "abc")
    assert not agent_auth.secret_matches(None, None) and not agent_auth.secret_matches("", "")


def test_another_episodes_id_cannot_be_reached(tok):
    proxy = _proxy(tok, open_on_call=False)
    proxy.open_episode("mine", reward_token="my-token")
    proxy.open_episode("theirs", reward_token="their-token")
    try:
        with TestClient(proxy.app) as http:
            mine = {agent_auth.REWARD_TOKEN_HEADER: "my-token"}
            other = http.post("/episodes/theirs/reward", json={"reward": 1.0}, headers=mine)
            nobody = http.post("/episodes/nobody/reward", json={"reward": 1.0}, headers=mine)
            assert other.status_code == nobody.status_code == 403
            assert other.json() == nobody.json()  # the same answer whether the episode exists or not
            assert "theirs" not in other.text
            call = http.post("/episodes/guessed/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "hi"}]})
            assert call.status_code == 404 and call.json()["error"]["code"] == "episode_not_found"
            assert sorted(proxy.episode_ids()) == ["mine", "theirs"]  # the guess opened nothing
            assert proxy.status("theirs").reward is None
            ok = http.post("/episodes/mine/reward", json={"reward": 0.5}, headers=mine)
            assert ok.status_code == 200 and proxy.status("mine").reward == 0.5
    finally:
        proxy.close()
    assert proxy.take_refused_rewards() == 2 and proxy.take_refused_rewards() == 0


def test_rewards_only_from_the_return_value(tok):
    proxy = _proxy(tok, reward_endpoint=False)

    def agent(base_url: str, task: Task) -> float:
        openai.OpenAI(base_url=base_url, api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.prompt}])
        with pytest.raises(httpx.HTTPStatusError) as e:
            agent_auth.post_reward(base_url, 10.0)  # with the right token, still refused
        assert e.value.response.status_code == 403 and "return value" in e.value.response.json()["error"]["message"]
        return 0.25

    try:
        with BackgroundServer(proxy.app) as url:
            trajs = run_agent_episodes([TASK], agent, proxy, url, group_size=2)
    finally:
        proxy.close()
    assert [t.reward for t in trajs] == [0.25, 0.25] and proxy.take_refused_rewards() == 2


def _returning_agent(base_url: str, task: Task) -> None:
    client = openai.OpenAI(base_url=base_url, api_key=agent_auth.api_key(base_url), max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
    agent_auth.post_reward(base_url, 0.75, info={"correct": False})  # sends the token and the key


def test_the_proxy_api_key(tok):
    proxy = _proxy(tok, api_key="proxy-key")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        with TestClient(proxy.app) as http:
            assert http.get("/health").status_code == 200  # open without the key
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "proxy-key"}):
                r = http.post("/episodes/e/v1/chat/completions", json=chat, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
                assert http.get("/episodes/e/v1/models", headers=headers).status_code == 401
            proxy.open_episode("r", reward_token="tok")  # the reward route needs the key as well as the token
            r = http.post("/episodes/r/reward", json={"reward": 1.0}, headers={agent_auth.REWARD_TOKEN_HEADER: "tok"})
            assert r.status_code == 401 and proxy.status("r").reward is None
            assert proxy.episode_ids() == ["r"]  # refused calls opened nothing
            proxy.discard(["r"])
            good = http.post("/episodes/e/v1/chat/completions", json=chat, headers={"Authorization": "Bearer proxy-key"})
            assert good.status_code == 200
            proxy.discard(["e"])
        with BackgroundServer(proxy.app) as url:
            trajs = run_agent_episodes([TASK], _returning_agent, proxy, url, group_size=2)
        assert [t.reward for t in trajs] == [0.75, 0.75]
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def keyed_server(tok):
    engine = TorchRolloutEngine(tiny_random_llama(tok), tok, "cpu", seed=0)
    app = create_app(engine, "m", api_key="serve-key")
    with BackgroundServer(app, log_level="error") as url:
        yield app, url, engine


def test_serve_requires_the_api_key_on_every_route_but_health(keyed_server):
    _, url, engine = keyed_server
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/reinforge/info"), ("POST", "/reinforge/weights?version=1")]:
        for headers in ({}, {"Authorization": "Bearer serve-kez"}, {"Authorization": "Basic serve-key"}):
            r = httpx.request(method, url + path, headers=headers, content=b"x" * 10)
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["error"] == {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                         "param": None, "code": "invalid_api_key"}
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=url + "/v1", api_key="serve-key", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["m"]
    assert client.completions.create(model="m", prompt=[5, 6, 7], max_tokens=3).choices[0].finish_reason


def test_the_openai_rollout_engine_sends_the_key_with_its_weights(keyed_server, tok):
    _, url, engine = keyed_server
    OpenAIRolloutEngine(url + "/v1", "m", tok, api_key="serve-key").update_weights(engine.model, 1)
    with pytest.raises(ReinforgeError, match="401"):
        OpenAIRolloutEngine(url + "/v1", "m", tok, api_key="wrong").update_weights(engine.model, 2)


def test_reinforge_serve_takes_the_key_from_the_flag_or_the_environment(monkeypatch):
    import uvicorn

    import reinforge.serve.launch as launch
    from reinforge.cli import app

    seen = []
    monkeypatch.setattr(launch, "build_server_app", lambda *a, **k: seen.append(a[-1]) or SimpleNamespace(
        state=SimpleNamespace(server=SimpleNamespace(model_name="m"))))
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    monkeypatch.delenv("REINFORGE_API_KEY", raising=False)
    runner = CliRunner()
    assert runner.invoke(app, ["serve", "--model", "x"]).exit_code == 0
    assert runner.invoke(app, ["serve", "--model", "x", "--api-key", "flag-key"]).exit_code == 0
    assert runner.invoke(app, ["serve", "--model", "x"], env={"REINFORGE_API_KEY": "env-key"}).exit_code == 0
    assert seen == [None, "flag-key", "env-key"]


def test_the_recipe_options_reach_the_training_proxy(tok):
    from reinforge.config import EnvConfig, RolloutConfig
    from reinforge.orchestrate.collectors import build_collector

    engine = ScriptedModel(tiny_random_llama(tok, max_positions=2048), tok, "cpu", seed=0)
    env = EnvConfig.model_validate({"name": "agent", "agent": "agent_fixtures:returning_agent",
                                    "agent_api_key": "recipe-key", "agent_reward_endpoint": False})
    collector = build_collector(env, RolloutConfig(), engine, lambda: None, None, 2048)
    try:
        proxy = collector.runner.proxy
        assert (proxy.api_key, proxy.reward_endpoint, proxy.open_on_call) == ("recipe-key", False, False)
        assert httpx.get(collector.runner.url + "/episodes/x/v1/models").status_code == 401
    finally:
        collector.close()
    default = EnvConfig.model_validate({"name": "agent", "agent": "agent_fixtures:returning_agent"})
    assert (default.agent_api_key, default.agent_reward_endpoint) == (None, True)
