"""The one-call Python API (reinforge.train) mirrors `reinforge train`: keyword arguments become the
command line's overrides, a function of yours is named by its module, rows and a model object are cached
by content under the output directory, the run comes back."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import datasets
import pytest
import yaml

import reinforge
from reinforge.api import _overrides
from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.plugins import import_user_module
from reinforge.rewards.verifiers import RewardResult

CALLS: list[str] = []
ESTIMATES: list[int] = []
ROWS = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a in range(4) for b in range(6)]
NONE = dict(model=None, task=None, preset=None, plugins=None)  # _overrides' required keywords
SMALL = dict(train={"steps": 2, "time_limit_s": 0}, rollout={"prompts_per_step": 4, "group_size": 4},
             eval={"final_samples": 0}, log={"report": False}, checkpoint={"every": 0})


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()


def half_credit(task, completion: str) -> RewardResult:
    """A user's reward function: 1 for the right answer, 0.5 for a wrong number, 0 otherwise."""
    CALLS.append(completion)
    if completion.strip() == task.answer:
        return RewardResult(1.0, True)
    return RewardResult(0.5 if completion.strip().isdigit() else 0.0, False)


def centered_sign(rewards, group_index, mask):
    """A user's advantage estimator: +1 on the tokens of a completion above its group's mean reward, -1 below."""
    import torch

    from reinforge.algo.advantage_estimators import group_mean_std

    ESTIMATES.append(len(rewards))
    mean, _, _ = group_mean_std(rewards, group_index)
    return torch.sign(rewards.double() - mean)[:, None] * mask


