"""Pictures as OpenAI ``image_url`` content parts (docs/vision.md): in a table's prompt column, in chat requests to
``reinforge serve`` over tiny-vlm, from the ``openai`` rollout engine; every bad picture an error naming the row,
column and message part (library) or a 400 naming the field (server), which keeps answering."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest

from reinforge.config import ColumnsConfig
from reinforge.data.columns import rows_to_tasks
from reinforge.data.shapes import shapes_splits
from reinforge.errors import ConfigError, DataError
from reinforge.models.loading import load_processor
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.rollout.vision import image_data_url, vision_request, with_image_urls

PIL = pytest.importorskip("PIL.Image")
MODEL = "tiny-vlm"


def _png(colour=(255, 0, 0), size=(32, 32)) -> bytes:
    buf = io.BytesIO()
    PIL.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def _url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def _messages(*urls: str, text: str = "colour?") -> list[dict]:
    return [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls),
                                         {"type": "text", "text": text}]}]


# (what, the image part's URL (a function of the data directory), the message the error must carry)
BAD_URLS = [
    ("unreadable bytes", lambda d: _url(b"not a png at all"), "unreadable image"),
    ("a missing file", lambda d: "pics/none.png", "does not exist"),
    ("an http URL", lambda d: "http://example.com/red.png", "remote URL"),
    ("a non-image mime type", lambda d: _url(b"hello", "text/plain"), "'text/plain' is no picture"),
    ("base64 that does not decode", lambda d: "data:image/png;base64,@@@", "base64 does not decode"),
]


# ---------------------------------------------------------------- tables and jsonl files
def test_table_prompt_column_reads_image_url_parts(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "blue.png").write_bytes(_png((0, 0, 255)))
    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": _messages(_url(_png())), "answer": "red"},
            {"prompt": _messages("pics/blue.png", "file://pics/blue.png"), "answer": "blue"},
            {"prompt": [{"role": "user", "content": [{"type": "text", "text": "1+"}, {"type": "text", "text": "1="}]}],
             "answer": "2"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = rows_to_tasks([(f"rows.jsonl:{i + 1}", str(i), r) for i, r in enumerate(rows)], None, "rows",
                          base_dir=tmp_path)
    assert [len(t.images) for t in tasks] == [1, 2, 0]
    assert tasks[0].images[0].getpixel((3, 3)) == (255, 0, 0) and tasks[1].images[1].getpixel((0, 0)) == (0, 0, 255)
    assert tasks[0].prompt == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    assert tasks[2].prompt == [{"role": "user", "content": "1+1="}]  # text parts only: a text prompt, as before
    processor = load_processor(MODEL)
    request = vision_request(processor, tasks[0].prompt, tasks[0].images, "t0")
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert request.prompt_ids.count(image_token) == 16 and request.model_inputs["pixel_values"].shape == (1, 3, 32, 32)
    with pytest.raises(ConfigError, match="one picture per prompt"):  # LLaVA's row holds one picture (docs/vision.md)
        vision_request(processor, tasks[1].prompt, tasks[1].images, "t1")


@pytest.mark.parametrize(("what", "url", "message"), BAD_URLS, ids=[b[0] for b in BAD_URLS])
def test_a_bad_image_part_in_a_table_names_the_row_column_and_part(tmp_path, what, url, message):
    row = {"prompt": [{"role": "system", "content": "look"}, *_messages(url(tmp_path))], "answer": "red"}
    with pytest.raises(DataError, match=r"^rows.jsonl:4: column 'prompt', messages\[1\]\.content\[0\]\.image_url\.url: "
                                        f".*{message}"):
        rows_to_tasks([("rows.jsonl:4", "3", row)], None, "rows", base_dir=tmp_path)


def test_too_many_pictures_and_pictures_in_two_places_are_refused(tmp_path):
    nine = _messages(*[_url(_png())] * 9)
    with pytest.raises(DataError, match=r"rows:0: column 'prompt', messages\[0\]\.content\[8\].* more than 8 pictures"):
        rows_to_tasks([("rows:0", "0", {"prompt": nine, "answer": "a"})], None, "rows")
    row = {"prompt": _messages(_url(_png())), "answer": "a", "image": _png()}
    with pytest.raises(DataError, match="both in the prompt's image_url parts and in column 'image'"):
        rows_to_tasks([("rows:0", "0", row)], ColumnsConfig(images="image"), "rows")


def test_image_data_urls_round_trip_and_shrink():
    image = PIL.new("RGB", (64, 32), (10, 200, 30))
    url = image_data_url(image)
    assert url.startswith("data:image/png;base64,")
    back = PIL.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert back.size == (64, 32) and back.getpixel((5, 5)) == (10, 200, 30)
    small = PIL.open(io.BytesIO(base64.b64decode(image_data_url(image, max_side=16).split(",", 1)[1])))
    assert small.size == (16, 8)
    placed = with_image_urls([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}], (image,))
    assert placed[0]["content"][0] == {"type": "image_url", "image_url": {"url": url}}


# ---------------------------------------------------------------- reinforge serve
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    from reinforge.orchestrate.agent_episodes import BackgroundServer
    from reinforge.serve.launch import build_server_app
    from reinforge.serve.schema import ServeLimits

    root = tmp_path_factory.mktemp("images")
    (root / "pics").mkdir()
    (root / "pics" / "red.png").write_bytes(_png())
    app = build_server_app(MODEL, seed=0, limits=ServeLimits(max_images=2), image_root=str(root))
    with BackgroundServer(app, log_level="error") as url:
        yield app, url, root


def _chat(url: str, messages: list[dict], **extra):
    import httpx

    body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, "return_token_ids": True, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def test_a_chat_request_with_a_picture_runs_the_vlm_on_it(served):
    app, url, root = served
    engine = app.state.server.engine
    task = shapes_splits().heldout[0]
    expected = vision_request(engine.processor, task.prompt, task.images, "x")
    greedy = engine.generate([expected], SamplingParams(max_new_tokens=6, greedy=True))[0]
    messages = with_image_urls(expected.messages, expected.images)
    reply = _chat(url, messages, logprobs=True).json()["choices"][0]
    assert reply["prompt_token_ids"] == expected.prompt_ids  # the processor's prompt, 16 image tokens
    assert reply["token_ids"] == greedy.token_ids
    served_lps = [c["logprob"] for c in reply["logprobs"]["content"]]
    assert served_lps == pytest.approx(greedy.logprobs, abs=1e-5)  # the same pixels went into the prefill
    grey = PIL.new("RGB", (32, 32), (128, 128, 128))
    blank = vision_request(engine.processor, task.prompt, (grey,), "grey")
    local = engine.generate([blank], SamplingParams(max_new_tokens=6, greedy=True))[0]
    other = _chat(url, with_image_urls(blank.messages, blank.images), logprobs=True).json()["choices"][0]
    other_lps = [c["logprob"] for c in other["logprobs"]["content"]]
    assert other_lps == pytest.approx(local.logprobs, abs=1e-5)
    assert other_lps[0] != pytest.approx(served_lps[0], abs=1e-4)  # another picture, another distribution
    import httpx

    body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:  # streamed: the same reply
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == reply["message"]["content"]
    by_path = _chat(url, _messages("pics/red.png")).json()["choices"][0]  # a file under the server's image root
    by_data = _chat(url, _messages(_url(_png()))).json()["choices"][0]
    assert by_path["token_ids"] == by_data["token_ids"] and by_path["prompt_token_ids"] == by_data["prompt_token_ids"]
    text = _chat(url, [{"role": "user", "content": "colour?"}]).json()["choices"][0]  # text: the tokenizer's prompt
    tokenizer = engine.tokenizer
    assert text["prompt_token_ids"] == tokenizer(tokenizer.apply_chat_template(
        [{"role": "user", "content": "colour?"}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False)["input_ids"]


SERVER_BAD = [*BAD_URLS,
              ("too many pictures", lambda d: None, "more than 2 pictures"),
              ("a path out of the image root", lambda d: "../../etc/passwd", "inside the server's image root")]


@pytest.mark.parametrize(("what", "url", "message"), SERVER_BAD, ids=[b[0] for b in SERVER_BAD])
def test_a_bad_picture_gets_a_400_naming_the_part_and_the_server_keeps_answering(served, what, url, message):
    _, base, root = served
    part = url(root)
    messages = _messages(*[_url(_png())] * 3) if part is None else _messages(_url(_png()), part)
    field = "messages[0].content[2].image_url.url" if part is None else "messages[0].content[1].image_url.url"
    r = _chat(base, messages)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["message"].startswith(field) and message in error["message"]
    assert _chat(base, _messages(_url(_png()))).status_code == 200


def test_file_paths_need_an_image_root_and_a_text_model_refuses_pictures():
    from reinforge.serve.schema import APIError
    from reinforge.serve.vision_chat import vision_chat_prompt

    processor = load_processor(MODEL)
    with pytest.raises(APIError, match=r"messages\[0\]\.content\[0\]\.image_url\.url: file paths are not read here"):
        vision_chat_prompt(processor, _messages("red.png"), None, {}, "", 8, image_root=None)
    with pytest.raises(APIError, match=r"messages\[0\]\.content\[0\]: this model takes no pictures") as e:
        vision_chat_prompt(None, _messages(_url(_png())), None, {}, "", 8)
    assert e.value.param == "messages[0].content[0]"


# ---------------------------------------------------------------- the openai rollout engine
def test_openai_engine_sends_pictures_as_image_url_parts(served):
    pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
    from reinforge.rollout.openai_engine import OpenAIRolloutEngine

    app, url, _ = served
    local = app.state.server.engine
    engine = OpenAIRolloutEngine(f"{url}/v1", MODEL, local.tokenizer, seed=1, prompts_per_request=2)
    tasks = shapes_splits().heldout[:2]
    text = GenerationRequest(local.tokenizer("colour?")["input_ids"], "text")
    requests = [text, *(vision_request(local.processor, t.prompt, t.images, t.id) for t in tasks), text]
    params = SamplingParams(max_new_tokens=5, greedy=True, n=2)
    gens = engine.generate(requests, params)
    assert [g.request_id for g in gens] == [r.request_id for r in requests for _ in range(2)]
    direct = local.generate(requests[1:3], params)  # greedy through the server = greedy here, token for token
    assert [g.token_ids for g in gens[2:6]] == [g.token_ids for g in direct]
    assert all(len(g.logprobs) == len(g.token_ids) for g in gens)
    wrong = GenerationRequest([1, 2, 3], "w", requests[1].model_inputs, messages=requests[1].messages,
                              images=requests[1].images)
    from reinforge.errors import ReinforgeError

    with pytest.raises(ReinforgeError, match="rendered request 'w'.*not the 3 the model's processor gives here"):
        engine.generate([wrong], params)


# ---------------------------------------------------------------- reinforge eval and its page
def test_reinforge_eval_on_shapes_writes_a_page_with_the_pictures(tmp_path):
    from headless_browser import dump_dom, find_browser

    from reinforge.eval.cli_eval import run_eval

    page = tmp_path / "eval.html"
    result = run_eval(["tiny-vlm"], "shapes", None, 0, 1.0, 8, 6, 0, page=page)
    model = result["models"]["tiny-vlm"]
    heldout = shapes_splits(heldout_size=6).heldout
    assert [e["task_id"] for e in model["examples"]] == [t.id for t in heldout]
    assert sum(e["correct"] for e in model["examples"]) / 6 == pytest.approx(model["greedy_accuracy"])
    first = PIL.open(io.BytesIO(base64.b64decode(model["examples"][0]["images"][0].split(",", 1)[1])))
    assert first.tobytes() == heldout[0].images[0].convert("RGB").tobytes()  # 32 x 32: kept as it is
    html = page.read_text()
    assert html.count('<img class="sample"') == 6 and "T=1.0" in html
    body = dump_dom(find_browser("the page's pictures must decode"), page, tmp_path / "profile")
    assert 'data-images-ok="6"' in body and 'data-images-loaded="true"' in body


def test_the_page_shows_only_inline_image_data_urls():
    from reinforge.eval.eval_page import render_eval_page

    good = _url(_png())
    example = {"task_id": "t", "prompt": "p", "answer": "a", "completion": "c", "correct": True,
               "images": [good, "http://example.com/x.png", 'data:image/png;base64,AA" onerror="alert(1)']}
    html = render_eval_page({"task": "t", "models": {"m": {"greedy_accuracy": 1.0, "examples": [example]}}})
    assert html.count("<img class") == 1 and f'src="{good}"' in html
    assert re.findall(r'src="([^"]*)"', html) == [good] and 'onerror="' not in html and html.count("not shown") == 2


# ---------------------------------------------------------------- the agent proxy
def test_agent_episodes_with_pictures_are_token_exact_trajectories_with_their_pixels():
    """An agent shows the task's picture through the proxy, then asks again in text: one segment (the text call
    spliced on), whose trajectory carries the picture's pixel_values and whose sampled log-probs are a direct HF
    forward's over its tokens with those pixels (the image placeholder banned, as the engine samples); a call
    adding a second picture is a 400 for LLaVA (one picture a row), one with another picture a new segment."""
    openai = pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
    import torch

    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.orchestrate.agent_episodes import BackgroundServer, run_agent_episodes
    from reinforge.rollout.torch_engine import TorchRolloutEngine, image_token_id
    from reinforge.serve.proxy import AgentProxy

    model, processor = load_model(MODEL).eval(), load_processor(MODEL)
    engine = TorchRolloutEngine(model, load_tokenizer(MODEL), seed=0)
    engine.processor = processor
    proxy = AgentProxy(engine, max_tokens=4)

    def agent(base_url, task):
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        shown = with_image_urls([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}],
                                task.images)
        first = client.chat.completions.create(model="m", messages=shown).choices[0].message
        again = [*shown, {"role": "assistant", "content": first.content}, {"role": "user", "content": "sure?"}]
        second = client.chat.completions.create(model="m", messages=again).choices[0].message
        more = [*again, {"role": "assistant", "content": second.content},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _url(_png())}}]}]
        with pytest.raises(openai.BadRequestError, match="one picture per prompt"):  # LLaVA: one picture a row
            client.chat.completions.create(model="m", messages=more)
        other = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _url(_png())}},
                                              {"type": "text", "text": "colour?"}]}]
        client.chat.completions.create(model="m", messages=other)  # another picture: a new segment
        return 1.0

    tasks = shapes_splits().heldout[:1]
    try:
        with BackgroundServer(proxy.app) as url:
            trajs = run_agent_episodes(tasks, agent, proxy, url, group_size=1)
    finally:
        proxy.close()
    assert [t.metadata["segment"] for t in trajs] == [0, 1] and [len(t.turn_spans) for t in trajs] == [2, 1]
    expected = vision_request(processor, tasks[0].prompt, tasks[0].images, "x").model_inputs["pixel_values"]
    torch.testing.assert_close(trajs[0].model_inputs["pixel_values"], expected, rtol=0, atol=0)
    image = image_token_id(model)
    assert [t.token_ids.count(image) for t in trajs] == [16, 16]  # the second segment shows the other picture
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.token_ids])
            logits = model(input_ids=ids, pixel_values=t.model_inputs["pixel_values"]).logits[0, :-1]
            banned = logits.index_fill(-1, torch.tensor([image]), float("-inf"))
            direct = torch.log_softmax(banned.float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            sampled = [i for i, m in enumerate(t.loss_mask) if m]
            torch.testing.assert_close(torch.tensor([t.logprobs[i] for i in sampled]),
                                       direct[[i - 1 for i in sampled]], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_training_a_vlm_through_the_server(served, tmp_path):
    """GRPO on the shapes task with `rollout.engine: openai` over `reinforge serve --model tiny-vlm`: the pictures
    go to the server as image_url parts, the weights come back after every update, and the learner's log-probs of
    the served tokens (with the same pixels) stay the server's, but for the image placeholder the engine never
    samples (docs/vision.md: log(1 - p(placeholder)), small)."""
    import httpx
    import torch

    from reinforge.config import load_config
    from reinforge.orchestrate.run import train
    from reinforge.rollout.openai_engine import OpenAIRolloutEngine
    from reinforge.track.jsonl import read_jsonl

    app, url, _ = served
    original = {k: v.clone() for k, v in app.state.server.engine.model.state_dict().items()}
    try:
        result = train(load_config(None, [
            f"output_dir={tmp_path}", "name=served-vlm", "model.path=tiny-vlm", "task.kind=shapes", "train.steps=3",
            "eval.every=0", "checkpoint.every=0", "task.heldout_size=8", "rollout.prompts_per_step=4",
            "rollout.group_size=4", "rollout.max_new_tokens=6", "train.time_limit_s=0", "train.lr=5e-4",
            "rollout.engine=openai", f"rollout.server_url={url}/v1", f"rollout.server_model={MODEL}",
        ]))
        rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
        assert len(rows) == 3 and any("train/loss" in m for m in rows)
        assert httpx.get(f"{url}/reinforge/info").json()["policy_version"] == rows[-1]["policy_version"] == 3
        assert max(m["train/logprob_mismatch"] for m in rows if "train/loss" in m) < 1e-3  # measured 2.7e-4 to 3.0e-4
        served_now = app.state.server.engine.model.state_dict()
        assert any(not torch.equal(served_now[k], v) for k, v in original.items())  # the server took the updates
    finally:
        OpenAIRolloutEngine(f"{url}/v1", MODEL, app.state.server.tokenizer).update_weights(original, 0)


@pytest.mark.slow
def test_a_vlm_run_report_shows_the_evaluations_pictures(tmp_path):
    """A short GRPO run on shapes with a final evaluation: eval.json keeps the greedy completions of the first
    held-out prompts before and after training with their pictures, and report.html shows them (Chromium
    decodes every one)."""
    from headless_browser import dump_dom, find_browser

    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    result = train(load_config(None, [
        f"output_dir={tmp_path}", "model.path=tiny-vlm", "task.kind=shapes", "task.heldout_size=6", "train.steps=1",
        "eval.every=0", "eval.final_samples=2", "checkpoint.every=0", "rollout.prompts_per_step=4",
        "rollout.group_size=2", "rollout.max_new_tokens=6", "train.time_limit_s=0",
    ]))
    data = json.loads((result.run_dir / "eval.json").read_text())
    heldout = shapes_splits(heldout_size=6).heldout
    for when in ("before", "after"):
        examples = data[when]["examples"]
        assert [e["task_id"] for e in examples] == [t.id for t in heldout]
        assert sum(e["correct"] for e in examples) / 6 == pytest.approx(data[when]["greedy_accuracy"])
        assert all(len(e["images"]) == 1 and e["completion"] for e in examples)
    page = result.run_dir / "report.html"
    html = page.read_text()
    assert html.count('<img class="sample"') == 12 and "Greedy completions: after" in html
    body = dump_dom(find_browser("the report's pictures must decode"), page, tmp_path / "profile")
    n = html.count("<img ")
    assert f'data-images-ok="{n}"' in body and 'data-images-loaded="true"' in body
