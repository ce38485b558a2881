"""The agent proxy on loopback, driven by the official `openai` client: token-exact episodes, segments,
rewards, concurrent agent episodes, OpenAI-style errors and weight updates."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

openai = pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from fastapi.testclient import TestClient  # noqa: E402

from reinforge.errors import ReinforgeError  # noqa: E402
from reinforge.orchestrate.agent_episodes import (  # noqa: E402
    AgentError,
    BackgroundServer,
    episode_base_url,
    load_agent,
    run_agent_episodes,
)
from reinforge.rollout.chat_splice import ChatSplicer  # noqa: E402
from reinforge.rollout.torch_engine import TorchRolloutEngine  # noqa: E402
from reinforge.rollout.types import GenerationRequest, SamplingParams  # noqa: E402
from reinforge.serve.agent_auth import REWARD_TOKEN_HEADER, post_reward  # noqa: E402
from reinforge.serve.proxy import AgentProxy, EpisodeError  # noqa: E402
from reinforge.serve.worker import Job  # noqa: E402
from reinforge.types import Task  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "d", "parameters": {}}}]


@pytest.fixture(scope="module")
def tok():
    return ascii_chat_tokenizer()


@pytest.fixture(scope="module")
def proxy(tok):
    p = AgentProxy(TorchRolloutEngine(tiny_random_llama(tok), tok, "cpu", seed=0), max_tokens=6)
    yield p
    p.close()


@pytest.fixture(scope="module")
def url(proxy):
    with BackgroundServer(proxy.app) as u:
        yield u


def _client(url: str, episode_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=episode_base_url(url, episode_id), api_key="x", max_retries=0)


def _ids(response) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, completion ids, completion log-probs) of a proxy response."""
    choice = response.choices[0]
    logprobs = [c.logprob for c in choice.logprobs.content] if choice.logprobs else []
    return choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"], logprobs


def _reply(response) -> dict[str, str]:
    return {"role": "assistant", "content": response.choices[0].message.content}


def test_two_calls_are_one_token_exact_trajectory(proxy, url, tok):
    base_url = episode_base_url(url, "exact")
    proxy.open_episode("exact", reward_token="secret-exact")
    user, tool = {"role": "user", "content": "add 2+2"}, {"role": "tool", "content": "4"}

    def agent() -> list:
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        first = client.chat.completions.create(model="gpt-4o", messages=[user], logprobs=True)
        second = client.chat.completions.create(model="gpt-4o", messages=[user, _reply(first), tool],
                                                logprobs=True, max_tokens=4)
        httpx.post(base_url.removesuffix("/v1") + "/reward", json={"reward": 0.5},
                   headers={REWARD_TOKEN_HEADER: "secret-exact"}).raise_for_status()
        return [first, second]

    first, second = agent()
    p1, c1, lp1 = _ids(first)
    p2, c2, lp2 = _ids(second)
    splicer = ChatSplicer(tok)
    assert p1 == splicer.prompt_ids([user])
    assert p2 == p1 + c1 + splicer.close_turn_ids(c1) + splicer.observation_ids([tool])  # never re-tokenised
    assert 0 < len(c1) <= 6 and 0 < len(c2) <= 4 and len(lp1) == len(c1) and len(lp2) == len(c2)
    assert first.choices[0].message.content == tok.decode(c1, skip_special_tokens=True)
    assert second.usage.prompt_tokens == len(p2) and second.usage.completion_tokens == len(c2)
    assert first.model == "policy" and second.model_extra["reinforge"] == {
        "episode_id": "exact", "segment": 0, "call": 1, "policy_version": 0, "echo_mismatch": None}

    (traj,) = proxy.take_trajectories(["exact"], group_id=3)
    spans = [(len(p1), len(p1) + len(c1)), (len(p2), len(p2) + len(c2))]
    in_span = [any(s <= i < e for s, e in spans) for i in range(len(traj.token_ids))]
    assert traj.token_ids == p2 + c2
    assert traj.turn_spans == spans
    assert traj.loss_mask == [int(m) for m in in_span]
    assert [lp for lp, m in zip(traj.logprobs, in_span, strict=True) if m] == pytest.approx(lp1 + lp2, abs=1e-6)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, in_span, strict=True) if not m)
    assert traj.token_versions == [0 if m else -1 for m in in_span] and traj.version == 0
    assert traj.reward == 0.5 and traj.turn_rewards == [0.0, 0.5]
    assert (traj.group_id, traj.task_id) == (3, "exact")
    assert traj.metadata["calls"] == 2 and traj.metadata["segments"] == 1 and traj.metadata["episode_id"] == "exact"
    with pytest.raises(EpisodeError, match="already taken"):  # taken episodes are dropped ...
        proxy.status("exact")
    with pytest.raises(openai.ConflictError, match="already taken"):  # ... and do not come back
        _client(url, "exact").chat.completions.create(model="m", messages=[user])


