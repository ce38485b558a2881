"""`reinforge serve` on loopback, driven by the official `openai` client; and the `openai` rollout engine."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

openai = pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from reinforge.orchestrate.agent_episodes import BackgroundServer  # noqa: E402
from reinforge.rollout.openai_engine import OpenAIRolloutEngine  # noqa: E402
from reinforge.rollout.prompts import encode_prompt  # noqa: E402
from reinforge.rollout.types import GenerationRequest, SamplingParams  # noqa: E402
from reinforge.serve.launch import build_server_app  # noqa: E402

MODEL = "tiny-base"


@pytest.fixture(scope="module")
def server():
    app = build_server_app(MODEL, seed=0)
    with BackgroundServer(app, log_level="error") as url:
        yield app, url


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server[1]}/v1", api_key="none", max_retries=0)


def _prompt(tok, a=12, b=34) -> list[int]:
    return encode_prompt(tok, [{"role": "user", "content": f"{a}+{b}="}])


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_greedy_completion_matches_the_engine(server, client):
    app, _ = server
    engine = app.state.server.engine
    ids = _prompt(engine.tokenizer)
    expected = engine.generate([GenerationRequest(ids)], SamplingParams(max_new_tokens=8, greedy=True))[0]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0, logprobs=0,
                                  extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert choice.text == expected.text and choice.model_extra["token_ids"] == expected.token_ids
    assert choice.model_extra["prompt_token_ids"] == ids
    assert choice.logprobs.token_logprobs == pytest.approx(expected.logprobs, abs=1e-6)
    assert choice.finish_reason == expected.finish_reason
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(expected.token_ids)


def test_text_prompts_n_and_seed(client):
    kwargs = dict(model=MODEL, prompt=["12+3=", "40+41="], n=3, max_tokens=6, temperature=1.0, seed=7)
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert len(a.choices) == 6 and [c.index for c in a.choices] == list(range(6))
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # same seed, same completions


def test_stop_sequence_is_cut_from_the_text_but_kept_in_token_ids(server, client):
    tok = server[0].state.server.tokenizer
    r = client.completions.create(model=MODEL, prompt=_prompt(tok, 55, 44), max_tokens=8, temperature=0,
                                  stop=["9"], extra_body={"return_token_ids": True})
    choice = r.choices[0]
    full = tok.decode(choice.model_extra["token_ids"], skip_special_tokens=True)
    assert "9" in full, full  # greedy 55+44 starts with a 9 (the test needs a stop that fires)
    assert choice.finish_reason == "stop" and choice.text == full[: full.index("9")]


def test_top_logprobs_are_a_distribution_prefix(client, server):
    tok = server[0].state.server.tokenizer
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "7+8="}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert content and len(content[0].top_logprobs) == 3
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert tops == sorted(tops, reverse=True) and sum(torch.tensor(tops).exp()) <= 1 + 1e-5
        assert item.logprob == pytest.approx(tops[0], abs=1e-6)  # greedy: the sampled token is the top one
    assert r.choices[0].message.content == "".join(c.token for c in content if c.token not in tok.all_special_tokens)


def test_chat_with_prompt_token_ids_equals_messages(client, server):
    tok = server[0].state.server.tokenizer
    by_messages = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "21+21="}],
                                                 max_tokens=6, temperature=0, extra_body={"return_token_ids": True})
    ids = by_messages.choices[0].model_extra["prompt_token_ids"]
    assert ids == _prompt(tok, 21, 21)
    by_ids = client.chat.completions.create(model=MODEL, messages=[], max_tokens=6, temperature=0,
                                            extra_body={"prompt_token_ids": ids, "messages": None})
    assert by_ids.choices[0].message.content == by_messages.choices[0].message.content


def test_streaming_chunks_concatenate_to_the_completion(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "33+44="}], max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    plain = list(client.completions.create(model=MODEL, prompt="5+5=", max_tokens=5, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in plain) == client.completions.create(
        model=MODEL, prompt="5+5=", max_tokens=5, temperature=0).choices[0].text


def test_concurrent_requests_are_batched_and_equal_sequential(server, client):
    app, _ = server
    prompts = [f"{a}+{a}=" for a in range(10, 22)]

    def one(p):
        return client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0).choices[0].text

    sequential = [one(p) for p in prompts]
    before = app.state.server.worker.batches_run
    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(one, prompts))
    assert concurrent == sequential
    assert app.state.server.worker.batches_run - before < len(prompts)  # some requests shared a batch


@pytest.mark.parametrize(("kwargs", "status", "param"), [
    ({"temperature": 3.0}, 400, "temperature"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"max_tokens": 10_000}, 400, "max_tokens"),
    ({"model": "gpt-9"}, 404, "model"),
    ({"prompt": [[]]}, 400, "prompt"),
    ({"prompt": [99999]}, 400, "prompt"),
    ({"echo": True}, 400, "echo"),
])
def test_bad_requests_get_openai_errors_and_the_server_stays_up(client, kwargs, status, param):
    args = {"model": MODEL, "prompt": "1+1=", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(**args)
    assert e.value.status_code == status
    body = e.value.body
    assert param in body["message"] and body["type"] in ("invalid_request_error",)
    assert client.completions.create(model=MODEL, prompt="1+1=", max_tokens=2).choices  # still serving


def test_malformed_json_is_a_400(server):
    r = httpx.post(f"{server[1]}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_openai_rollout_engine_round_trip_and_weight_sync(server):
    app, url = server
    srv_engine = app.state.server.engine
    tok = srv_engine.tokenizer
    engine = OpenAIRolloutEngine(f"{url}/v1", MODEL, tok, seed=3, prompts_per_request=2)
    requests = [GenerationRequest(_prompt(tok, a, a + 1), f"r{a}") for a in (10, 20, 30)]
    gens = engine.generate(requests, SamplingParams(max_new_tokens=6, n=2, temperature=1.0))
    assert [(g.request_id, g.sample_index) for g in gens] == [(f"r{a}", i) for a in (10, 20, 30) for i in (0, 1)]
    for g in gens:  # token-exact: the server's log-probs are the engine's own for these tokens
        assert len(g.token_ids) == len(g.logprobs) > 0
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
    # weights: perturb a copy, push it, and the server's engine holds exactly those weights
    model = srv_engine.model
    state = {k: v.clone() + (0.01 if k.endswith("norm.weight") else 0.0) for k, v in model.state_dict().items()}
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        engine.update_weights(state, version=5)
        assert httpx.get(f"{url}/reinforge/info").json()["policy_version"] == 5
        for k, v in model.state_dict().items():
            assert torch.equal(v, state[k]), k
    finally:
        engine.update_weights(original, version=0)


def test_serve_cli_help_is_fast():
    from typer.testing import CliRunner

    from reinforge.cli import app

    result = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0 and "OpenAI-compatible" in result.output


def test_sse_format(server):
    with httpx.stream("POST", f"{server[1]}/v1/completions", json={"model": MODEL, "prompt": "2+2=", "max_tokens": 3,
                                                                  "stream": True, "temperature": 0}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    assert json.loads(lines[0][6:])["object"] == "text_completion"


@pytest.mark.slow
def test_training_through_the_server_is_on_policy(server, tmp_path):
    """A tiny GRPO run whose rollouts come from `reinforge serve` via the openai engine: weights are
    pushed after every update, so the learner and the server agree on every sampled token."""
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    app, url = server
    original = {k: v.clone() for k, v in app.state.server.engine.model.state_dict().items()}
    try:
        result = train(load_config(None, [
            f"output_dir={tmp_path}", "name=served", "train.steps=4", "eval.every=0", "checkpoint.every=0",
            "task.heldout_size=20", "rollout.prompts_per_step=8", "rollout.group_size=4", "train.time_limit_s=0",
            "rollout.engine=openai", f"rollout.server_url={url}/v1", "rollout.server_model=tiny-base",
            "train.lr=3e-4",
        ]))
        rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
        assert len(rows) == 4
        updates = sum(1 for m in rows if "train/loss" in m)
        assert updates > 0
        # versions count steps (a step without rows publishes its unchanged weights too)
        assert httpx.get(f"{url}/reinforge/info").json()["policy_version"] == rows[-1]["policy_version"] == len(rows)
        assert max(m["train/logprob_mismatch"] for m in rows if "train/loss" in m) < 1e-4
    finally:
        OpenAIRolloutEngine(f"{url}/v1", MODEL, app.state.server.tokenizer).update_weights(original, 0)


class _NoStepsEngine:
    """A torch engine that declares, as the vLLM engine does, that it reports no single decode steps."""

    reports_steps = False

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, requests, params, generator=None, on_step=None):
        assert on_step is None, "the server asked a step-less engine for decode steps"
        return self._engine.generate(requests, params, generator)


def test_an_engine_without_decode_steps_serves_plain_requests_and_refuses_streams(server):
    """`reinforge serve --engine vllm`: any registered engine serves; what needs single decode steps
    (streaming, top log-probs) is a 400 naming the engine to use, not a failed batch."""
    from reinforge.serve.app import create_app

    torch_engine = server[0].state.server.engine
    names = [n for n, _ in torch_engine.model.named_parameters()]
    app = create_app(_NoStepsEngine(torch_engine), MODEL, parameter_names=names)
    with BackgroundServer(app, log_level="error") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        r = client.completions.create(model=MODEL, prompt="12+3=", max_tokens=4, temperature=0, logprobs=0)
        assert r.choices[0].logprobs.token_logprobs and r.choices[0].finish_reason in ("stop", "length")
        for kwargs in ({"stream": True}, {"logprobs": 2}):
            with pytest.raises(openai.BadRequestError, match="--engine torch"):
                client.completions.create(model=MODEL, prompt="12+3=", max_tokens=4, **kwargs)
        info = httpx.get(f"{url}/reinforge/info").json()
        assert info["max_position_embeddings"] == torch_engine.model.config.max_position_embeddings


def test_serve_builds_any_registered_engine_and_names_an_unknown_one():
    from reinforge.errors import ConfigError

    app = build_server_app(MODEL, engine="torch")
    assert type(app.state.server.engine).__name__ == "TorchRolloutEngine"
    with pytest.raises(ConfigError, match="rollout.engine"):
        build_server_app(MODEL, engine="no-such-engine")
