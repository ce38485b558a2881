import pytest

from reinforge.config import RunConfig, apply_overrides, config_from_dict, dump_config, load_config
from reinforge.errors import ConfigError


def test_default_recipe_loads_and_overrides_apply():
    cfg = load_config(None, ["algo.policy_loss.clip_high=0.28", "train.steps=50", 'rollout.stop=["\\n"]'])
    assert cfg.algo.policy_loss.settings.clip_high == 0.28
    assert cfg.train.steps == 50
    assert cfg.rollout.stop == ["\n"]
    assert cfg.model.path == "tiny-base"


def test_unknown_key_names_the_key_and_allowed_keys():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.policy_loss.clip_hgh=0.3"])
    msg = str(e.value)
    assert "algo.policy_loss.clip_hgh" in msg and "unknown key" in msg and "clip_high" in msg


def test_unknown_registered_name_lists_allowed_values():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.advantage=nope"])
    assert "algo.advantage" in str(e.value) and "grpo" in str(e.value)


def test_bad_literal_and_range_values_are_rejected():
    with pytest.raises(ConfigError, match="task.kind"):
        config_from_dict({"task": {"kind": "parquetx"}})
    with pytest.raises(ConfigError, match="rollout.temperature"):
        config_from_dict({"rollout": {"temperature": 0}})
    with pytest.raises(ConfigError, match="task.path"):
        config_from_dict({"task": {"kind": "jsonl"}})


def test_override_into_a_value_is_an_error():
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"seed": 1}, ["seed.x=2"])
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["seed"])


def test_overrides_index_lists_by_position():
    data = {"reward": {"terms": [{"name": "a", "verifier": "exact_match"},
                                 {"name": "rm", "reward_model": {"path": "old"}}]}}
    apply_overrides(data, ["reward.terms.1.reward_model.path=/models/rm", "reward.terms.0.weight=0.5",
                           "reward.terms.-1.weight=2"])
    assert data["reward"]["terms"] == [{"name": "a", "verifier": "exact_match", "weight": 0.5},
                                       {"name": "rm", "reward_model": {"path": "/models/rm"}, "weight": 2}]
    with pytest.raises(ConfigError, match=r"'reward.terms' has 2 items; no index 2"):
        apply_overrides(data, ["reward.terms.2.weight=1"])
    with pytest.raises(ConfigError, match=r"'reward.terms' is a list; index it by position, e.g. reward.terms.0"):
        apply_overrides(data, ["reward.terms.rm.weight=1"])
    data = {"rollout": {"stop": ["\n", "."]}}
    apply_overrides(data, ["rollout.stop.1=END"])
    assert data["rollout"]["stop"] == ["\n", "END"]


def test_missing_recipe_names_shipped_ones():
    with pytest.raises(ConfigError, match="default"):
        load_config("no_such_recipe")


def test_dump_roundtrip(tmp_path):
    cfg = load_config(None, ["train.steps=7"])
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg
    assert RunConfig().train.steps != 7
