"""examples/cookbook_rl.py: the Tinker cookbook's own RL loop (``tinker_cookbook.rl.train``) against the
service, its base URL the only change (docs/service.md). Skipped unless ``tinker_cookbook`` is importable:
it is not a dependency of reinforge (its ``tml-renderers`` pin has no release in the package index), so
install it with ``pip install --no-deps`` as docs/service.md says."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tinker", reason="the service extra (tinker) is not installed")
pytest.importorskip("tinker_cookbook", reason="tinker-cookbook is not installed (docs/service.md: "
                    "pip install --no-deps tinker-cookbook==0.6.1 chz blobfile pyrage termcolor pycryptodomex lxml)")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
pytest.importorskip("peft", reason="the lora extra (peft) is not installed")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("cookbook_rl", ROOT / "examples/cookbook_rl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cookbook_rl"] = module  # chz looks its classes up by module
    spec.loader.exec_module(module)
    module.register_tiny_base()
    return module


def test_the_renderer_is_the_models_chat_template(example):
    from tinker_cookbook import renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    tok = get_tokenizer("tiny-base")
    renderer = renderers.get_renderer("tiny-base", tokenizer=tok)
    convo = [{"role": "user", "content": "4+5="}, {"role": "assistant", "content": "9"},
             {"role": "user", "content": "12+7="}]
    want = tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    assert renderer.build_generation_prompt(convo).to_ints() == tok.encode(want, add_special_tokens=False)
    assert renderer.get_stop_sequences() == [tok.eos_token_id]
    message, termination = renderer.parse_response(tok.encode("19", add_special_tokens=False) + [tok.eos_token_id])
    assert message["content"] == "19" and termination.is_stop_sequence
    assert not renderer.parse_response(tok.encode("1999", add_special_tokens=False))[1].is_clean  # cut by max_tokens


async def _step(env, text: str, eos: bool):
    await env.initial_observation()
    ids = env.renderer.tokenizer.encode(text, add_special_tokens=False)
    return await env.step(ids + [env.renderer.tokenizer.eos_token_id] * eos)


def test_the_environment_rewards_the_exact_sum_and_the_stop_token(example):
    import asyncio

    from tinker_cookbook import renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer("tiny-base", tokenizer=get_tokenizer("tiny-base"))
    env = example.AdditionEnv(12, 7, renderer)
    assert env.get_question() == "12+7="
    # the cookbook's ProblemEnv: reward = format_coef * (format - 1) + correct, format_coef 0.1
    assert asyncio.run(_step(env, "19", eos=True)).reward == pytest.approx(1.0)
    assert asyncio.run(_step(env, "19", eos=False)).reward == pytest.approx(0.9)
    assert asyncio.run(_step(env, "191", eos=True)).reward == pytest.approx(0.0)
    from reinforge.data.arithmetic import arithmetic_problem

    assert example._operands(arithmetic_problem(12 * 100 + 7, digits=2, ops="+")) == (12, 7)


@pytest.mark.learning
def test_the_cookbooks_rl_loop_through_the_service_raises_heldout_accuracy(tmp_path):
    """40 steps (docs/service.md: 0.395 -> 0.450 with seed 0, 0.455 with seed 1; rollouts unseeded)."""
    out = subprocess.run([sys.executable, str(ROOT / "examples/cookbook_rl.py"), "--steps", "40",
                          "--log-path", str(tmp_path / "log")], cwd=ROOT, capture_output=True, text=True,
                         timeout=1800, check=True).stdout
    before, after = map(float, re.search(r"accuracy: ([\d.]+) -> ([\d.]+)", out).groups())
    assert after >= before + 0.04, out[-2000:]