def test_rewritten_history_or_new_tools_start_a_new_segment(proxy, url, tok):
    client = _client(url, "rewrite")
    hello = [{"role": "user", "content": "hello"}]
    r1 = client.chat.completions.create(model="m", messages=hello)
    edited = [*hello, {"role": "assistant", "content": r1.choices[0].message.content + "!"},
              {"role": "user", "content": "again"}]
    r2 = client.chat.completions.create(model="m", messages=edited)
    more = {"role": "user", "content": "more"}
    r3 = client.chat.completions.create(model="m", messages=[*edited, _reply(r2), more])
    r4 = client.chat.completions.create(model="m", messages=[*edited, _reply(r2), more, _reply(r3), more],
                                        tools=TOOLS)  # a different tool set renders differently
    splicer = ChatSplicer(tok)
    assert [r.model_extra["reinforge"]["segment"] for r in (r1, r2, r3, r4)] == [0, 1, 1, 2]
    assert _ids(r2)[0] == splicer.prompt_ids(edited)
    assert "tools: calc" in tok.decode(_ids(r4)[0])
    proxy.set_reward("rewrite", 1.0)
    trajs = proxy.take_trajectories(["rewrite"], group_id=0, task_id="t")
    assert len(trajs) == 3
    p1, c1, _ = _ids(r1)
    p3, c3, _ = _ids(r3)
    assert trajs[0].token_ids == p1 + c1
    assert trajs[1].token_ids == p3 + c3 and p3[: len(_ids(r2)[0])] == _ids(r2)[0]
    assert [t.turn_rewards for t in trajs] == [[1.0], [0.0, 1.0], [1.0]]
    assert [t.metadata["segment"] for t in trajs] == [0, 1, 2]
    assert all(t.metadata["segments"] == 3 and t.metadata["calls"] == 4 and t.reward == 1.0 for t in trajs)


def test_concurrent_agent_episodes_are_grouped_by_task(proxy, url, tok):
    tasks = [Task("a", "first", ""), Task("b", "second", ""), Task("c", "third", "")]

    def agent(base_url: str, task: Task) -> float:
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": task.prompt}]
        first = client.chat.completions.create(model="m", messages=messages)
        parts = {"role": "user", "content": [{"type": "text", "text": "g"}, {"type": "text", "text": "o"}]}
        client.chat.completions.create(model="m", messages=[*messages, first.choices[0].message, parts])
        if task.id == "b":  # a posted reward wins over the returned one
            post_reward(base_url, 10.0)  # the harness's helper sends the episode's reward token
        return float(len(task.prompt))

    trajs = run_agent_episodes(tasks, agent, proxy, url, group_size=2, max_workers=6, group_offset=5)
    assert [t.group_id for t in trajs] == [5, 5, 6, 6, 7, 7]
    assert [t.task_id for t in trajs] == ["a", "a", "b", "b", "c", "c"]
    assert [t.reward for t in trajs] == [5.0, 5.0, 10.0, 10.0, 5.0, 5.0]
    assert len({t.metadata["episode_id"] for t in trajs}) == 6
    for t, task in zip(trajs, [x for x in tasks for _ in range(2)], strict=True):
        assert len(t.turn_spans) == 2 and t.metadata["calls"] == 2 and t.metadata["segments"] == 1
        assert task.prompt in tok.decode(t.token_ids[: t.turn_spans[0][0]])
        assert "<|im_start|>user\ngo<|im_end|>" in tok.decode(t.token_ids[t.turn_spans[0][1]:t.turn_spans[1][0]])
    assert not any(t.metadata["episode_id"] in proxy.episode_ids() for t in trajs)


