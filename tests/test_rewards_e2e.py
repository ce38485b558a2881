"""Tiny end-to-end runs with the real reward sources: a JSONL math dataset scored by math-verify, a
reasoning-gym task, unit tests run in the sandbox, and a reward model composed with a verifier."""

import json

import pytest
from model_fixtures import long_context_model, tiny_reward_model

from reinforge.config import load_config
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl

COMMON = ["train.steps=2", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "rollout.prompts_per_step=4",
          "rollout.group_size=4", "train.time_limit_s=0", "log.samples_per_step=2", "log.report=false"]


def _run(tmp_path, name, *overrides):
    result = train(load_config(None, [f"output_dir={tmp_path}", f"name={name}", *COMMON, *overrides]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2
    return result, rows


def _chat(q):
    return [{"role": "user", "content": q}]


@pytest.mark.slow
def test_jsonl_math_dataset_with_math_verify(tmp_path):
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'reinforge[math]')")
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps({"prompt": _chat(f"{a}+{b}="), "answer": str(a + b)}) + "\n"
                            for a in range(10, 40) for b in (11, 23)))
    result, rows = _run(tmp_path, "math", "task.kind=table", f"task.path={data}", "task.verifier=math_verify",
                        "task.heldout_size=10")
    assert max(m["reward/accuracy"] for m in rows) > 0  # the base model gets some sums right: scored, not zeros
    assert 0 <= result.heldout_after <= 1


@pytest.mark.slow
def test_reasoning_gym_task(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'reinforge[reasoning-gym]')")
    with pytest.raises(Exception, match="exceeds the model's context of 64"):
        _run(tmp_path, "rg64", "task.kind=reasoning_gym", "task.rg_tasks=leg_counting", "task.verifier=reasoning_gym",
             "task.rg_size=40", "task.heldout_size=8")
    model = long_context_model(tmp_path)
    result, rows = _run(tmp_path, "rg", "task.kind=reasoning_gym", "task.rg_tasks=leg_counting",
                        "task.verifier=reasoning_gym", "task.rg_size=40", "task.heldout_size=8",
                        "rollout.max_new_tokens=6", f"model.path={model}")
    samples = read_jsonl(result.run_dir / "samples.jsonl")
    assert samples and all(s["task_id"].startswith("leg_counting") for s in samples)
    assert all(0 <= m["reward/mean"] <= 1 for m in rows)


@pytest.mark.slow
def test_code_tests_in_the_sandbox(tmp_path):
    """Any completion that is valid Python passes `assert True`; one that is not (e.g. '4=') fails,
    so rewards differ within groups and the policy is trained on sandbox results."""
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps({"prompt": _chat(f"{a}+{a}="), "answer": "", "tests": "assert True"}) + "\n"
                            for a in range(10, 60)))
    result, rows = _run(tmp_path, "code", "task.kind=table", f"task.path={data}", "task.verifier=code_tests",
                        "task.columns.tests=tests", "task.columns.answer=null", "task.heldout_size=5")
    assert any(0 < m["reward/mean"] for m in rows)
    samples = read_jsonl(result.run_dir / "samples.jsonl")
    assert {s["reward"] for s in samples} <= {0.0, 1.0}


@pytest.mark.slow
def test_reward_model_composed_with_a_verifier(tmp_path):
    rm_dir = tiny_reward_model(tmp_path)
    terms = ("reward.terms=[{name: correct, verifier: exact_match, weight: 1.0}, "
             f"{{name: rm, weight: 0.5, reward_model: {{path: {rm_dir}, batch_size: 8}}}}]")
    result, rows = _run(tmp_path, "rm", terms, "task.heldout_size=10")
    for m in rows:
        assert {"reward/term/correct", "reward/term/rm"} <= m.keys()
        assert m["reward/mean"] == pytest.approx(m["reward/term/correct"] + 0.5 * m["reward/term/rm"], abs=1e-5)
    assert len({m["reward/term/rm"] for m in rows}) > 1 or rows[0]["reward/term/rm"] != 0
