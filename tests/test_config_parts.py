"""A part's own options live with the part: ``algo.advantage`` / ``policy_loss`` / ``loss_agg`` are a name or
``{name, <option>: value}``, validated by the part's settings model; the former flat keys say where they moved."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from reinforge.algo.advantage_estimators import GroupNormSettings
from reinforge.algo.policy_losses import POLICY_LOSSES, PPOClipSettings
from reinforge.cli import app
from reinforge.config import (
    AlgoConfig,
    apply_overrides,
    config_from_dict,
    dump_config,
    load_config,
    preset_names,
)
from reinforge.config.algo import MOVED_OPTIONS
from reinforge.config.base import PartRef
from reinforge.errors import ConfigError
from reinforge.eval.runs import Run, group_key

GRPO = {"name": "grpo", "gamma": 1.0, "adv_eps": 1e-6, "scale_by_std": True}
PPO_CLIP = {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2, "dual_clip": 0.0}
REINFORCE = {"name": "reinforce", "tis_cap": 0.0}

# Every preset's effective options, written out by hand: the values the flat keys had before the move.
PRESET_OPTIONS = {
    "apo": ({**GRPO, "name": "grpo_stcr", "stcr_rate": 0.005, "correct_threshold": 1.0}, PPO_CLIP,
            "seq_mean_token_mean"),
    "astar_po": ({**GRPO, "scale_by_std": False}, {"name": "astar_po", "beta1": 0.5, "beta2": 1e-3,
                 "value_samples": 8, "skip_unsolved": True}, "seq_mean_token_mean"),
    "cispo": (GRPO, {"name": "cispo", "clip_low": 1.0, "clip_high": 0.28}, "token_mean"),
    "dapo": (GRPO, {**PPO_CLIP, "clip_high": 0.28}, "token_mean"),
    "dr_grpo": ({"name": "dr_grpo", "gamma": 1.0}, PPO_CLIP,
                {"name": "seq_mean_token_sum_norm", "max_len_norm": 0.0}),
    "grpo": (GRPO, PPO_CLIP, "seq_mean_token_mean"),
    "gspo": (GRPO, {"name": "gspo", "clip_low": 3e-4, "clip_high": 4e-4}, "seq_mean_token_mean"),
    "online_dpo": (GRPO, {"name": "dpo", "beta": 0.1, "label_smoothing": 0.0}, "seq_mean_token_sum"),
    "opo": ({"name": "opo", "gamma": 1.0}, REINFORCE, "seq_mean_token_sum"),
    "pacs": (GRPO, {"name": "pacs", "beta": 1.0, "anchor": "ref", "balance": True}, "seq_mean_token_mean"),
    "ppo": ({"name": "gae", "gamma": 1.0, "adv_eps": 1e-6, "scale_by_std": True, "lam": 0.95}, PPO_CLIP,
            "token_mean"),
    "reinforce_pp": ({"name": "reinforce_pp", "gamma": 1.0, "adv_eps": 1e-6, "whiten": "token"}, PPO_CLIP, "token_mean"),
    "remax": ({"name": "remax", "gamma": 1.0}, REINFORCE, "seq_mean_token_sum"),
    "rapo": (GRPO, PPO_CLIP, "seq_mean_token_mean"),
    "rloo": ({"name": "rloo", "gamma": 1.0}, REINFORCE, "seq_mean_token_sum"),
    "bapo": (GRPO, {"name": "bapo", "pos_share": 0.4, "clip_low_start": 0.6, "clip_low_max": 0.9, "clip_low_step": 0.02,
                    "clip_high_start": 1.2, "clip_high_max": 3.0, "clip_high_step": 0.05}, "token_mean"),
    "dcpo": ({"name": "dcpo_sas", "gamma": 1.0, "history_scale": 1.0}, {"name": "dcpo", "clip_low": 0.16, "clip_high": 0.2, "max_ratio": 10.0}, "seq_sum_token_mean"),
    "aspo": (GRPO, {"name": "aspo", "clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}, "token_mean"),
    "m2po": (GRPO, {"name": "m2po", "m2_threshold": 0.04}, "token_mean"),
    "gtpo": ({"name": "gtpo", "gamma": 1.0, "adv_eps": 1e-6, "alpha1": 1.0, "alpha2": 0.1},
             {**PPO_CLIP, "clip_high": 0.28}, "token_mean"),
    "grpo_s": ({"name": "grpo_s", "gamma": 1.0, "adv_eps": 1e-6, "alpha1": 1.0, "alpha2": 0.1},
               {**PPO_CLIP, "clip_high": 0.28}, "token_mean"),
    "aepo": ({**GRPO, "name": "aepo", "alpha": 0.3}, {"name": "aepo", "clip_low": 0.2, "clip_high": 0.28}, "token_mean"),
    "repo": (GRPO, {"name": "repo", "clip_low": 0.2, "clip_high": 0.2}, "seq_mean_token_mean"),
    "rover": (GRPO, {"name": "rover", "rho": 1.0, "next_q_scale": 1.0, "clip": 0.0}, "token_mean"),
}


def _recipe(tmp_path: Path, algo: dict, preset: str | None = None) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**({"preset": preset} if preset else {}), "algo": algo}))
    return path


def _error(*overrides: str, recipe: str | Path | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(recipe, list(overrides))
    return str(e.value)


def test_a_part_by_name_or_with_its_options_inline():
    bare = AlgoConfig(advantage="grpo", policy_loss="ppo_clip")
    inline = AlgoConfig(advantage={"name": "grpo", "scale_by_std": False}, policy_loss={"name": "ppo_clip",
                                                                                         "clip_high": 0.28})
    assert isinstance(bare.advantage, PartRef) and bare.advantage == "grpo" == inline.advantage
    assert bare.advantage.settings == GroupNormSettings() and bare.policy_loss.settings == PPOClipSettings()
    assert inline.advantage.settings.scale_by_std is False and inline.advantage.settings.adv_eps == 1e-6
    assert inline.policy_loss.settings.clip_high == 0.28 and inline.policy_loss.settings.clip_low == 0.2
    assert bare.loss_agg == "token_mean" and bare.loss_agg.settings is None  # a part without options
    assert bare.advantage != inline.advantage  # same name, other options: not the same part choice
    assert AlgoConfig(policy_loss={"clip_high": 0.3}).policy_loss == "ppo_clip"  # no name: the field's default


def test_each_preset_keeps_its_option_values():
    assert sorted(PRESET_OPTIONS) == preset_names()
    for name, expected in PRESET_OPTIONS.items():
        a = config_from_dict({"preset": name}).algo
        assert (a.advantage.recipe_form(), a.policy_loss.recipe_form(), a.loss_agg.recipe_form()) == expected, name
        assert tuple(a.discount) == (1.0, 0.95), name


def test_discount_is_read_from_the_estimators_settings():
    assert tuple(AlgoConfig(advantage={"name": "gae", "gamma": 0.9, "lam": 0.8}).discount) == (0.9, 0.8)
    assert tuple(AlgoConfig(advantage={"name": "grpo_turn", "gamma": 0.5}).discount) == (0.5, 0.95)


@pytest.mark.parametrize("option", MOVED_OPTIONS)
def test_a_former_flat_key_says_where_it_moved(option):
    msg = _error(f"algo.{option}=0.5")
    assert f"algo.{option}: moved: use algo." in msg and f"{option}: 0.5}}" in msg


def test_moved_key_message_names_the_part_and_the_recipes_own_part(tmp_path):
    assert "algo.clip_high: moved: use algo.policy_loss: {name: ppo_clip, clip_high: 0.28}" in _error(
        "algo.clip_high=0.28")
    assert "use algo.advantage: {name: gae, lam: 0.9} (an option of egae, gae, stepsearch, vtrace)" in _error("algo.lam=0.9")
    assert "use algo.loss_agg: {name: seq_mean_token_sum_norm, max_len_norm: 512}" in _error("algo.max_len_norm=512")
    recipe = _recipe(tmp_path, {"policy_loss": "gspo", "clip_high": 4e-4})
    with_clip_high = sorted(n for n in POLICY_LOSSES.names() if "clip_high" in POLICY_LOSSES.entry(n).options())
    assert {"cispo", "gspo", "ppo_clip"} <= set(with_clip_high)  # every loss with the option is named
    assert (f"use algo.policy_loss: {{name: gspo, clip_high: 0.0004}} (an option of {', '.join(with_clip_high)})"
            in _error(recipe=recipe))


def test_an_option_override_applies_to_a_part_named_by_a_string(tmp_path):
    recipe = _recipe(tmp_path, {"policy_loss": "ppo_clip", "advantage": "gae"})
    cfg = load_config(recipe, ["algo.policy_loss.clip_high=0.28", "algo.advantage.lam=0.9"])
    assert cfg.algo.policy_loss.settings.clip_high == 0.28 and cfg.algo.advantage.settings.lam == 0.9
    assert apply_overrides({"algo": {"policy_loss": "cispo"}}, ["algo.policy_loss.clip_low=1.0"]) == {
        "algo": {"policy_loss": {"name": "cispo", "clip_low": 1.0}}}
    # under a preset, and with no part named anywhere (the field's default part)
    assert load_config(None, ["algo.policy_loss.clip_high=0.3"]).algo.policy_loss.settings.clip_high == 0.3
    bare = config_from_dict(apply_overrides({}, ["algo.policy_loss.dual_clip=3"]))
    assert bare.algo.policy_loss == "ppo_clip" and bare.algo.policy_loss.settings.dual_clip == 3.0


def test_naming_another_part_replaces_the_old_one_with_its_options(tmp_path):
    other = load_config(None, ["preset=dapo", "algo.policy_loss=gspo"]).algo.policy_loss
    assert other.recipe_form() == {"name": "gspo", "clip_low": 0.2, "clip_high": 0.2}  # not dapo's 0.28
    same = load_config(None, ["preset=dapo", "algo.policy_loss=ppo_clip"]).algo.policy_loss
    assert same.settings.clip_high == 0.28  # the same part named again keeps its options
    recipe = _recipe(tmp_path, {"policy_loss": {"name": "cispo", "clip_low": 1.0}}, preset="dapo")
    assert load_config(recipe).algo.policy_loss.recipe_form() == {"name": "cispo", "clip_low": 1.0, "clip_high": 0.2}
    recipe = _recipe(tmp_path, {"policy_loss": {"clip_low": 0.1}}, preset="dapo")
    assert load_config(recipe).algo.policy_loss.recipe_form() == {**PPO_CLIP, "clip_low": 0.1, "clip_high": 0.28}
    recipe = _recipe(tmp_path, {"policy_loss": {"name": "ppo_clip", "clip_high": 0.3}})
    cfg = load_config(recipe, ["algo.policy_loss={name: reinforce, tis_cap: 2.0}"])
    assert cfg.algo.policy_loss.recipe_form() == {"name": "reinforce", "tis_cap": 2.0}
    # only the name key changed: the old options stay and one the new part lacks is an error naming it
    msg = _error("algo.policy_loss.name=reinforce", recipe=recipe)
    assert "algo.policy_loss.clip_high: unknown key, not an option of reinforce; allowed keys here: name, tis_cap" in msg


def test_bad_options_are_errors_naming_the_field():
    assert "algo.policy_loss.clip_high: Input should be greater than or equal to 0 (got -1)" in _error(
        "algo.policy_loss.clip_high=-1")
    assert "algo.advantage.scale_by_std: Input should be a valid boolean" in _error(
        "algo.advantage.scale_by_std=maybe")
    msg = _error("algo.advantage.lam=0.9")
    assert "algo.advantage.lam: unknown key, not an option of grpo; allowed keys here: name, gamma, adv_eps" in msg
    assert "algo.loss_agg.max_len_norm: unknown key; token_mean takes no options" in _error(
        "algo.loss_agg={name: token_mean, max_len_norm: 8}")
    assert "algo.policy_loss: must be a part's name or {name: NAME" in _error("algo.policy_loss=[1, 2]")
    assert "unknown policy loss 'nope'" in _error("algo.policy_loss={name: nope, clip_high: 0.3}")


def test_dump_roundtrip_with_options(tmp_path):
    cfg = load_config(None, ["preset=ppo", "algo.advantage.lam=0.9", "algo.policy_loss.dual_clip=3",
                             "algo.loss_agg={name: seq_mean_token_sum_norm, max_len_norm: 64}"])
    text = dump_config(cfg)
    algo = yaml.safe_load(text)["algo"]
    assert algo["advantage"] == {"name": "gae", "gamma": 1.0, "adv_eps": 1e-6, "scale_by_std": True, "lam": 0.9}
    assert algo["policy_loss"]["dual_clip"] == 3.0 and algo["loss_agg"]["max_len_norm"] == 64.0
    path = tmp_path / "config.yaml"
    path.write_text(text)
    again = load_config(path)
    assert again == cfg and again.algo.advantage.settings.lam == 0.9
    assert load_config(path, ["algo.advantage.lam=0.8"]) != cfg
    assert yaml.safe_load(dump_config(load_config(None, [])))["algo"]["loss_agg"] == "token_mean"


def test_a_part_choice_pickles_with_its_settings():
    part = AlgoConfig(policy_loss={"name": "gspo", "clip_high": 4e-4}).policy_loss
    copy = pickle.loads(pickle.dumps(part))
    assert copy == part and copy.settings.clip_high == 4e-4 and isinstance(copy, PartRef)


def test_algos_lists_each_parts_options_with_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    out = CliRunner().invoke(app, ["algos", "--full"]).output
    for shown in ("clip_low=0.2, clip_high=0.2, dual_clip=0", "gamma=1, adv_eps=1e-06, scale_by_std=True, lam=0.95",
                  "tis_cap=0", "max_len_norm=0", "ppo_clip (clip_high=0.28)"):
        assert shown in out, shown


def test_algos_prints_formulas_that_look_like_rich_markup(monkeypatch):
    """A formula with brackets (`[/ ...]` closes a Rich style, `[bold]` opens one) is printed as written."""
    from reinforge.algo.kl import KL_ESTIMATORS

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setitem(KL_ESTIMATORS._entries, "bracketed", dataclasses.replace(
        KL_ESTIMATORS.entry("k1"), name="bracketed", formula="E[ratio] [/i] [bold]x[/bold]", paper="[/paper]"))
    result = CliRunner().invoke(app, ["algos", "--full"])
    assert result.exit_code == 0, result.output
    assert "E[ratio] [/i] [bold]x[/bold]" in result.output and "[/paper]" in result.output


def test_compare_names_a_part_written_with_its_options():
    run = Run(Path("r"), {"algo": {"advantage": GRPO, "policy_loss": "ppo_clip"}}, [])
    assert group_key(run) == "grpo+ppo_clip" and group_key(run, "algo.advantage") == "grpo"
    assert group_key(run, "algo.advantage.scale_by_std") == "True"


def test_the_python_api_passes_a_part_with_its_options_as_one_value():
    from reinforge.api import _overrides

    overrides = _overrides(model=None, task=None, reward=None, preset="dapo", plugins=None,
                           algo={"policy_loss": {"name": "gspo", "clip_high": 0.3}, "kl": {"coef": 0.1}})
    assert overrides == ["preset=dapo", 'algo.policy_loss={"name": "gspo", "clip_high": 0.3}', "algo.kl.coef=0.1"]
    algo = load_config(None, overrides).algo
    assert algo.policy_loss.recipe_form() == {"name": "gspo", "clip_low": 0.2, "clip_high": 0.3} and algo.kl.coef == 0.1


# --- sections naming a part (loss terms, shapers, samplers, replay, budget): the same inline form ---------------


def test_a_part_section_takes_its_options_inline_beside_its_own_fields():
    algo = load_config(None, ["algo.loss_terms=[{name: kl_dads, coef: 0.1, estimator: k1}]"]).algo
    term = algo.loss_terms[0]
    assert (term.name, term.coef, term.settings().estimator) == ("kl_dads", 0.1, "k1")
    replay = load_config(None, ["rollout.replay=recent"]).rollout.replay
    assert replay.name == "recent" and replay.settings().capacity > 0  # a bare name: the options' defaults
    sampler = load_config(None, ["rollout.group_sampler={name: micro_groups, micro_group: 2}"]).rollout.group_sampler
    assert sampler.settings().micro_group == 2


def test_a_part_section_dumps_inline_and_loads_back_equal(tmp_path):
    cfg = load_config(None, ["preset=dapo", "algo.loss_terms=[{name: kl_dads, coef: 0.1, estimator: k1}]",
                             "rollout.replay={name: highest, capacity: 8, replays: 4, min_to_replay: 4}",
                             "rollout.budget={name: knapsack, min_per_prompt: 2}",
                             "reward.step_verifier={name: arithmetic_steps, coef: 0.2, wrong: -2.0}",
                             "task.sampler={name: spo, rho: 0.9}"])
    data = yaml.safe_load(dump_config(cfg))
    assert data["algo"]["loss_terms"][0] == {"name": "kl_dads", "estimator": "k1", "correct_threshold": 1.0,
                                             "sharpness": cfg.algo.loss_terms[0].settings().sharpness, "coef": 0.1}
    assert data["algo"]["reward_shapers"][0] == {"name": "overlong_penalty", "buffer": 0.2, "penalty": 1.0}
    assert data["rollout"]["replay"]["capacity"] == 8 and "params" not in data["rollout"]["replay"]
    assert data["reward"]["step_verifier"]["wrong"] == -2.0 and data["task"]["sampler"]["rho"] == 0.9
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again == cfg and again.rollout.replay.settings().capacity == 8
    assert load_config(path, ["rollout.replay.capacity=9"]) != cfg


def test_a_part_sections_option_errors_name_the_field_and_the_allowed_keys():
    msg = _error("algo.reward_shapers=[{name: overlong_penalty, buffr: 64}]")
    assert ("algo.reward_shapers.0.buffr: unknown key, not an option of overlong_penalty; allowed keys here: "
            "name, buffer, penalty") in msg
    assert "algo.loss_terms.0.phi_min: Input should be less than or equal to 1" in _error(
        "algo.loss_terms=[{name: rapo_kl, coef: 0.1, phi_min: 1.5}]")
    assert "allowed keys here: name, coef, phi_min" in _error("algo.loss_terms=[{name: rapo_kl, phi: 1}]")


def test_the_old_params_form_is_refused_with_the_inline_rewrite():
    msg = _error("algo.reward_shapers=[{name: overlong_penalty, params: {buffer: 64}}]")
    assert "algo.reward_shapers.0: params:" in msg and "write the options inline: {name: overlong_penalty, buffer: 64}" in msg
    assert "write the options inline: {name: ppo_clip, clip_high: 0.3}" in _error(
        "algo.policy_loss={name: ppo_clip, params: {clip_high: 0.3}}")


def test_an_option_named_like_a_section_field_is_an_error_naming_both(monkeypatch):
    from reinforge.algo.objective import LOSS_TERMS
    from reinforge.registry import Settings

    class CoefSettings(Settings):
        coef: float = 1.0

    assert all("coef" not in LOSS_TERMS.entry(n).options() for n in LOSS_TERMS.in_order())  # none shipped
    clash = dataclasses.replace(LOSS_TERMS.entry("rapo_kl"), name="clash", settings=CoefSettings)
    monkeypatch.setitem(LOSS_TERMS._entries, "clash", clash)
    msg = _error("algo.loss_terms=[{name: clash, coef: 0.5}]")
    assert "clash's option coef has the name of a field of the section (LossTermConfig.coef)" in msg


def test_a_part_section_named_by_a_string_takes_an_option_override():
    replay = load_config(None, ["rollout.replay=recent", "rollout.replay.capacity=32"]).rollout.replay
    assert replay.name == "recent" and replay.settings().capacity == 32


# --- environments and agent task sources: their keyword arguments inline too -----------------------------------


def test_an_environment_and_a_task_source_take_their_keyword_arguments_inline(tmp_path):
    cfg = load_config("agent_search", ["env.k=4", "task.hops=2"])
    assert cfg.env.params == {"k": 4, "max_tool_calls": 2} and cfg.task.params["hops"] == 2
    data = yaml.safe_load(dump_config(cfg))
    assert data["env"]["k"] == 4 and data["task"]["hops"] == 2 and "params" not in data["env"]
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg
    assert "env.max_guess: unknown key, not an option of guessing" in _error("env={name: guessing, max_guess: 3}",
                                                                           recipe="agent_guessing")
    assert "task.hi: not a field of task kind guessing; allowed keys here: kind, " in _error(
        "task.hi=3", recipe="agent_guessing")


def test_the_old_params_form_of_an_environment_or_task_source_is_refused():
    assert "write the options inline: {name: guessing, max_guesses: 6}" in _error(
        "env={name: guessing, params: {max_guesses: 6}}", recipe="agent_guessing")
    assert "write the options inline: {kind: guessing, high: 8}" in _error(
        "task={kind: guessing, params: {high: 8}}", recipe="agent_guessing")


def test_no_environment_or_task_source_takes_an_argument_named_like_a_section_field():
    from reinforge.config.run import EnvConfig
    from reinforge.config.task import AgentTaskConfig
    from reinforge.data.agent_tasks import AGENT_TASK_SOURCES
    from reinforge.envs.registry import ENVIRONMENTS

    for name in ENVIRONMENTS.in_order():
        assert not set(ENVIRONMENTS.get(name).params) & set(EnvConfig.model_fields), name
    for kind in AGENT_TASK_SOURCES:
        assert AgentTaskConfig.inline_options({"kind": kind}).allowed, kind
        assert not set(AgentTaskConfig.inline_options({"kind": kind}).allowed) & set(AgentTaskConfig.model_fields)


def test_naming_another_environment_drops_the_old_ones_arguments_and_keeps_the_limits():
    env = load_config("agent_calculator", ["env.name=agent", "env.agent=mod:fn"]).env
    assert env.name == "agent" and env.params == {} and env.max_turn_tokens == 64
