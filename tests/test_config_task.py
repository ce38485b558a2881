"""The ``task`` section: a union discriminated by ``task.kind``, one way of naming columns (``task.columns``),
and overrides that switch the kind."""

import json

import pytest
import yaml

from reinforge.config import (
    RECIPES_DIR,
    AgentTaskConfig,
    ArithmeticTaskConfig,
    ColumnsConfig,
    JsonlTaskConfig,
    ReasoningGymTaskConfig,
    TableTaskConfig,
    config_from_dict,
    dump_config,
    load_config,
    preset_names,
    task_config,
)
from reinforge.data.sources import build_task_splits
from reinforge.errors import ConfigError


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    return str(e.value)


@pytest.mark.parametrize(("section", "model"), [
    ({"kind": "arithmetic", "digits": 1, "ops": "+-"}, ArithmeticTaskConfig),
    ({"kind": "jsonl", "path": "d.jsonl", "columns": {"prompt": "q"}}, JsonlTaskConfig),
    ({"kind": "table", "path": "d.csv", "format": "csv", "json_columns": ["q"], "as_chat": True}, TableTaskConfig),
    ({"kind": "reasoning_gym", "rg_tasks": "leg_counting", "rg_size": 10}, ReasoningGymTaskConfig),
    ({"kind": "calculator", "digits": [2, 2]}, AgentTaskConfig),
    ({"kind": "guessing", "high": 8}, AgentTaskConfig),
])
def test_each_kind_parses_into_its_own_model_and_round_trips(section, model, tmp_path):
    env = {"name": section["kind"]} if model is AgentTaskConfig else {}
    cfg = config_from_dict({"task": section, "env": env})
    assert type(cfg.task) is model and cfg.task.kind == section["kind"]
    values = {**vars(cfg.task), **getattr(cfg.task, "params", {})}  # a task source's arguments are inline
    assert {k: values[k] for k in section if k != "columns"} == {k: v for k, v in section.items() if k != "columns"}
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    assert load_config(saved) == cfg
    dumped = yaml.safe_load(saved.read_text())["task"]
    assert set(dumped) == set(model.model_fields) | set(getattr(cfg.task, "params", {}))  # the kind's own fields
    assert type(task_config(section)) is model


def test_a_field_of_another_kind_is_refused_naming_the_field_and_the_kind():
    msg = _error({"task": {"kind": "jsonl", "path": "d.jsonl", "digits": 3}})
    assert "task.digits: not a field of task kind jsonl" in msg
    assert "allowed keys here: kind, verifier" in msg and "columns" in msg and "ops" not in msg
    assert "task.rg_tasks: not a field of task kind arithmetic" in _error({"task": {"rg_tasks": "leg_counting"}})
    assert "task.as_chat: not a field of task kind jsonl" in _error(
        {"task": {"kind": "jsonl", "path": "d.jsonl", "as_chat": True}})
    assert "task.path: not a field of task kind calculator" in _error(
        {"task": {"kind": "calculator", "path": "x"}, "env": {"name": "calculator"}})
    # inside a kind's own sub-section the message is the usual one
    assert "task.columns.question: unknown key; allowed keys here: prompt, answer" in _error(
        {"task": {"kind": "table", "path": "d.csv", "columns": {"question": "q"}}})


def test_unknown_kind_and_missing_source_are_named():
    msg = _error({"task": {"kind": "parquetx"}})
    assert "task.kind: allowed values: 'arithmetic', 'jsonl', 'table'" in msg and "(got 'parquetx')" in msg
    assert "task.kind=table needs task.path" in _error({"task": {"kind": "table"}})
    assert "task.kind=reasoning_gym needs task.rg_tasks" in _error({"task": {"kind": "reasoning_gym"}})


def test_the_old_column_keys_say_to_use_columns():
    msg = _error({"task": {"kind": "jsonl", "path": "d.jsonl", "prompt_key": "q", "answer_key": "a"}})
    assert "task.prompt_key, task.answer_key" in msg and "use task.columns.prompt, task.columns.answer" in msg
    with pytest.raises(ConfigError, match=r"task.answer_key: .* use task.columns.answer instead"):
        load_config(None, ["task.kind=jsonl", "task.path=d.jsonl", "task.answer_key=a"])


