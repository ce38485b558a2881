"""Parts added from outside the package (docs/extending.md): every example of that page, as a plug-in
file named in a recipe's ``plugins:``, runs through a short training run and does what it says."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.run import train
from reinforge.registry import KINDS
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.track.jsonl import read_jsonl

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
SHORT = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=8",
         "eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0"]


def examples() -> dict[str, str]:
    """Example name -> its code, from the ``<!-- example: NAME -->`` blocks of docs/extending.md."""
    text = DOC.read_text()
    return dict(re.findall(r"<!-- example: (\w+) -->\n```python\n(.*?)```", text, flags=re.S))


@pytest.fixture(scope="module")
def plugin_files(tmp_path_factory):
    """Each example as a file (imported once per session); the parts they register are removed afterwards."""
    saved = {key: dict(registry._entries) for key, registry in KINDS.items()}
    modules = set(sys.modules)
    root = tmp_path_factory.mktemp("plugins")
    files = {}
    for name, code in examples().items():
        files[name] = root / f"{name}_plugin.py"
        files[name].write_text(code)
    yield files
    for key, registry in KINDS.items():
        registry._entries.clear()
        registry._entries.update(saved.get(key, {}))
    for name in set(sys.modules) - modules:
        if name.startswith("reinforge_user_"):
            del sys.modules[name]


def _spy(monkeypatch, registry, name: str) -> list[dict]:
    """Record every call of a registered part (its keyword arguments)."""
    entry, calls = registry.entry(name), []

    def spy(**kwargs):
        calls.append(kwargs)
        return entry.fn(**kwargs)

    monkeypatch.setitem(registry._entries, name, dataclasses.replace(entry, fn=spy))
    return calls


def _run(tmp_path, plugin: Path, *overrides: str, recipe: str | None = None):
    cfg = load_config(recipe, [f"output_dir={tmp_path}", f"plugins=[{plugin}]", *SHORT, *overrides])
    result = train(cfg)
    assert result.steps == 2
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["plugins"] == [str(plugin)]  # a resumed run imports it again
    return result, [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]


def test_the_page_has_every_kind_of_example_each_under_30_lines():
    found = examples()
    assert set(found) == {"advantage", "policy_loss", "loss_term", "task_sampler", "group_sampler", "environment",
                          "reward_shaper"}
    for name, code in found.items():
        lines = [line for line in code.splitlines() if line.strip()]
        assert len(lines) < 30, (name, len(lines))


@pytest.mark.slow
def test_advantage_estimator(tmp_path, plugin_files, monkeypatch):
    load_config(None, [f"plugins=[{plugin_files['advantage']}]"])  # registers it
    calls = _spy(monkeypatch, KINDS["advantage"], "centered_sign")
    _, steps = _run(tmp_path, plugin_files["advantage"], "algo.advantage=centered_sign")
    assert len(calls) == 2 and set(calls[0]) == {"rewards", "group_index", "mask", "cfg"}
    assert all(abs(m["adv/abs_mean"] - 1.0) < 1e-6 for m in steps)  # +-1 on every token (kept groups have spread)


@pytest.mark.slow
def test_policy_loss_reads_the_sampling_logprobs_and_lengths(tmp_path, plugin_files):
    _, steps = _run(tmp_path, plugin_files["policy_loss"], "algo.policy_loss=behaviour_weighted_pg")
    assert all(0.5 < m["train/behaviour_weight"] <= 2.0 for m in steps)  # ~1: the sampler is the policy


def test_a_plugin_part_takes_its_options_inline(plugin_files):
    plugin = f"plugins=[{plugin_files['policy_loss']}]"
    cfg = load_config(None, [plugin, "algo.policy_loss={name: behaviour_weighted_pg, cap: 1.5}"])
    assert cfg.algo.policy_loss == "behaviour_weighted_pg" and cfg.algo.policy_loss.settings.cap == 1.5
    assert load_config(None, [plugin, "algo.policy_loss=behaviour_weighted_pg"]).algo.policy_loss.settings.cap == 2.0
    with pytest.raises(ConfigError, match="algo.policy_loss.cap: Input should be greater than 0"):
        load_config(None, [plugin, "algo.policy_loss={name: behaviour_weighted_pg, cap: 0}"])
    with pytest.raises(ConfigError, match="algo.policy_loss.clip_high: unknown key"):
        load_config(None, [plugin, "algo.policy_loss={name: behaviour_weighted_pg, clip_high: 0.3}"])


@pytest.mark.slow
def test_extra_loss_term(tmp_path, plugin_files):
    _, steps = _run(tmp_path, plugin_files["loss_term"], "algo.loss_terms=[{name: nll_on_correct, coef: 0.1}]")
    assert all("train/nll_on_correct" in m for m in steps)
    assert any(m["train/nll_on_correct"] > 0 for m in steps)  # some completions were right
    assert all(m["train/loss"] != m["train/pg_loss"] for m in steps if m["train/nll_on_correct"] > 0)


def test_reward_shaper(tmp_path, plugin_files):
    result, _ = _run(tmp_path, plugin_files["reward_shaper"], "algo.reward_shapers=[{name: brevity, coef: 0.5}]",
                     "log.samples_per_step=100")
    samples = read_jsonl(result.run_dir / "samples.jsonl")
    # r in {0, 1} minus 0.5 * L / 8 with 1 <= L <= 8 generated tokens: a multiple of 1/16, never 0 or 1
    assert samples and all(s["reward"] not in (0.0, 1.0) and -0.5 <= s["reward"] < 1.0 for s in samples)
    assert all(abs(s["reward"] * 16 - round(s["reward"] * 16)) < 1e-9 for s in samples)


@pytest.mark.slow
def test_task_sampler_with_settings(tmp_path, plugin_files):
    with pytest.raises(ConfigError, match="k"):
        load_config(None, [f"plugins=[{plugin_files['task_sampler']}]", "task.sampler={name: first_k, k: x}"])
    result, _ = _run(tmp_path, plugin_files["task_sampler"], "task.sampler={name: first_k, k: 2}",
                     "log.samples_per_step=16")
    drawn = {s["task_id"] for s in read_jsonl(result.run_dir / "samples.jsonl")}
    assert len(drawn) == 2  # only the first 2 tasks, over and over


@pytest.mark.slow
def test_group_sampler(tmp_path, plugin_files, monkeypatch):
    ns: list[int] = []
    generate = TorchRolloutEngine.generate
    monkeypatch.setattr(TorchRolloutEngine, "generate", lambda self, reqs, params: (ns.append(params.n),
                                                                                     generate(self, reqs, params))[1])
    _, steps = _run(tmp_path, plugin_files["group_sampler"], "rollout.group_sampler={name: two_rounds}",
                    "eval.every=0")
    assert [n for n in ns if n > 1] == [2, 2, 2, 2]  # two rounds of G/2 = 2 per step
    assert all(m["batch/sequences"] % 4 == 0 for m in steps)  # whole groups of G = 4 completions


@pytest.mark.slow
def test_environment(tmp_path, plugin_files):
    _, steps = _run(tmp_path, plugin_files["environment"], "env.name=one_turn_chat", "model.path=tiny-agent",
                    "rollout.max_new_tokens=5")
    assert all(m["episode/turns_mean"] == 1.0 for m in steps)


def test_a_plugin_that_does_not_import_is_named(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"plugins.0: importing .*broken.py.* RuntimeError: boom"):
        load_config(None, [f"plugins=[{bad}]"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, [f"plugins=[{tmp_path / 'missing.py'}]"])
    with pytest.raises(ConfigError, match="unknown advantage estimator 'nope'"):
        load_config(None, ["algo.advantage=nope"])
    assert json.dumps(load_config(None, []).plugins) == "[]"


TURN_WEIGHTED_LOSS = '''
import torch
from reinforge.algo.policy_losses import POLICY_LOSSES


@POLICY_LOSSES.register("turn_weighted_pg", formula="L_t = -(A_t + r_t) ratio_t / (1 + turn_t)", paper="a test")
def turn_weighted_pg(logp, old_logp, advantages, token_rewards, turn_index, cfg):
    """Later turns weigh less; the per-token rewards (here -beta KL_t) add to the advantage."""
    weight = 1.0 / (1.0 + turn_index.clamp(min=0).to(logp.dtype))
    loss = -(advantages + token_rewards) * torch.exp(logp - old_logp) * weight
    return loss, {"turn_weight": weight, "token_reward": token_rewards}
'''


def _plugin_file(tmp_path_factory, name: str, code: str):
    """``code`` as one plug-in file for the module (a part registers once); the parts and batch field
    producers it registers are removed afterwards."""
    from reinforge.orchestrate import batch_fields

    saved = {key: dict(registry._entries) for key, registry in KINDS.items()}
    producers = list(batch_fields.PRODUCERS)
    plugin = tmp_path_factory.mktemp(name) / f"{name}.py"
    plugin.write_text(code)
    yield plugin
    for key, registry in KINDS.items():
        registry._entries.clear()
        registry._entries.update(saved.get(key, {}))
    batch_fields.PRODUCERS[:] = producers


@pytest.fixture(scope="module")
def turn_loss_plugin(tmp_path_factory):
    yield from _plugin_file(tmp_path_factory, "turn_loss", TURN_WEIGHTED_LOSS)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_policy_loss_reads_token_rewards_and_turn_index(tmp_path, mode, turn_loss_plugin):
    """Fields a loss declares reach it in both modes: ``token_rewards`` (the KL in the reward) and
    ``turn_index`` (two-turn retry episodes) are tensors, not None."""
    _, steps = _run(tmp_path, turn_loss_plugin, "algo.policy_loss=turn_weighted_pg", "env.name=retry", "env.max_turns=2",
                    "algo.kl.coef=0.05", "algo.kl.placement=reward", f"orchestrate.mode={mode}",
                    "rollout.max_new_tokens=6")
    assert all(m["train/token_reward"] <= 0 for m in steps)  # -beta KL_t
    assert any(m["train/token_reward"] < 0 for m in steps)
    assert all(m["train/turn_weight"] <= 1 for m in steps) and any(m["train/turn_weight"] < 1 for m in steps)


def test_a_misspelt_field_fails_at_config_load_naming_the_part(tmp_path):
    plugin = tmp_path / "misspelt.py"
    plugin.write_text("from reinforge.algo.advantage_estimators import ADVANTAGES\n\n\n"
                      "@ADVANTAGES.register('typo_adv', formula='A = r', paper='a test')\n"
                      "def typo_adv(rewardz, mask, cfg):\n    return rewardz[:, None] * mask\n")
    with pytest.raises(ConfigError, match=r"advantage estimator 'typo_adv': parameter 'rewardz' is not a field it can "
                                          r"read \(did you mean 'rewards'\?\)"):
        load_config(None, [f"plugins=[{plugin}]", "algo.advantage=typo_adv"])


NEW_FIELD = '''
import torch
from reinforge.algo.advantage_estimators import ADVANTAGES, group_mean_std
from reinforge.orchestrate.batch_fields import produces


@produces("completion_tokens")
def completion_tokens(kept, width, algo):
    """A new per-sequence field: the tokens the model generated."""
    return (torch.tensor([float(sum(t.loss_mask)) for t in kept]),)


@ADVANTAGES.register("brevity_grpo", formula="A_i = r_i - mean_g(r) - 0.01 len_i", paper="a test")
def brevity_grpo(rewards, group_index, mask, completion_tokens, cfg):
    mean, _, _ = group_mean_std(rewards, group_index)
    return (rewards.double() - mean - 0.01 * completion_tokens.double())[:, None] * mask
'''


@pytest.fixture(scope="module")
def new_field_plugin(tmp_path_factory):
    yield from _plugin_file(tmp_path_factory, "new_field", NEW_FIELD)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_new_field_from_a_plugin_producer_reaches_the_estimator_that_reads_it(tmp_path, mode, new_field_plugin,
                                                                                   monkeypatch):
    load_config(None, [f"plugins=[{new_field_plugin}]"])  # registers the producer and the estimator
    calls = _spy(monkeypatch, KINDS["advantage"], "brevity_grpo")
    _run(tmp_path, new_field_plugin, "algo.advantage=brevity_grpo", f"orchestrate.mode={mode}")
    assert len(calls) == 2
    for call in calls:
        assert torch.equal(call["completion_tokens"], call["mask"].sum(-1).float())  # one value a sequence
