"""The shipped example recipes (math_jsonl, reasoning_gym, code_sandbox, reward_model) run end to end
from their own files, tiny and for two steps; their data files are what make_data.py writes; relative
data paths in a recipe are found next to the recipe file."""

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest
from model_fixtures import long_context_model

from reinforge.config import RECIPES_DIR, FileTaskConfig, load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Task

DATA_DIR = RECIPES_DIR / "data"
EXAMPLES = ["math_jsonl", "reasoning_gym", "code_sandbox", "reward_model"]
TINY = ["train.steps=2", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.report=false",
        "train.time_limit_s=0", "rollout.prompts_per_step=4", "rollout.group_size=4", "log.samples_per_step=16"]


def _run(recipe, tmp_path, *overrides):
    """Two steps of ``recipe`` (a shipped name or a file); its metrics rows with rewards and all its samples."""
    cfg = load_config(recipe, [f"output_dir={tmp_path / 'runs'}", "name=run", *TINY, *overrides])
    result = train(cfg)
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2
    samples = read_jsonl(result.run_dir / "samples.jsonl")
    assert len(samples) == 2 * 4 * 4  # every sample of both steps
    return cfg, result, rows, samples


def _sum_in(prompt: str) -> int:
    a, b = re.fullmatch(r"\s*(\d+)\+(\d+)=\s*", prompt).groups()
    return int(a) + int(b)


def _make_data_module():
    spec = importlib.util.spec_from_file_location("make_data", DATA_DIR / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- every shipped recipe ------------------------------------------------------------------------------


def test_every_shipped_recipe_loads_documents_itself_and_finds_its_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # shipped data paths must not depend on the working directory
    names = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    assert set(EXAMPLES) <= set(names)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "recipes.md").read_text()
    for name in names:
        text = (RECIPES_DIR / f"{name}.yaml").read_text()
        assert text.startswith("# "), f"{name}: no leading comment saying what it demonstrates"
        assert f"`{name}`" in docs, f"docs/recipes.md does not list {name}"
        cfg = load_config(name)
        file_task = isinstance(cfg.task, FileTaskConfig)  # only file sources have paths
        for path in (cfg.task.path, cfg.task.heldout_path) if file_task else ():
            if path is not None:
                assert path.startswith(str(DATA_DIR)) and (DATA_DIR / path).is_file(), (name, path)


def test_the_data_files_are_what_make_data_writes(tmp_path, monkeypatch):
    make_data = _make_data_module()
    monkeypatch.setattr(make_data, "HERE", tmp_path)
    make_data.main()
    for name in ("math.jsonl", "code.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes(), f"{name}: rerun make_data.py"


def test_the_math_answers_are_the_sums_in_forms_math_verify_reads():
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'reinforge[math]')")
    from reinforge.rewards.verifiers import VERIFIERS

    math_verify, exact = VERIFIERS.get("math_verify"), VERIFIERS.get("exact_match")
    rows = read_jsonl(DATA_DIR / "math.jsonl")
    assert 100 <= len(rows) <= 300
    not_plain = 0
    for row in rows:
        total = _sum_in(row["prompt"][0]["content"])
        task = Task(id=row["id"], prompt=row["prompt"], answer=row["answer"])
        assert math_verify(task, str(total)).reward == 1.0, row
        assert math_verify(task, str(total + 1)).reward == 0.0, row
        not_plain += exact(task, str(total)).reward == 0.0
    assert not_plain >= len(rows) // 2  # most answers are LaTeX, fractions or decimals: math-verify is needed


def test_the_code_tests_pass_the_right_value_only():
    from reinforge.rewards.code import run_tests

    rows = read_jsonl(DATA_DIR / "code.jsonl")
    assert 100 <= len(rows) <= 300
    for row in rows[:3]:
        total = _sum_in(row["prompt"][0]["content"])
        assert run_tests(str(total), asserts=row["tests"]).reward == 1.0
        assert run_tests(str(total - 1), asserts=row["tests"]).reward == 0.0
        assert run_tests(f"0{total}", asserts=row["tests"]).reward == 0.0  # a SyntaxError in Python 3


# --- relative data paths -------------------------------------------------------------------------------