def test_load_agent_names_what_is_wrong():
    assert load_agent("reinforge.orchestrate.agent_episodes:episode_base_url") is episode_base_url
    for spec, words in [("no_colon", "expected"), ("reinforge.nope:f", "cannot load"),
                        ("reinforge.orchestrate.agent_episodes:nope", "cannot load"),
                        ("reinforge.orchestrate.agent_episodes:__doc__", "not callable")]:
        with pytest.raises(ReinforgeError, match=words):
            load_agent(spec)


def test_failed_agents_are_named_and_their_episodes_dropped(proxy, url):
    tasks = [Task("good", "x", ""), Task("bad", "y", ""), Task("silent", "z", ""), Task("idle", "w", "")]
    before = set(proxy.episode_ids())

    def agent(base_url: str, task: Task) -> float | None:
        if task.id == "idle":
            return 1.0
        openai.OpenAI(base_url=base_url, api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.prompt}])
        if task.id == "bad":
            raise RuntimeError("boom")
        return None if task.id == "silent" else 1.0

    with pytest.raises(AgentError) as e:
        run_agent_episodes(tasks, agent, proxy, url, group_size=1)
    message = str(e.value)
    assert message.startswith("3 of 4 agent episodes failed")
    assert "task 'bad'" in message and "RuntimeError: boom" in message and isinstance(e.value.__cause__, RuntimeError)
    assert "task 'silent'" in message and "no reward" in message
    assert "task 'idle'" in message and "no model call" in message and "task 'good'" not in message
    assert set(proxy.episode_ids()) == before


def test_bad_requests_get_openai_errors_and_the_proxy_stays_up(proxy, url):
    client = _client(url, "errors")
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages, n=2)
    assert e.value.body["param"] == "n" and "one choice per call" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages, stream=True)
    assert e.value.body["param"] == "stream"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages, max_tokens=10_000)
    assert e.value.body["code"] == "context_length_exceeded"
    picture = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {
        "url": "data:image/png;base64,iVBO"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=picture)
    assert e.value.body["param"] == "messages[0].content[1]" and "takes no pictures" in e.value.body["message"]

    r = httpx.post(f"{url}/episodes/nobody/reward", json={"reward": 1.0})
    assert r.status_code == 403 and r.json()["error"]["code"] == "reward_forbidden"
    proxy.open_episode("bodies", reward_token="secret-bodies")
    token = {REWARD_TOKEN_HEADER: "secret-bodies"}
    r = httpx.post(f"{url}/episodes/bodies/reward", content=b"{oops",
                   headers={"content-type": "application/json", **token})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/episodes/bodies/reward", json={"done": True}, headers=token)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reward"
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages})
    assert r.status_code == 404 and "error" in r.json()

    assert [m.id for m in client.models.list().data] == ["policy"]
    assert client.chat.completions.create(model="m", messages=messages).choices[0].finish_reason in ("stop", "length")
    assert proxy.status("errors").calls == 1  # rejected requests recorded nothing
    proxy.discard(["errors", "bodies"])


def test_python_reward_done_flag_and_missing_rewards(proxy, url):
    proxy.open_episode("py", reward_token="secret-py")
    client = _client(url, "py")
    messages = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model="m", messages=messages)
    with pytest.raises(EpisodeError, match=r"'py': no reward"):
        proxy.take_trajectories(["py"])
    r = httpx.post(f"{url}/episodes/py/reward", json={"reward": 0.25, "done": False, "info": {"correct": True}},
                   headers={REWARD_TOKEN_HEADER: "secret-py"})
    assert r.status_code == 200 and r.json() == {"episode_id": "py", "reward": 0.25, "done": False, "calls": 1}
    client.chat.completions.create(model="m", messages=[*messages, _reply(first), {"role": "user", "content": "ok"}])
    proxy.set_reward("py", 2.0)  # replaces the posted reward and finishes the episode
    with pytest.raises(openai.ConflictError) as e:
        client.chat.completions.create(model="m", messages=messages)
    assert e.value.body["code"] == "episode_finished"
    with pytest.raises(ValueError, match="finite"):
        proxy.set_reward("py", float("nan"))
    (traj,) = proxy.take_trajectories(["py"])
    assert traj.reward == 2.0 and traj.turn_rewards == [0.0, 2.0] and traj.metadata["correct"] is True


