"""Algorithm presets: shipped YAML, merged under the recipe, overridable, listed by `reinforge algos`."""

import re

import pytest
import yaml
from typer.testing import CliRunner

from reinforge.cli import app
from reinforge.config import (
    PRESETS_DIR,
    config_from_dict,
    deep_merge,
    load_config,
    preset_names,
    preset_summary,
)
from reinforge.errors import ConfigError

EXPECTED = {"grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp", "remax", "opo", "ppo", "online_dpo", "apo",
            "rapo", "astar_po", "pacs", "bapo", "dcpo", "aspo", "m2po",
            "gtpo", "grpo_s", "aepo", "repo", "rover"}


def test_every_issue_preset_ships_and_validates():
    assert set(preset_names()) == EXPECTED
    for name in EXPECTED:
        cfg = config_from_dict({"preset": name})
        assert cfg.preset == name
        assert "arXiv" in preset_summary(name), name


@pytest.mark.parametrize(("name", "parts"), [
    ("grpo", ("grpo", "ppo_clip", "seq_mean_token_mean", 0.04, "loss")),
    ("dr_grpo", ("dr_grpo", "ppo_clip", "seq_mean_token_sum_norm", 0.0, "loss")),
    ("dapo", ("grpo", "ppo_clip", "token_mean", 0.0, "loss")),
    ("gspo", ("grpo", "gspo", "seq_mean_token_mean", 0.0, "loss")),
    ("cispo", ("grpo", "cispo", "token_mean", 0.0, "loss")),
    ("rloo", ("rloo", "reinforce", "seq_mean_token_sum", 0.0, "loss")),
    ("reinforce_pp", ("reinforce_pp", "ppo_clip", "token_mean", 0.01, "reward")),
    ("remax", ("remax", "reinforce", "seq_mean_token_sum", 0.0, "loss")),
    ("opo", ("opo", "reinforce", "seq_mean_token_sum", 0.0, "loss")),
    ("ppo", ("gae", "ppo_clip", "token_mean", 0.01, "reward")),
    ("online_dpo", ("grpo", "dpo", "seq_mean_token_sum", 0.0, "loss")),
    ("apo", ("grpo_stcr", "ppo_clip", "seq_mean_token_mean", 0.0, "loss")),
    ("rapo", ("grpo", "ppo_clip", "seq_mean_token_mean", 0.0, "loss")),
    ("astar_po", ("grpo", "astar_po", "seq_mean_token_mean", 0.0, "loss")),
    ("pacs", ("grpo", "pacs", "seq_mean_token_mean", 0.0, "loss")),
    ("bapo", ("grpo", "bapo", "token_mean", 0.0, "loss")),
    ("dcpo", ("dcpo_sas", "dcpo", "seq_sum_token_mean", 0.0, "loss")),
    ("aspo", ("grpo", "aspo", "token_mean", 0.001, "loss")),
    ("m2po", ("grpo", "m2po", "token_mean", 0.0, "loss")),
    ("gtpo", ("gtpo", "ppo_clip", "token_mean", 0.0, "loss")),
    ("grpo_s", ("grpo_s", "ppo_clip", "token_mean", 0.0, "loss")),
    ("aepo", ("aepo", "aepo", "token_mean", 0.0, "loss")),
    ("rover", ("grpo", "rover", "token_mean", 0.0, "loss")),
])
def test_preset_parts(name, parts):
    a = config_from_dict({"preset": name}).algo
    assert (a.advantage, a.policy_loss, a.loss_agg, a.kl.coef, a.kl.placement) == parts


def test_dapo_data_side_and_clip_higher():
    a = config_from_dict({"preset": "dapo"}).algo
    clip = a.policy_loss.settings
    assert (clip.clip_low, clip.clip_high, a.dynamic_sampling, a.reward_shapers[0].settings().buffer) == (0.2, 0.28, True, 0.2)


def test_clip_family_presets_take_the_papers_settings():
    bapo = config_from_dict({"preset": "bapo"}).algo.policy_loss.settings
    assert (bapo.pos_share, bapo.clip_low_start, bapo.clip_low_max, bapo.clip_high_start, bapo.clip_high_max,
            bapo.clip_high_step, bapo.clip_low_step) == (0.4, 0.6, 0.9, 1.2, 3.0, 0.05, 0.02)
    dcpo = config_from_dict({"preset": "dcpo"}).algo.policy_loss.settings
    assert (dcpo.clip_low, dcpo.clip_high, dcpo.max_ratio) == (0.16, 0.2, 10.0)
    aspo = config_from_dict({"preset": "aspo"}).algo.policy_loss.settings
    assert (aspo.clip_low, aspo.clip_high, aspo.dual_clip) == (0.2, 0.2, 3.0)
    m2po = config_from_dict({"preset": "m2po"})
    assert m2po.algo.policy_loss.settings.m2_threshold == 0.04 and m2po.train.minibatches == 8