def _recipe_with_data(tmp_path, task_lines: str):
    recipe_dir = tmp_path / "recipes"
    (recipe_dir / "data").mkdir(parents=True)
    def rows(numbers):
        return "".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in numbers)

    (recipe_dir / "data" / "train.jsonl").write_text(rows(range(10, 40)))
    (recipe_dir / "data" / "held.jsonl").write_text(rows(range(40, 45)))
    recipe = recipe_dir / "r.yaml"
    recipe.write_text(f"task:\n  kind: table\n  as_chat: true\n{task_lines}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return recipe, recipe_dir, elsewhere


def test_relative_data_paths_in_a_recipe_are_found_next_to_it(tmp_path, monkeypatch):
    from reinforge.data.sources import build_task_splits

    recipe, recipe_dir, elsewhere = _recipe_with_data(
        tmp_path, "  path: data/train.jsonl\n  heldout_path: ./data/held.jsonl\n")
    monkeypatch.chdir(elsewhere)
    cfg = load_config(str(recipe))
    assert cfg.task.path == str(recipe_dir / "data" / "train.jsonl")
    assert cfg.task.heldout_path == str(recipe_dir / "data" / "held.jsonl")
    splits = build_task_splits(cfg.task)  # read from another working directory
    assert len(splits.heldout) > 0 and len(splits.train) > 0
    # also with the recipe given relative to the working directory
    monkeypatch.chdir(tmp_path)
    assert load_config("recipes/r.yaml").task.path == str(recipe_dir / "data" / "train.jsonl")


def test_overrides_and_paths_not_next_to_the_recipe_stay_relative_to_the_cwd(tmp_path, monkeypatch):
    recipe, recipe_dir, elsewhere = _recipe_with_data(tmp_path, "  path: only_in_cwd.jsonl\n")
    monkeypatch.chdir(elsewhere)
    (elsewhere / "only_in_cwd.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    assert load_config(str(recipe)).task.path == "only_in_cwd.jsonl"  # as given: the cwd's file
    # a command-line override is taken as given, even when the recipe's directory has that path too
    cfg = load_config(str(recipe), ["task.path=data/train.jsonl", "task.heldout_path=data/held.jsonl"])
    assert (cfg.task.path, cfg.task.heldout_path) == ("data/train.jsonl", "data/held.jsonl")
    absolute = str(recipe_dir / "data" / "train.jsonl")
    recipe.write_text(f"task: {{kind: table, path: {absolute}}}\n")
    assert load_config(str(recipe)).task.path == absolute


def test_a_relative_glob_in_a_recipe_is_found_next_to_it(tmp_path, monkeypatch):
    recipe, recipe_dir, elsewhere = _recipe_with_data(tmp_path, "  path: data/*.jsonl\n  format: hf_files\n")
    monkeypatch.chdir(elsewhere)
    assert load_config(str(recipe)).task.path == str(recipe_dir / "data" / "*.jsonl")
    recipe.write_text("task: {kind: table, path: 'nothing/*.jsonl', format: hf_files}\n")
    assert load_config(str(recipe)).task.path == "nothing/*.jsonl"


def test_model_reward_model_and_verifier_files_in_a_recipe_are_found_next_to_it(tmp_path, monkeypatch):
    recipe_dir = tmp_path / "project"
    (recipe_dir / "rm").mkdir(parents=True)
    (recipe_dir / "policy").mkdir()
    (recipe_dir / "rewards.py").write_text("def score(task, completion):\n    return 1.0\n")
    recipe = recipe_dir / "r.yaml"
    recipe.write_text("model: {path: policy}\ntask: {verifier: 'rewards.py:score'}\nreward:\n  terms:\n"
                      "    - {name: mine, verifier: 'rewards.py:score'}\n"
                      "    - {name: rm, reward_model: {path: rm}}\n"
                      "    - {name: other, verifier: exact_match}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(str(recipe))
    assert cfg.model.path == str(recipe_dir / "policy")
    assert cfg.task.verifier == cfg.reward.terms[0].verifier == f"{recipe_dir / 'rewards.py'}:score"
    assert cfg.reward.terms[1].reward_model.path == str(recipe_dir / "rm")
    assert cfg.reward.terms[2].verifier == "exact_match"
    # names that are not next to the recipe stay as written: an alias, a module reference
    recipe.write_text("model: {path: tiny-base}\ntask: {verifier: 'reinforge.rewards.verifiers:exact_match'}\n")
    cfg = load_config(str(recipe))
    assert (cfg.model.path, cfg.task.verifier) == ("tiny-base", "reinforge.rewards.verifiers:exact_match")


# --- the example recipes, end to end -------------------------------------------------------------------


@pytest.mark.slow
def test_math_jsonl_recipe(tmp_path):
    """math-verify scores the base model's sums against answers written as LaTeX, fractions or decimals:
    every sample's reward is 1 exactly when the last number of its completion is the sum."""
    pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'reinforge[math]')")
    cfg, result, rows, samples = _run("math_jsonl", tmp_path)
    assert cfg.task.verifier == "math_verify" and cfg.task.path == str(DATA_DIR / "math.jsonl")
    answers = {row["id"]: row["answer"] for row in read_jsonl(DATA_DIR / "math.jsonl")}
    for s in samples:
        assert s["task_id"] in answers
        numbers = re.findall(r"\d+", s["completion"])
        expected = float(bool(numbers) and int(numbers[-1]) == _sum_in(s["prompt"]))
        assert s["reward"] == expected, (s, answers[s["task_id"]])
    assert max(m["reward/accuracy"] for m in rows) > 0  # the base model gets some sums right: scored, not zeros
    assert 0 < result.heldout_before <= 1 and 0 <= result.heldout_after <= 1


def _runs_to_the_sum(completion: str, total: int) -> bool:
    """What the sandboxed test decides, computed here: the completion is a Python program (exec) and an
    expression (eval) whose value is the sum. Only for completions of tiny-base's characters."""
    assert set(completion) <= set("0123456789+-= \n"), completion
    try:
        compile(completion, "solution.py", "exec")
        tree = ast.parse(completion, mode="eval")
    except SyntaxError:
        return False
    return eval(compile(tree, "solution.py", "eval"), {"__builtins__": {}}) == total


@pytest.mark.slow
def test_code_sandbox_recipe(tmp_path):
    """The sandbox's verdicts are 0/1, both occur, and each matches the completion's value."""
    cfg, _, rows, samples = _run("code_sandbox", tmp_path)
    assert cfg.task.verifier == "code_tests" and cfg.task.columns.tests == "tests"
    rewards = [s["reward"] for s in samples]
    assert set(rewards) == {0.0, 1.0}  # they differ: the policy is trained on sandbox results
    for s in samples:
        assert s["reward"] == float(_runs_to_the_sum(s["completion"], _sum_in(s["prompt"]))), s
    assert any(m["reward/mean"] > 0 for m in rows)


@pytest.mark.slow
def test_reasoning_gym_recipe(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'reinforge[reasoning-gym]')")
    from reinforge.data.sources import build_task_splits
    from reinforge.rewards.build import build_reward

    small = ["task.rg_size=40", "task.heldout_size=8", "rollout.max_new_tokens=6"]
    with pytest.raises(ConfigError, match="model.path"):  # the placeholder fails, naming the key to set
        _run("reasoning_gym", tmp_path, *small)
    model = long_context_model(tmp_path)
    cfg, _, rows, samples = _run("reasoning_gym", tmp_path, *small, f"model.path={model}")
    assert all(s["task_id"].startswith("leg_counting") for s in samples)
    assert all(0 <= m["reward/mean"] <= 1 for m in rows)
    # the recipe's reward scores a right answer in <answer> tags (as its system prompt asks) 1, a wrong one 0
    assert "<answer>" in cfg.task.system_prompt
    verifier = build_reward(cfg.reward, cfg.task.verifier)
    for task in build_task_splits(cfg.task).heldout[:4]:
        assert verifier(task, f"2 + 2 legs... <answer>{task.answer}</answer>").reward == 1.0
        assert verifier(task, f"<answer>{int(task.answer) + 1}</answer>").reward == 0.0


@pytest.mark.slow
def test_reward_model_recipe(tmp_path):
    """The shipped recipe runs as shipped, its reward model the shipped tiny-rm (reference-based): each
    term is logged, the reward is their weighted sum, and tiny-rm scores the right answer above a near
    miss. A path that is no model fails naming the term, the key and the value."""
    from reinforge.data.arithmetic import arithmetic_problem
    from reinforge.rewards.build import build_reward

    index = next(i for i, t in enumerate(load_config("reward_model").reward.terms) if t.reward_model is not None)
    assert index == 1  # the override the recipe's comment and docs/recipes.md give
    bad = load_config("reward_model", [f"reward.terms.{index}.reward_model.path=path/to/reward-model"])
    with pytest.raises(ConfigError, match=r"reward term 'rm': reward_model.path 'path/to/reward-model': not a Hugging Face model directory"):
        build_reward(bad.reward, bad.task.verifier)
    shipped = build_reward(load_config("reward_model").reward, "exact_match")
    task = arithmetic_problem(1234, 2, "+")  # 12+34=46
    right, near = shipped(task, "46"), shipped(task, "47")
    assert right.terms["rm"] > near.terms["rm"] and right.correct and not near.correct
    cfg, _, rows, _ = _run("reward_model", tmp_path, "task.heldout_size=10")
    assert cfg.reward.terms[index].reward_model.path == "tiny-rm"
    weights = {t.name: t.weight for t in cfg.reward.terms}
    assert set(weights) == {"correct", "rm"} and cfg.reward.terms[0].verifier == "exact_match"
    for m in rows:
        assert {f"reward/term/{n}" for n in weights} <= m.keys()
        assert m["reward/mean"] == pytest.approx(sum(w * m[f"reward/term/{n}"] for n, w in weights.items()), abs=1e-5)
    assert len({m["reward/term/rm"] for m in rows}) > 1 or rows[0]["reward/term/rm"] != 0
