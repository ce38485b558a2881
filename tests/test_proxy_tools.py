"""Function-calling episodes through the agent proxy with the shipped tiny-agent: token-exact over
several tool-calling turns, forced tool_choice tokens, and echoed turns that are not the reply."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from reinforge.envs.calculator import calc, calculator_toolbox  # noqa: E402
from reinforge.envs.tools import CLOSE_TAG, OPEN_TAG  # noqa: E402
from reinforge.eval.cli_eval import resolve_eval_model  # noqa: E402
from reinforge.models.loading import load_model, load_tokenizer  # noqa: E402
from reinforge.orchestrate.agent_episodes import BackgroundServer, episode_base_url  # noqa: E402
from reinforge.rollout.torch_engine import TorchRolloutEngine  # noqa: E402
from reinforge.rollout.types import Generation  # noqa: E402
from reinforge.serve.proxy import AgentProxy  # noqa: E402
from reinforge.serve.tool_calls import template_messages  # noqa: E402

TOOLS = calculator_toolbox().schemas


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_eval_model("tiny-agent"))


@pytest.fixture(scope="module")
def proxy(tok):
    engine = TorchRolloutEngine(load_model(resolve_eval_model("tiny-agent"), "float32", "cpu"), tok, "cpu", seed=0)
    p = AgentProxy(engine, max_tokens=64, temperature=0.0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def url(proxy):
    with BackgroundServer(proxy.app) as u:
        yield u


def _client(url: str, episode: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=episode_base_url(url, episode), api_key="x", max_retries=0)


def _run_tools(message) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c.id, "content": calc(**json.loads(c.function.arguments))}
            for c in message.tool_calls]


class ChainEngine(TorchRolloutEngine):
    """tiny-agent's tokenizer with a scripted policy: for ``2*3*4*5=`` it calls calc on the first two
    factors, then on each result and the next factor, then answers (three calls, one answer); each
    reply is its text's tokens + <eos>, sampled with log-prob -0.5 each."""

    def generate(self, requests, params, generator=None, on_step=None):
        return [self._reply(r) for r in requests for _ in range(params.n)]

    def _reply(self, request) -> Generation:
        text = self.tokenizer.decode(request.prompt_ids)
        factors = text.rsplit("<|user|>", 1)[1].split("=")[0].split("*")
        results = [part.split("<|assistant|>")[0] for part in text.rsplit("<|user|>", 1)[1].split("<|tool|>")[1:]]
        done = len(results)
        if done == len(factors) - 1:
            reply = results[-1]
        else:
            left = results[-1] if results else factors[0]
            reply = OPEN_TAG + json.dumps({"name": "calc", "arguments": {"expr": f"{left}*{factors[done + 1]}"}}) + CLOSE_TAG
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Generation(request.request_id, list(request.prompt_ids), ids, [-0.5] * len(ids), "stop", self.version,
                          text=reply)


@pytest.fixture(scope="module")
def chain_url(tok):
    engine = ChainEngine(load_model(resolve_eval_model("tiny-agent"), "float32", "cpu"), tok, "cpu", seed=0)
    p = AgentProxy(engine, max_tokens=64)
    with BackgroundServer(p.app) as u:
        yield p, u
    p.close()


def test_three_function_calling_turns_are_one_token_exact_trajectory(chain_url, tok):
    """An agent loop over the official client: call, run the tool, send its result, until the answer."""
    proxy, url = chain_url
    client, messages, responses = _client(url, "fc3"), [{"role": "user", "content": "12*3*4*5="}], []
    while True:
        r = client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
        responses.append(r)
        message = r.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # echoed as the official client returns it
        if not message.tool_calls:
            break
        messages += _run_tools(message)
    assert [r.choices[0].finish_reason for r in responses] == ["tool_calls"] * 3 + ["stop"]
    assert responses[-1].choices[0].message.content == "720"
    assert all(r.model_extra["reinforge"]["segment"] == 0 and r.model_extra["reinforge"]["echo_mismatch"] is None
               for r in responses)
    proxy.set_reward("fc3", 1.0)
    (traj,) = proxy.take_trajectories(["fc3"])
    prompts = [r.choices[0].model_extra["prompt_token_ids"] for r in responses]
    completions = [r.choices[0].model_extra["token_ids"] for r in responses]
    for k in range(1, len(responses)):  # every call extends the tokens of the previous one, never re-tokenised
        assert prompts[k][: len(prompts[k - 1]) + len(completions[k - 1])] == prompts[k - 1] + completions[k - 1]
    assert traj.token_ids == prompts[-1] + completions[-1]
    spans = [(len(p), len(p) + len(c)) for p, c in zip(prompts, completions, strict=True)]
    assert traj.turn_spans == spans
    assert traj.loss_mask == [int(any(s <= i < e for s, e in spans)) for i in range(len(traj.token_ids))]
    assert traj.logprobs == [-0.5 if m else 0.0 for m in traj.loss_mask]
    # the tool results are observation tokens (mask 0); the whole sequence is the template's rendering
    observed = tok.decode([t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if not m])
    assert "<|tool|>36<|assistant|>" in observed and "<|tool|>144<|assistant|>" in observed
    rendered = tok.apply_chat_template(template_messages(messages), tools=TOOLS, tokenize=False)
    assert tok.decode(traj.token_ids) == rendered
    assert traj.metadata["echo_mismatches"] == 0 and traj.metadata["turns"] == 4