def test_baseline_presets_keep_equal_reward_groups():
    """ReMax (r - r_greedy), REINFORCE++ (batch normalisation) and PPO (critic) must not drop groups."""
    for name in ("remax", "reinforce_pp", "ppo"):
        assert config_from_dict({"preset": name}).algo.skip_equal_reward_groups is False, name


def test_recipe_and_overrides_win_over_preset(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"preset": "dapo", "algo": {"policy_loss": {"clip_high": 0.3}}, "train": {"steps": 7}}))
    cfg = load_config(recipe, ["algo.kl.coef=0.1"])
    clip = cfg.algo.policy_loss.settings
    assert clip.clip_high == 0.3 and clip.clip_low == 0.2 and cfg.algo.dynamic_sampling
    assert cfg.algo.kl.coef == 0.1 and cfg.algo.kl.estimator == "k3" and cfg.train.steps == 7



def test_preset_on_the_command_line_switches_the_algorithm():
    """The default recipe sets loss_agg and kl.coef over grpo; `preset=ppo` replaces them with ppo's."""
    cfg = load_config(None, ["preset=ppo"])
    assert (cfg.preset, cfg.algo.advantage, cfg.algo.kl.coef, cfg.algo.kl.placement) == ("ppo", "gae", 0.01, "reward")
    assert cfg.train.steps == 1000 and cfg.train.minibatches == 4  # ppo's own; recipe keys the preset does not set stay
    assert load_config(None, ["algo.kl.coef=0", "preset=ppo"]).algo.kl.coef == 0.0  # other overrides still win


def test_default_recipe_is_grpo_preset_with_its_overrides():
    cfg = load_config(None)
    assert cfg.preset == "grpo" and cfg.algo.advantage == "grpo" and cfg.algo.loss_agg == "token_mean"
    assert cfg.algo.kl.coef == 0.0


def test_resolved_config_reloads_to_itself(tmp_path):
    from reinforge.config import dump_config

    cfg = load_config(None, ["preset=ppo", "algo.critic.lr=3e-4"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


def test_unknown_preset_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=re.escape(f"unknown preset 'grpoo'; allowed: {', '.join(sorted(preset_names()))}")):
        load_config(None, ["preset=grpoo"])
    with pytest.raises(ConfigError, match="preset: must be a preset name"):
        config_from_dict({"preset": 3})


def test_bad_key_inside_preset_file_is_reported(tmp_path, monkeypatch):
    import reinforge.config.recipes as config

    (tmp_path / "bad.yaml").write_text("# Bad. arXiv:0\nalgo:\n  advantge: grpo\n")
    monkeypatch.setattr(config, "PRESETS_DIR", tmp_path)
    with pytest.raises(ConfigError, match="algo.advantge: unknown key"):
        config_from_dict({"preset": "bad"})


def test_deep_merge_does_not_mutate():
    base = {"algo": {"a": 1, "kl": {"coef": 1}}}
    over = {"algo": {"kl": {"estimator": "k1"}}}
    assert deep_merge(base, over) == {"algo": {"a": 1, "kl": {"coef": 1, "estimator": "k1"}}}
    assert base == {"algo": {"a": 1, "kl": {"coef": 1}}}


def test_dual_clip_must_exceed_one():
    with pytest.raises(ConfigError, match="algo.policy_loss.dual_clip: must be 0"):
        load_config(None, ["algo.policy_loss.dual_clip=0.5"])
    assert load_config(None, ["algo.policy_loss.dual_clip=3"]).algo.policy_loss.settings.dual_clip == 3.0


def test_algos_lists_presets_and_parts():
    result = CliRunner().invoke(app, ["algos"], terminal_width=400)
    assert result.exit_code == 0, result.output
    for name in EXPECTED:
        assert name in result.output
    for part in ("remax", "gae", "k3_st", "seq_mean_token_sum_norm", "2503.14476"):
        assert part in result.output


def test_preset_files_are_plain_sections():
    for path in PRESETS_DIR.glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        assert set(data) <= {"algo", "train", "rollout"}, path