@pytest.fixture(scope="module")
def random_llama():
    """A random one-layer Llama and the shipped tokenizer, built from a config (cheaper than tiny-base)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from reinforge.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-base")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(config), tok


@pytest.fixture(autouse=True)
def _registries_as_they_were():
    """A part function looked up by its reference registers under it: removed after each test."""
    from reinforge.parts import all_kinds

    saved = {key: dict(registry._entries) for key, registry in all_kinds().items()}
    yield
    for key, registry in all_kinds().items():
        registry._entries.clear()
        registry._entries.update(saved[key])


def test_arguments_become_the_command_lines_overrides():
    assert _overrides(model="tiny-base", task="arithmetic", verifier="exact_match", preset="dapo", plugins=["p.py"],
                      train={"steps": 5, "lr": 1e-4}, **{"algo.policy_loss.clip_high": 0.28}) == [
        "preset=dapo", 'plugins=["p.py"]', 'model.path="tiny-base"', 'task.kind="arithmetic"',
        'task.verifier="exact_match"', "train.steps=5", "train.lr=0.0001", "algo.policy_loss.clip_high=0.28"]
    assert _overrides(model=None, task={"kind": "arithmetic", "digits": 1}, verifier=half_credit, preset=None,
                      plugins=None) == [f'task.verifier="{__name__}:half_credit"', 'task.kind="arithmetic"',
                                        "task.digits=1"]
    with pytest.raises(ValueError, match="top level"):
        _overrides(model=None, task=None, verifier=lambda t, c: 1.0, preset=None, plugins=None)


def test_reward_is_the_reward_and_a_mapping_of_its_keys_its_section():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reward= a function is no deprecated alias of verifier= any more
        assert _overrides(model=None, task=None, preset=None, plugins=None, reward=half_credit, train={"steps": 1}) == [
            f'reward.terms=[{{"name": "half_credit", "verifier": "{__name__}:half_credit", "weight": 1.0}}]',
            "train.steps=1"]
    with pytest.raises(TypeError, match="verifier= or reward=, not both"):
        _overrides(model=None, task=None, preset=None, plugins=None, verifier="exact_match", reward="numeric_match")
    section = {"reward": {"pool": "thread"}}  # a mapping is the reward section, as train={...} is the train section
    assert _overrides(model=None, task=None, verifier="exact_match", preset=None, plugins=None, reward=None) == [
        'task.verifier="exact_match"']
    assert _overrides(model=None, task=None, verifier=None, preset=None, plugins=None, **section) == [
        'reward.pool="thread"']


@pytest.mark.slow
def test_train_in_one_call_with_your_own_reward(tmp_path):
    CALLS.clear()
    run = reinforge.train(
        preset="grpo", model="tiny-base", task="arithmetic", verifier=half_credit, output_dir=str(tmp_path),
        train={"steps": 2, "time_limit_s": 0}, rollout={"prompts_per_step": 4, "group_size": 4},
        eval={"final_samples": 0}, log={"report": False}, **{"algo.policy_loss.clip_high": 0.28, "task.heldout_size": 8},
    )
    assert run.steps == 2 and run.heldout_before is not None
    saved = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert saved["algo"]["policy_loss"]["clip_high"] == 0.28 and saved["task"]["verifier"] == f"{__name__}:half_credit"
    steps = [m for m in run.metrics() if "reward/mean" in m]
    assert len(steps) == 2 and len(CALLS) >= 2 * 16  # every training completion went through it
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in steps)


def test_reward_functions_and_names_become_reward_terms():
    assert _overrides(**NONE, reward=[half_credit, ("numeric_match", 0.5)]) == [
        f'reward.terms=[{{"name": "half_credit", "verifier": "{__name__}:half_credit", "weight": 1.0}}, '
        '{"name": "numeric_match", "verifier": "numeric_match", "weight": 0.5}]']
    named = _overrides(**NONE, reward={"credit": half_credit})
    assert named == [f'reward.terms=[{{"name": "credit", "verifier": "{__name__}:half_credit", "weight": 1.0}}]']
    assert _overrides(**NONE, reward="exact_match") == [
        'reward.terms=[{"name": "exact_match", "verifier": "exact_match", "weight": 1.0}]']
    as_in_a_recipe = _overrides(**NONE, reward=[{"verifier": half_credit, "weight": 0.0, "primary": True}])
    assert as_in_a_recipe == [f'reward.terms=[{{"name": "half_credit", "verifier": "{__name__}:half_credit", '
                              '"weight": 0.0, "primary": true}]']
    cfg = load_config(None, _overrides(**NONE, reward=half_credit))
    terms = [(t.name, t.verifier, t.weight) for t in cfg.reward.terms]
    assert terms == [("half_credit", f"{__name__}:half_credit", 1.0)]


def test_objects_the_config_cannot_name_are_refused_naming_the_argument(tmp_path):
    def nested(task, completion):
        return 1.0

    none = dict(NONE, output_dir=str(tmp_path))
    for argument, value in [("reward", lambda t, c: 1.0), ("reward", nested), ("verifier", nested),
                            ("advantage", lambda rewards, group_index, mask: mask)]:
        with pytest.raises(ValueError, match=f"{argument}=.*top level of a module"):
            _overrides(**{**none, argument: value})
    with pytest.raises(TypeError, match="reward=: 3 is not a reward"):
        _overrides(**none, reward=[half_credit, 3])
    with pytest.raises(ValueError, match="two terms named 'half_credit'"):
        _overrides(**none, reward=[half_credit, (half_credit, 0.5)])
    with pytest.raises(TypeError, match="verifier= or reward=, not both"):
        _overrides(**{**none, "verifier": "exact_match"}, reward=half_credit)
    with pytest.raises(TypeError, match="task=3: give a task kind"):
        _overrides(**{**none, "task": 3})
    with pytest.raises(TypeError, match="task=: row 1 is a str"):
        _overrides(**{**none, "task": [{"prompt": "1+1="}, "2+2="]})
    with pytest.raises(ValueError, match="task=: no rows"):
        _overrides(**{**none, "task": []})
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS)})
    with pytest.raises(ValueError, match=r"task= is a DatasetDict with splits train, test: .*task=ds\[.train.\], he"):
        _overrides(**{**none, "task": splits})
    with pytest.raises(TypeError, match="model=int: give a model directory"):
        _overrides(**{**none, "model": 3})
    with pytest.raises(TypeError, match="tokenizer= goes with model= a model object"):
        _overrides(**{**none, "model": "tiny-base"}, tokenizer=object())
    with pytest.raises(TypeError, match=r"train.lr=<function half_credit.*: a function goes in reward="):
        _overrides(**none, train={"lr": half_credit})
    assert not list((tmp_path / ".datasets").glob(".staging-*"))  # a refused row leaves no half-written file


def test_rows_are_cached_once_by_content_as_a_table_task(tmp_path):
    none = dict(model=None, preset=None, plugins=None, output_dir=str(tmp_path))
    listed = _overrides(**none, task=ROWS, heldout=ROWS[:4])
    path = tmp_path / ".datasets" / f"{hashlib.sha256(_jsonl(ROWS)).hexdigest()}.jsonl"
    held = tmp_path / ".datasets" / f"{hashlib.sha256(_jsonl(ROWS[:4])).hexdigest()}.jsonl"
    assert listed == ['task.kind="table"', f'task.path="{path}"', f'task.heldout_path="{held}"',
                      f'output_dir="{tmp_path}"']
    assert path.read_bytes() == _jsonl(ROWS)
    assert _overrides(**none, task=datasets.Dataset.from_list(ROWS), heldout=ROWS[:4]) == listed  # the same file
    section = _overrides(**none, task={"path": ROWS, "columns": {"answer": "answer"}, "heldout_size": 4})
    assert section == ['task.kind="table"', f'task.path="{path}"', 'task.columns.answer="answer"',
                       "task.heldout_size=4", f'output_dir="{tmp_path}"']
    assert sorted(p.name for p in (tmp_path / ".datasets").iterdir()) == sorted([path.name, held.name])


def test_a_part_function_is_named_by_its_module(tmp_path):
    from reinforge.algo.advantage_estimators import ADVANTAGES

    assert _overrides(**NONE, advantage=centered_sign, policy_loss={"name": "ppo_clip", "clip_high": 0.3}) == [
        f'algo.advantage="{__name__}:centered_sign"', 'algo.policy_loss={"name": "ppo_clip", "clip_high": 0.3}']
    grpo = ADVANTAGES.get("grpo")  # a registered part given as a function is its registered name
    assert _overrides(**NONE, algo={"advantage": grpo}) == ['algo.advantage="grpo"']
    plugin = tmp_path / "my_parts.py"  # a plug-in's part: its name, and the plug-in for every process
    plugin.write_text("from reinforge.algo.advantage_estimators import ADVANTAGES\n\n\n"
                      "@ADVANTAGES.register('api_sign', formula='A = sign(r)', paper='an example')\n"
                      "def api_sign(rewards, mask):\n    return rewards.sign()[:, None] * mask\n")
    module = import_user_module(str(plugin), "plugins.0")
    assert _overrides(**NONE, advantage=module.api_sign) == [f'plugins=["{plugin}"]', 'algo.advantage="api_sign"']
    cfg = load_config(None, _overrides(**NONE, **{"algo.advantage": centered_sign}))
    assert cfg.algo.advantage == f"{__name__}:centered_sign" and ADVANTAGES.needs(cfg.algo.advantage) == frozenset()
    assert _overrides(**NONE, advantage=centered_sign) == [f'algo.advantage="{__name__}:centered_sign"']  # once more
    with pytest.raises(ConfigError, match="advantage estimator 'no_such_module:f': module 'no_such_module' is not"):
        load_config(None, ["algo.advantage=no_such_module:f"])


@pytest.mark.slow
def test_reward_functions_rows_and_a_part_function_train(tmp_path, random_llama):
    CALLS.clear()
    ESTIMATES.clear()
    model, tok = random_llama
    run = reinforge.train(model=model, tokenizer=tok, task=ROWS[4:], heldout=ROWS[:4], reward=[half_credit],
                          advantage=centered_sign, **SMALL, output_dir=str(tmp_path))
    assert run.steps == 2 and run.heldout_before is not None
    steps = [m for m in run.metrics() if "reward/mean" in m]
    assert len(steps) == 2 and all(0.0 <= m["reward/term/half_credit"] <= 1.0 for m in steps)
    assert len(CALLS) >= 2 * 16 and len(ESTIMATES) == 2  # every completion scored, every step estimated by them
    assert all(m["adv/abs_mean"] == pytest.approx(1.0) for m in steps)  # centered_sign: +-1 on every token
    saved = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    [term] = saved["reward"]["terms"]
    assert (term["name"], term["verifier"], term["weight"]) == ("half_credit", f"{__name__}:half_credit", 1.0)
    assert saved["algo"]["advantage"] == f"{__name__}:centered_sign" and run.run_dir.name.endswith("centered_sign")
    assert saved["task"]["kind"] == "table" and Path(saved["task"]["path"]).parent == tmp_path / ".datasets"
    assert Path(saved["task"]["path"]).read_bytes() == _jsonl(ROWS[4:])
    assert Path(saved["task"]["heldout_path"]).read_bytes() == _jsonl(ROWS[:4])
    from reinforge.algo.advantage_estimators import ADVANTAGES

    del ADVANTAGES._entries[f"{__name__}:centered_sign"]  # as in a new process: the resumed run imports it again
    resumed = reinforge.train(resume=run.run_dir, train={"steps": 3})
    assert resumed.steps == 3 and len(ESTIMATES) == 3


@pytest.mark.slow
def test_a_dataset_and_a_model_object_train(tmp_path, random_llama):
    model, tok = random_llama
    run = reinforge.train(model=model, tokenizer=tok, task=datasets.Dataset.from_list(ROWS), verifier="exact_match",
                          **{**SMALL, "train": {"steps": 1, "time_limit_s": 0}}, output_dir=str(tmp_path),
                          **{"task.heldout_size": 4})
    assert run.steps == 1
    saved = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    copy = Path(saved["model"]["path"])
    assert copy.parent == tmp_path / ".models" and (copy / "model.safetensors").is_file()
    assert (copy / "tokenizer.json").is_file() and Path(saved["task"]["path"]).read_bytes() == _jsonl(ROWS)
    again = _overrides(**{**NONE, "model": model}, tokenizer=tok, output_dir=str(tmp_path))
    assert again[0] == f'model.path="{copy}"' and len(list((tmp_path / ".models").iterdir())) == 1  # copied once


def test_a_function_of_the_running_script_is_found_as_main(monkeypatch):
    """``python quickstart.py`` defining ``score`` records ``__main__:score``; the script's module has no
    spec to look up (``__main__.__spec__`` is None), so the reference is read from the module itself."""
    import sys

    from reinforge.errors import ConfigError
    from reinforge.plugins import import_callable

    def score(task, completion):
        return 1.0

    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "score", score, raising=False)
    assert import_callable("__main__:score", "task.verifier", ConfigError) is score