def test_a_forced_tool_choice_is_context_in_the_trajectory(proxy, url, tok):
    client = _client(url, "forced")
    ask = [{"role": "user", "content": "482*37="}]
    first = client.chat.completions.create(model="any", messages=ask, tools=TOOLS, tool_choice="required")
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    second = client.chat.completions.create(model="any", tools=TOOLS, messages=[
        *ask, message.model_dump(exclude_none=True), *_run_tools(message)])
    assert second.model_extra["reinforge"]["segment"] == 0
    proxy.set_reward("forced", 0.0)
    (traj,) = proxy.take_trajectories(["forced"])
    start = traj.turn_spans[0][0]
    assert tok.decode(traj.token_ids[start - 1:start]) == "<tool_call>" and traj.loss_mask[start - 1] == 0
    assert tok.decode(traj.token_ids[start:traj.turn_spans[0][1]]).startswith('{"name": "calc"')


def _first_call(url: str, episode: str):
    client = _client(url, episode)
    ask = [{"role": "user", "content": "482*37="}]
    message = client.chat.completions.create(model="any", messages=ask, tools=TOOLS).choices[0].message
    assert message.tool_calls
    return client, ask, message.model_dump(exclude_none=True)


def test_reserialised_arguments_still_continue_the_episode(proxy, url):
    client, ask, echo = _first_call(url, "reserialised")
    call = echo["tool_calls"][0]
    call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), separators=(",", ":"))
    echo["content"] = ""  # some frameworks send "" for null content
    r = client.chat.completions.create(model="any", tools=TOOLS, messages=[
        *ask, echo, {"role": "tool", "tool_call_id": call["id"], "content": "17834"}])
    assert r.model_extra["reinforge"]["segment"] == 0 and r.model_extra["reinforge"]["echo_mismatch"] is None
    proxy.discard(["reserialised"])


def test_an_echo_that_is_not_the_reply_is_reported_and_starts_a_new_segment(proxy, url):
    client, ask, echo = _first_call(url, "edited")
    echo["tool_calls"][0]["function"]["arguments"] = '{"expr": "482*38"}'  # the agent edited the call
    tool = {"role": "tool", "tool_call_id": echo["tool_calls"][0]["id"], "content": "18316"}
    r = client.chat.completions.create(model="any", tools=TOOLS, messages=[*ask, echo, tool])
    info = r.model_extra["reinforge"]
    assert info["segment"] == 1 and "messages.1: the echoed assistant turn is not the reply" in info["echo_mismatch"]
    assert "tool call 0 differs" in info["echo_mismatch"]
    proxy.set_reward("edited", 0.0)
    trajs = proxy.take_trajectories(["edited"])
    assert len(trajs) == 2 and all(t.metadata["echo_mismatches"] == 1 for t in trajs)


def test_on_echo_mismatch_error_refuses_the_call(proxy, url):
    client, ask, echo = _first_call(url, "strict")
    echo["tool_calls"][0]["id"] = "call_mine"
    proxy.on_echo_mismatch = "error"
    try:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="any", tools=TOOLS, messages=[
                *ask, echo, {"role": "tool", "tool_call_id": "call_mine", "content": "17834"}])
    finally:
        proxy.on_echo_mismatch = "new_segment"
    assert e.value.code == "echo_mismatch" and "messages.1" in e.value.message
    assert proxy.status("strict").in_flight == 0
    proxy.discard(["strict"])