def test_the_default_task_is_unchanged():
    defaults = {"kind": "arithmetic", "verifier": "exact_match", "heldout_size": 500, "seed": 1234,
                "sampler": {"name": "uniform"}, "system_prompt": None, "digits": 2, "ops": "+"}
    for cfg in (config_from_dict({}), config_from_dict({"task": {}})):
        assert cfg.task.model_dump() == defaults
    assert config_from_dict({"task": {"digits": 1}}).task.kind == "arithmetic"
    assert load_config(None).task.model_dump() == defaults  # the default recipe spells out the same values


def _recipe_and_presets():
    return [(p.stem, []) for p in sorted(RECIPES_DIR.glob("*.yaml"))] + [("default", [f"preset={n}"])
                                                                        for n in preset_names()]


@pytest.mark.parametrize(("recipe", "overrides"), _recipe_and_presets())
def test_every_shipped_recipe_and_preset_loads_its_task_as_written(recipe, overrides):
    """Each task key the recipe writes is loaded as written (paths: found next to the recipe); every
    other key of its kind keeps its default."""
    cfg = load_config(recipe, overrides)
    written = yaml.safe_load((RECIPES_DIR / f"{recipe}.yaml").read_text()).get("task") or {}
    loaded = cfg.task.model_dump(mode="json")
    default = type(cfg.task).model_validate({"kind": cfg.task.kind, **{k: written[k] for k in ("path", "rg_tasks")
                                                                       if k in written}})
    for key, value in loaded.items():
        if key in ("path", "heldout_path") and key in written:
            assert value == str((RECIPES_DIR / written[key]).resolve())
        elif key in written:
            assert json.dumps(value) == json.dumps(_as_json(key, written[key], cfg)), (recipe, key)
        else:
            assert value == default.model_dump(mode="json")[key], (recipe, key)


def _as_json(key, value, cfg):
    if key == "columns":  # a partial mapping: the unnamed roles keep their defaults
        return ColumnsConfig(**value).model_dump(mode="json")
    return getattr(cfg.task, key) if key == "sampler" else value


def test_an_override_switching_the_kind_drops_the_recipe_keys_the_new_kind_lacks(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "solution": str(i + 1), "uid": f"q{i}"}) + "\n"
                            for i in range(10)))
    # the default recipe writes digits and ops: task.kind=jsonl does not inherit them
    cfg = load_config(None, ["task.kind=jsonl", f"task.path={data}", "task.heldout_size=2"])
    assert type(cfg.task) is JsonlTaskConfig and cfg.task.path == str(data) and cfg.task.seed == 1234
    # keys the user sets are still checked against the new kind
    with pytest.raises(ConfigError, match="task.digits: not a field of task kind jsonl"):
        load_config(None, ["task.kind=jsonl", f"task.path={data}", "task.digits=3"])
    # a saved config.yaml spells out every default of its kind: switching from it works the same way
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(cfg))
    table = load_config(saved, ["task.kind=table", "task.columns.prompt=question", "task.columns.answer=solution",
                                "task.columns.id=uid"])
    assert type(table.task) is TableTaskConfig and table.task.path == str(data)  # shared keys are kept
    assert table.task.heldout_size == 2 and table.task.columns.id == "uid"
    back = load_config(saved, ["task.kind=arithmetic"])
    assert back.task == ArithmeticTaskConfig(heldout_size=2)
    # the same kind again changes nothing
    assert load_config(saved, ["task.kind=jsonl"]) == cfg


def test_jsonl_and_table_name_their_columns_the_same_way(tmp_path):
    data = tmp_path / "d.jsonl"
    rows = [{"question": f"{i}+1=", "solution": i + 1, "uid": f"q{i}", "level": i % 2} for i in range(10)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns = {"prompt": "question", "answer": "solution", "id": "uid", "difficulty": "level"}
    for kind in ("jsonl", "table"):
        cfg = config_from_dict({"task": {"kind": kind, "path": str(data), "heldout_size": 2, "columns": columns}})
        splits = build_task_splits(cfg.task)
        tasks = {t.id: t for t in [*splits.train, *splits.heldout]}
        assert len(tasks) == 10 and tasks["q3"].prompt == "3+1=" and tasks["q3"].answer == "4"
        assert tasks["q3"].metadata == {"difficulty": 1}
