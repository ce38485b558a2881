"""The shipped tiny-agent model (scripts/build_tiny_agent.py, docs/agent_model.md): its tokenizer and chat
template fit the multi-turn machinery, and short RL runs of the agent recipes raise held-out success."""

from __future__ import annotations

import json

import pytest

from reinforge.assets import ASSETS_DIR
from reinforge.config import load_config
from reinforge.envs.calculator import calculator_toolbox
from reinforge.envs.tools import ToolCall, parse_tool_calls
from reinforge.rollout.chat_splice import ChatSplicer

TINY_AGENT = ASSETS_DIR / "tiny-agent"
CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "482*37"}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    from reinforge.models.loading import load_tokenizer

    return load_tokenizer(str(TINY_AGENT))


def test_a_tool_call_round_trips_through_the_tokenizer(tok):
    ids = tok(CALL, add_special_tokens=False)["input_ids"]
    open_id, close_id = tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    assert ids[0] == open_id and ids[-1] == close_id  # one token each ...
    assert len(ids) == len(CALL) - len("<tool_call></tool_call>") + 2  # ... and one per character in between
    assert open_id not in tok.all_special_ids and close_id not in tok.all_special_ids
    text = tok.decode([*ids, tok.eos_token_id], skip_special_tokens=True)  # how the rollout engine decodes
    assert text == CALL
    assert parse_tool_calls(text) == [ToolCall("calc", {"expr": "482*37"})]
    assert tok.decode(tok("a+b = {\"x\": [1, -2]}\n~", add_special_tokens=False)["input_ids"]) == 'a+b = {"x": [1, -2]}\n~'


def test_the_chat_template_splices_turn_by_turn(tok):
    splicer = ChatSplicer(tok, calculator_toolbox().schemas)  # raises if the template is not append-only
    eos = tok.eos_token_id
    assert splicer.turn_suffix_ids == [eos]
    first = [{"role": "user", "content": "482*37="}]
    assert tok.decode(splicer.prompt_ids(first)) == "<bos><|system|>tools: calc<|user|>482*37=<|assistant|>"
    call = tok(CALL, add_special_tokens=False)["input_ids"] + [eos]
    answer = tok("17834", add_special_tokens=False)["input_ids"] + [eos]
    tool = [{"role": "tool", "content": "17834", "name": "calc"}]
    spliced = (splicer.prompt_ids(first) + call + splicer.close_turn_ids(call) + splicer.observation_ids(tool)
               + answer + splicer.close_turn_ids(answer))
    full = tok.apply_chat_template([*first, {"role": "assistant", "content": CALL}, *tool,
                                    {"role": "assistant", "content": "17834"}],
                                   tools=calculator_toolbox().schemas, tokenize=False)
    assert spliced == tok(full, add_special_tokens=False)["input_ids"]
    assert len(spliced) < 100  # a whole calculator episode fits the 256-position context easily
    plain = ChatSplicer(tok)  # no tools: no system block
    assert tok.decode(plain.prompt_ids([{"role": "user", "content": "guess 1-32"}])) == (
        "<bos><|user|>guess 1-32<|assistant|>")
    assert tok.decode(plain.observation_ids([{"role": "user", "content": "higher"}])) == "<|user|>higher<|assistant|>"


def test_the_build_is_recorded():
    stats = json.loads((TINY_AGENT / "build_stats.json").read_text())
    assert stats["command"].startswith("python scripts/build_tiny_agent.py")
    for env, success in stats["heldout_greedy_success"].items():
        assert 0.1 <= success <= 0.7, (env, success)  # non-trivial but imperfect: RL has room
    from reinforge.models.loading import load_model

    assert load_model(str(TINY_AGENT)).config.max_position_embeddings == 256


@pytest.mark.parametrize("name", ["agent_calculator", "agent_guessing", "agent_retry"])
def test_the_recipes_load(name):
    cfg = load_config(name)
    assert cfg.env.name == name.removeprefix("agent_") and cfg.model.path.endswith("tiny-agent")


def test_tiny_agent_tools_is_a_shipped_alias_with_its_build_recorded():
    from reinforge.assets import SHIPPED_MODELS, resolve_model_path
    from reinforge.errors import ConfigError
    from reinforge.models.loading import load_model

    tools = resolve_model_path("tiny-agent-tools")
    assert tools == ASSETS_DIR / "tiny-agent-tools" and set(SHIPPED_MODELS) == {
        "tiny-base", "tiny-agent", "tiny-agent-tools", "tiny-agent-search", "tiny-rm", "tiny-vlm"}
    stats = json.loads((tools / "build_stats.json").read_text())
    assert stats["command"].startswith("python scripts/build_tiny_agent.py") and stats["search_names"] == "ids"
    assert stats["code_kinds"] == "prod" and stats["heldout_greedy_success"]["code_interpreter"] >= 0.2
    assert load_model("tiny-agent-tools").config.vocab_size == load_model(str(TINY_AGENT)).config.vocab_size
    with pytest.raises(ConfigError, match="shipped alias: tiny-base, tiny-agent, tiny-agent-tools, tiny-agent-search, tiny-rm, tiny-vlm"):
        load_model("no-such-model")
    assert load_config("agent_code").model.path == "tiny-agent-tools"


def test_tiny_agent_search_is_built_on_the_corpus_of_the_agent_search_recipe():
    from reinforge.assets import resolve_model_path
    from reinforge.models.loading import load_model

    search = load_config("agent_search")
    assert search.model.path == "tiny-agent-search"
    stats = json.loads((resolve_model_path("tiny-agent-search") / "build_stats.json").read_text())
    assert stats["command"].startswith("python scripts/build_tiny_agent.py")
    assert (stats["search_names"], stats["search_layout"]) == (search.task.params["names"], search.task.params["layout"])
    sampled = next(v for k, v in stats.items() if k.startswith("heldout_sampled"))["search"]
    assert 0.05 <= sampled["mean@4"] <= 0.5  # room for RL either way
    assert load_model("tiny-agent-search").config.vocab_size == load_model(str(TINY_AGENT)).config.vocab_size
