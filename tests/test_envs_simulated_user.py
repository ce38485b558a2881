"""The simulated user (reinforge/envs/simulated_user.py): tiny-base served by `reinforge serve` as the user,
tiny-agent as the policy through the collector; a scripted server for the stop marker, the rewards and the
failures (unreachable, an HTTP error, no answer in time), each an episode error handled by ``on_error``."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import torch

pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from stub_openai_server import text_reply  # noqa: E402

from reinforge.envs.registry import EnvironmentConfigError, build_environment  # noqa: E402
from reinforge.envs.simulated_user import SimulatedUserError  # noqa: E402
from reinforge.errors import ReinforgeError  # noqa: E402
from reinforge.orchestrate.agent_episodes import BackgroundServer  # noqa: E402
from reinforge.orchestrate.env_calls import EnvCalls  # noqa: E402
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes  # noqa: E402
from reinforge.rewards.verifiers import numeric_match  # noqa: E402
from reinforge.rollout.torch_engine import TorchRolloutEngine  # noqa: E402
from reinforge.rollout.types import SamplingParams  # noqa: E402
from reinforge.types import Task  # noqa: E402

PERSONA = "You ask sums. Say {stop} when the answer is right."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """An ASGI wrapper keeping every chat-completions request body and the body answered to it (each call is
    kept before its last body part is sent: once a client has its reply, the call is in ``calls``)."""

    def __init__(self, app) -> None:
        self.app, self.calls = app, []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        sent, answered = [], []

        async def rec():
            message = await receive()
            sent.append(message.get("body", b""))
            return message

        async def snd(message):
            if message["type"] == "http.response.body":
                answered.append(message.get("body", b""))
                if not message.get("more_body", False):  # the whole call, before the client can read its reply
                    self.calls.append((json.loads(b"".join(sent)), json.loads(b"".join(answered))))
            await send(message)

        await self.app(scope, rec, snd)


def scripted_server() -> tuple[FastAPI, list[dict]]:
    """Answers by the last (policy's) message: "hang" waits 2 s, "boom" is an HTTP 500, "mute" has no text,
    a message holding the answer 15 gets "thanks [done]", anything else "try again"."""
    app, bodies = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        bodies.append({**body, "authorization": request.headers.get("authorization")})
        last = body["messages"][-1]["content"]
        if "hang" in last:
            await asyncio.sleep(2.0)
        if "boom" in last:
            return JSONResponse({"error": {"message": "the simulator broke"}}, status_code=500)
        if "mute" in last:
            return JSONResponse({**text_reply("x"), "choices": [{"index": 0, "finish_reason": "stop",
                                                                 "message": {"role": "assistant", "content": None}}]})
        return JSONResponse(text_reply("thanks [done]" if "15" in last else "try again"))

    return app, bodies


@pytest.fixture(scope="module")
def scripted():
    app, bodies = scripted_server()
    with BackgroundServer(app, log_level="error") as url:
        yield f"{url}/v1", bodies


@pytest.fixture(scope="module")
def says_engine():
    """A tiny random policy whose turn is the next text of ``script`` (one per turn; "hmm" when it is empty)."""
    from reinforge.rollout.types import Generation

    class Says(TorchRolloutEngine):
        script: list[str] = []

        def generate(self, requests, params, generator=None, on_step=None):
            text = self.script.pop(0) if self.script else "hmm"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            return [Generation(r.request_id, r.prompt_ids, list(ids), [-0.5] * len(ids), "stop", self.version, text)
                    for r in requests for _ in range(params.n)]

    tok = ascii_chat_tokenizer()
    return Says(tiny_random_llama(tok), tok, "cpu", seed=0)


SUM = Task(id="sum", prompt="12+3=", answer="15")


def _env(url: str, verifier=numeric_match, **params):
    return build_environment("simulated_user", verifier, None,
                             {"user_url": url, "user_model": "sim", "user_system_prompt": PERSONA, **params})


def test_the_user_sees_the_flipped_conversation_and_stops_the_episode(scripted):
    url, bodies = scripted
    env = _env(url)()
    task = Task(id="chat", prompt=[{"role": "system", "content": "be exact"}, {"role": "user", "content": "12+3="}],
                answer="15")
    assert env.reset(task, 0) == task.prompt and env.role() == "assistant"
    bodies.clear()
    first = env.step({"role": "assistant", "content": "14"})
    assert first.observation == [{"role": "user", "content": "try again"}] and not first.done
    assert (first.reward, first.info["correct"], first.info["user_turns"]) == (0.0, False, 1)
    last = env.step({"role": "assistant", "content": "it is 15"})
    assert last.done and last.info["user_stopped"] and last.observation[0]["content"] == "thanks [done]"
    assert (last.reward, last.info["correct"]) == (1.0, True)
    # the simulator is the assistant of its own view: its persona, the user's messages as assistant
    # messages, the policy's turns as user messages; the policy's system prompt is not shown to it
    assert bodies[-1]["messages"] == [
        {"role": "system", "content": "You ask sums. Say [done] when the answer is right."},
        {"role": "assistant", "content": "12+3="}, {"role": "user", "content": "14"},
        {"role": "assistant", "content": "try again"}, {"role": "user", "content": "it is 15"}]
    assert (bodies[-1]["model"], bodies[-1]["max_tokens"], bodies[-1]["temperature"]) == ("sim", 64, 1.0)
    keyed = _env(url, user_api_key="sekrit", user_max_tokens=5, user_temperature=0.3)()
    keyed.reset(SUM, 0)
    keyed.step({"role": "assistant", "content": "15"})
    assert (bodies[-1]["authorization"], bodies[-1]["max_tokens"], bodies[-1]["temperature"]) == ("Bearer sekrit", 5, 0.3)


def test_the_reward_is_the_verifier_on_the_last_turn(scripted):
    url, _ = scripted
    env = _env(url, user_stop=None)()  # only the limits end the episode
    env.reset(SUM, 0)
    rewards = [env.step({"role": "assistant", "content": t}).reward for t in ("15", "14", "15", "15 or 16")]
    # s = 1, 0, 1, 0 (the last number is 16): r_k = s_k - s_(k-1); each prefix sums to its last turn's score
    assert rewards == [1.0, -1.0, 1.0, -1.0]
    assert [sum(rewards[:k]) for k in range(1, 5)] == [1.0, 0.0, 1.0, 0.0]
    no_verifier = _env(url, verifier=None)()
    no_verifier.reset(SUM, 0)
    result = no_verifier.step({"role": "assistant", "content": "15"})
    assert result.reward == 0.0 and result.done  # no verifier: 0; the user still ends it


def test_server_failures_raise_simulated_user_errors(scripted):
    url, _ = scripted
    dead = _env(f"http://127.0.0.1:{_free_port()}/v1")()
    dead.reset(SUM, 0)
    with pytest.raises(SimulatedUserError, match="APIConnectionError"):
        dead.step({"role": "assistant", "content": "15"})
    cases = {"boom": "InternalServerError: Error code: 500", "mute": "a reply without text",
             "hang": "APITimeoutError"}
    for text, message in cases.items():
        env = _env(url, user_timeout_s=0.5)()
        env.reset(SUM, 0)
        with pytest.raises(SimulatedUserError, match=message):
            env.step({"role": "assistant", "content": text})


def test_failures_end_episodes_by_on_error_and_timeouts_by_the_env_call_limit(scripted, says_engine):
    url, _ = scripted
    limits = EpisodeLimits(max_turns=3, max_total_tokens=200, max_turn_tokens=8)

    def play(make, on_error="zero", calls=None):
        return run_episodes([SUM], says_engine, make, SamplingParams(max_new_tokens=8, n=1), limits, seed=0,
                            on_error=on_error, env_calls=calls)[0]

    says_engine.script[:] = ["14", "boom"]
    t = play(_env(url))
    assert (t.metadata["truncated"], t.metadata["turns"], t.reward) == ("env_error", 2, 0.0)
    assert "InternalServerError" in t.metadata["env_error"] and t.trainable
    dead = _env(f"http://127.0.0.1:{_free_port()}/v1")
    says_engine.script[:] = ["15"]
    t = play(dead)
    assert t.metadata["truncated"] == "env_error" and "APIConnectionError" in t.metadata["env_error"]
    says_engine.script[:] = ["15"]
    with pytest.raises(ReinforgeError, match="SimulatedUserError"):
        play(dead, on_error="raise")
    says_engine.script[:] = ["hang"]  # the client would wait 60 s: env.step_timeout_s (0.5 s) ends the episode
    t = play(_env(url), calls=EnvCalls(timeout_s=0.5))
    assert t.metadata["truncated"] == "env_timeout" and "timed out after 0.5 s" in t.metadata["env_error"]
    says_engine.script[:] = ["14", "15"]
    t = play(_env(url))
    assert (t.metadata["truncated"], t.turn_rewards, t.reward, t.metadata["correct"]) == (None, [0.0, 1.0], 1.0, True)
    assert t.metadata["observations"] == [["try again"], ["thanks [done]"]]


def test_bad_settings_name_the_field():
    cases = {"env.user_url": {"user_url": "localhost:8000"}, "env.user_model": {"user_model": ""},
             "env.user_stop": {"user_stop": ""}, "env.user_max_tokens": {"user_max_tokens": 0},
             "env.user_temperature": {"user_temperature": -1.0}, "env.user_timeout_s": {"user_timeout_s": 0}}
    for field, bad in cases.items():
        with pytest.raises(EnvironmentConfigError, match=field):
            build_environment("simulated_user", None, None, {"user_url": "http://h/v1", "user_model": "m", **bad})
    with pytest.raises(EnvironmentConfigError, match="has no parameter 'user_seed'"):
        build_environment("simulated_user", None, None, {"user_url": "http://h/v1", "user_model": "m", "user_seed": 1})


# ---- tiny-base served as the user, tiny-agent as the policy --------------------------------------------------


@pytest.fixture(scope="module")
def served_user():
    from reinforge.serve.launch import build_server_app

    recorder = Recorder(build_server_app("tiny-base", seed=0))
    with BackgroundServer(recorder, log_level="error") as url:
        yield f"{url}/v1", recorder


def test_a_served_user_through_the_collector(served_user):
    from reinforge.models.loading import load_model, load_tokenizer

    url, recorder = served_user
    tok = load_tokenizer("tiny-agent")
    model = load_model("tiny-agent", "float32", "cpu")
    engine = TorchRolloutEngine(model, tok, "cpu", seed=0)
    tasks = [Task(id="a", prompt=[{"role": "user", "content": "12+3="}], answer="15"),
             Task(id="b", prompt=[{"role": "user", "content": "40+2="}], answer="42")]
    make = _env(url, user_model="tiny-base", user_temperature=0.0, user_max_tokens=4, user_stop=None,
                user_system_prompt=None)  # tiny-base's context is 64 tokens: no persona
    recorder.calls.clear()
    trajs = run_episodes(tasks, engine, make, SamplingParams(max_new_tokens=6, n=2, temperature=1.0),
                         EpisodeLimits(max_turns=3, max_total_tokens=256, max_turn_tokens=6), seed=0)
    assert len(trajs) == 4 and len(recorder.calls) == 12  # a user reply after each of 3 turns of 4 episodes
    answered = [(body["messages"], reply["choices"][0]["message"]["content"]) for body, reply in recorder.calls]
    for t in trajs:
        task = next(x for x in tasks if x.id == t.task_id)
        turns = [tok.decode(t.token_ids[a:b], skip_special_tokens=True) for a, b in t.turn_spans]
        replies = [obs[0] for obs in t.metadata["observations"]]
        view = [{"role": "assistant", "content": task.prompt[0]["content"]}]
        for k, turn in enumerate(turns):  # what the server was asked after turn k, and what it answered
            view.append({"role": "user", "content": turn})
            assert (view, replies[k]) in answered
            view.append({"role": "assistant", "content": replies[k]})
        assert t.metadata["turn_roles"] == ["assistant"] * 3
        assert t.metadata["role_rewards"] == [{"assistant": r} for r in t.turn_rewards]
        assert t.reward == pytest.approx(numeric_match(task, turns[-1]).reward)
        # token-exact: the policy's turns are mask 1, everything else (prompt, the user's turns) mask 0, and the
        # whole sequence is the chat template of the conversation (the user's replies as user messages)
        trained = {i for a, b in t.turn_spans for i in range(a, b)}
        assert [i for i, m in enumerate(t.loss_mask) if m] == sorted(trained)
        conversation = [task.prompt[0]]
        for turn, reply in zip(turns, replies, strict=True):
            conversation += [{"role": "assistant", "content": turn}, {"role": "user", "content": reply}]
        rendered = tok.apply_chat_template(conversation[:-1], tokenize=False)
        assert tok.decode(t.token_ids).removesuffix(tok.eos_token) == rendered.removesuffix(tok.eos_token)
        # the sampled log-probs are the policy's on these very tokens
        with torch.no_grad():
            logits = model(torch.tensor([t.token_ids])).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.token_ids[1:])[:, None])[:, 0]
        rows = sorted(trained)
        assert logp[[i - 1 for i in rows]].tolist() == pytest.approx([t.logprobs[i] for i in rows], abs=1e-4)


def _run_config(tmp_path, url: str, **env) -> dict:
    return {"preset": "grpo", "output_dir": str(tmp_path), "model": {"path": "tiny-agent"},
            "task": {"kind": "arithmetic", "digits": 1, "ops": "+", "heldout_size": 2, "verifier": "numeric_match"},
            "env": {"name": "simulated_user", "user_url": url, "user_model": "tiny-base", "user_system_prompt": None,
                    "user_max_tokens": 4, "max_turns": 2, "max_turn_tokens": 4, **env},
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
            "train": {"steps": 2}, "eval": {"every": 0, "final_samples": 0}, "checkpoint": {"every": 0},
            "log": {"report": False}}


def test_a_recipe_names_the_bad_setting(tmp_path):
    from reinforge.config import config_from_dict
    from reinforge.orchestrate.components import environment_factory
    from reinforge.rewards.pool import VerifierPool

    cfg = config_from_dict(_run_config(tmp_path, "http://127.0.0.1:1/v1"))
    assert cfg.env.params["user_model"] == "tiny-base" and cfg.env.params["user_max_tokens"] == 4
    with pytest.raises(EnvironmentConfigError, match=r"env.user_url: must be an http\(s\):// base URL"):
        environment_factory(config_from_dict(_run_config(tmp_path, "127.0.0.1:1")), VerifierPool(numeric_match))


def test_training_with_a_served_user(served_user, tmp_path):
    """Two GRPO steps of tiny-agent talking to tiny-base: every step's episodes ask the served user, and the run
    ends with its metrics."""
    from reinforge.config import config_from_dict
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    url, recorder = served_user
    recorder.calls.clear()
    run = train(config_from_dict(_run_config(tmp_path, url, user_temperature=0.0)))
    rows = [m for m in read_jsonl(run.run_dir / "metrics.jsonl") if "env/calls" in m]
    assert [r["step"] for r in rows] == [1, 2] and all(r["env/errors"] == 0 for r in rows)
    assert len(recorder.calls) >= 4 and all(b["model"] == "tiny-base" for b, _ in recorder.calls)
