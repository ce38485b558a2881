"""The framework example agents (examples/agents: OpenAI Agents SDK, LangChain) play the calculator
task through the real agent proxy with the shipped tiny-agent: their function-calling episodes are
token-exact single segments, and training runs on them."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from reinforge.config import load_config  # noqa: E402
from reinforge.data.agent_tasks import calculator_task  # noqa: E402
from reinforge.eval.cli_eval import resolve_eval_model  # noqa: E402
from reinforge.models.loading import load_model, load_tokenizer  # noqa: E402
from reinforge.orchestrate.agent_episodes import BackgroundServer, run_agent_episodes  # noqa: E402
from reinforge.orchestrate.run import train  # noqa: E402
from reinforge.rollout.torch_engine import TorchRolloutEngine  # noqa: E402
from reinforge.serve.proxy import AgentProxy  # noqa: E402
from reinforge.track.jsonl import read_jsonl  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "agents"
FRAMEWORKS = {"openai_agents_calculator": "agents", "langchain_calculator": "langchain_openai"}
FRAMEWORK_PARAMS = [pytest.param(module, id=module.split("_calculator")[0]) for module in FRAMEWORKS]


def _agent_module(module: str, monkeypatch):
    pytest.importorskip(FRAMEWORKS[module], reason=f"{FRAMEWORKS[module]} is not installed (dev extra)")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module(module)


@pytest.fixture(scope="module")
def proxy_url():
    path = resolve_eval_model("tiny-agent")
    tok = load_tokenizer(path)
    proxy = AgentProxy(TorchRolloutEngine(load_model(path, "float32", "cpu"), tok, "cpu", seed=0), max_tokens=64,
                       temperature=1.0, fixed_sampling=True)
    with BackgroundServer(proxy.app) as url:
        yield proxy, url
    proxy.close()


@pytest.mark.parametrize("module", FRAMEWORK_PARAMS)
def test_framework_agent_episodes_are_token_exact(module, proxy_url, monkeypatch):
    agent = _agent_module(module, monkeypatch).agent
    proxy, url = proxy_url
    tasks = [calculator_task(i * 997, (3, 2), "*") for i in range(4)]
    trajs = run_agent_episodes(tasks, agent, proxy, url, group_size=4, max_workers=8)
    assert len(trajs) == 16, "every episode is one segment: each echoed turn was the reply returned"
    tokenizer = proxy.tokenizer
    called = [t for t in trajs if t.metadata["turns"] >= 2]  # a call, its result, then the answer
    assert len(called) >= 8  # tiny-agent calls calc in most episodes
    for t in trajs:
        assert t.metadata["echo_mismatches"] == 0 and t.metadata["segments"] == 1
        assert t.metadata["turns"] == t.metadata["calls"] == len(t.turn_spans)
        masked = [i for i, m in enumerate(t.loss_mask) if m]
        assert masked == [i for s, e in t.turn_spans for i in range(s, e)]  # the completions, nothing else
        assert t.metadata["correct"] == (t.reward == 1.0)
    for t in called:  # the call's tokens are the model's; the tool result is an observation (mask 0)
        s, e = t.turn_spans[0]
        assert tokenizer.decode(t.token_ids[s:e]).startswith("<tool_call>{")
        # a call that ended sampled its EOS (the span's last token); one cut at max_tokens did not, and the
        # chat template closes its turn with one: either way the observation follows an EOS
        closed = e - 1 if t.token_ids[e - 1] == tokenizer.eos_token_id else e
        assert closed == e - 1 or t.metadata["finish_reasons"][0] == "length"
        between = tokenizer.decode(t.token_ids[closed:t.turn_spans[1][0]])
        assert between.startswith("<eos><|tool|>") and between.endswith("<|assistant|>")


@pytest.mark.slow
@pytest.mark.parametrize("module", FRAMEWORK_PARAMS)
def test_framework_agent_trains_through_the_proxy(module, tmp_path, monkeypatch):
    _agent_module(module, monkeypatch)
    result = train(load_config("agent_calculator", [
        f"output_dir={tmp_path}", "env.name=agent", f"env.agent={module}:agent", "env.agent_workers=8",
        "train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "algo.skip_equal_reward_groups=false",
        "task.heldout_size=4", "eval.every=0",
        "eval.final_samples=0", "checkpoint.every=0", "train.time_limit_s=0", "log.report=false"]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [m["policy_version"] for m in rows] == [1, 2] and all(m["batch/sequences"] > 0 for m in rows)
    assert all(m["reward/accuracy"] == m["reward/mean"] for m in rows)  # 'correct' came from the agent's info
    assert all(m["response/length_mean"] > 0 for m in rows)
    assert result.heldout_before is not None and result.heldout_after is not None