def test_tokens_after_update_weights_carry_the_new_version(proxy, url):
    model = proxy.engine.model
    original = {k: v.clone() for k, v in model.state_dict().items()}
    client = _client(url, "weights")
    messages = [{"role": "user", "content": "v"}]
    try:
        first = client.chat.completions.create(model="m", messages=messages)
        proxy.update_weights({k: v + 0.01 for k, v in original.items()}, version=3)
        assert proxy.engine.version == 3
        second = client.chat.completions.create(model="m", messages=[*messages, _reply(first),
                                                                     {"role": "user", "content": "w"}])
    finally:
        proxy.update_weights(original, version=0)
    assert second.model_extra["reinforge"]["policy_version"] == 3
    proxy.set_reward("weights", 0.0)
    (traj,) = proxy.take_trajectories(["weights"])
    (s1, e1), (s2, e2) = traj.turn_spans
    assert set(traj.token_versions[s1:e1]) == {0} and set(traj.token_versions[s2:e2]) == {3}
    assert set(traj.token_versions[:s1] + traj.token_versions[e1:s2]) == {-1} and traj.version == 0


def test_fixed_sampling_overrides_the_agents_temperature(tok):
    engine = TorchRolloutEngine(tiny_random_llama(tok), tok, "cpu", seed=0)
    proxy = AgentProxy(engine, max_tokens=6, temperature=0.0, fixed_sampling=True)
    messages = [{"role": "user", "content": "same"}]
    try:
        with TestClient(proxy.app) as http:
            outs = [http.post(f"/episodes/e{i}/v1/chat/completions",
                              json={"model": "m", "messages": messages, "temperature": 1.5, "seed": i}).json()
                    for i in range(3)]
        prompt = outs[0]["choices"][0]["prompt_token_ids"]
        greedy = engine.generate([GenerationRequest(prompt)], SamplingParams(max_new_tokens=6, greedy=True))[0]
        assert [o["choices"][0]["token_ids"] for o in outs] == [greedy.token_ids] * 3
        for i in range(3):
            proxy.set_reward(f"e{i}", 0.0)
        trajs = proxy.take_trajectories(["e0", "e1", "e2"])
        assert [t.metadata["temperatures"] for t in trajs] == [[0.0]] * 3
    finally:
        proxy.close()


def test_concurrent_calls_on_one_conversation_fork_a_segment(proxy, url):
    """Two calls that extend the same reply at once: the first claims the segment, the other starts a
    new one (a segment is one sequence); an episode with calls in flight cannot be taken."""
    client = _client(url, "fork")
    messages = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model="m", messages=messages)
    gate = threading.Event()
    blocker = Job([_ids(first)[0]], SamplingParams(max_new_tokens=2), on_token=lambda _: gate.wait(30))
    proxy.worker.submit(blocker)  # holds the engine thread until the gate opens
    follow = [*messages, _reply(first), {"role": "user", "content": "next"}]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(client.chat.completions.create, model="m", messages=follow) for _ in range(2)]
        deadline = time.monotonic() + 30
        while proxy.status("fork").in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            with pytest.raises(EpisodeError, match="2 call\\(s\\) still in flight"):
                proxy.take_trajectories(["fork"])
        finally:
            gate.set()
        responses = [f.result() for f in futures]
    blocker.future.result(timeout=30)
    assert sorted(r.model_extra["reinforge"]["segment"] for r in responses) == [0, 1]
    proxy.set_reward("fork", 1.0)
    trajs = proxy.take_trajectories(["fork"])
    assert [len(t.turn_spans) for t in trajs] == [2, 1]
