"""Rollout engines as registered parts: declarations the config checks read, and a plug-in engine
that trains."""

from __future__ import annotations

import pytest

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.parts import all_kinds
from reinforge.registry import KINDS
from reinforge.rollout.engines import ROLLOUT_ENGINES, engine_spec, register_engine
from reinforge.rollout.torch_engine import TorchRolloutEngine

SHORT = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=8",
         "eval.final_samples=0", "log.report=false", "train.time_limit_s=0", "checkpoint.every=0"]


@pytest.fixture()
def plugin_engines():
    """Two engines registered for the test only: one replicable, one that is not and needs a server."""
    saved = dict(ROLLOUT_ENGINES._entries)

    @register_engine("counting", description="the torch engine, counting its generate calls", replicable=True)
    class CountingEngine(TorchRolloutEngine):
        calls = 0

        def generate(self, requests, params, *args, **kwargs):
            type(self).calls += 1
            return super().generate(requests, params, *args, **kwargs)

    @register_engine("single_server", description="a stand-in for a server engine", replicable=False,
                     needs_server=True)
    class SingleServer(TorchRolloutEngine):
        pass

    yield CountingEngine
    ROLLOUT_ENGINES._entries.clear()
    ROLLOUT_ENGINES._entries.update(saved)


def test_built_in_engines_declare_what_the_checks_read():
    all_kinds()  # every built-in part registered
    assert KINDS["engine"] is ROLLOUT_ENGINES and set(ROLLOUT_ENGINES.names()) >= {"torch", "openai"}
    torch_spec, openai_spec = engine_spec("torch"), engine_spec("openai")
    assert (torch_spec.replicable, torch_spec.needs_server) == (True, False)
    assert (openai_spec.replicable, openai_spec.needs_server) == (False, True)
    with pytest.raises(ConfigError, match=r"rollout.engine: unknown rollout engine 'vllmx'; allowed: .*openai.*torch"):
        load_config(None, ["rollout.engine=vllmx"])


def test_the_checks_follow_the_declarations_not_the_names(plugin_engines):
    with pytest.raises(ConfigError, match="rollout.engine=single_server needs rollout.server_url"):
        load_config(None, ["rollout.engine=single_server"])
    with_url = ["rollout.engine=single_server", "rollout.server_url=http://x/v1"]
    assert load_config(None, with_url).rollout.engine == "single_server"
    with pytest.raises(ConfigError, match="rollout.engine=single_server is not replicable"):
        load_config(None, [*with_url, "orchestrate.mode=async"])
    with pytest.raises(ConfigError, match="train.world_size > 1 runs one rollout engine per rank"):
        load_config(None, [*with_url, "train.world_size=2"])
    assert load_config(None, ["rollout.engine=counting", "orchestrate.mode=async"]).rollout.engine == "counting"


def test_a_plugin_engine_generates_a_training_run(tmp_path, plugin_engines):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    result = train(load_config(None, [f"output_dir={tmp_path}", *SHORT, "rollout.engine=counting"]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2 and all(m["batch/sequences"] >= 0 for m in rows)
    assert plugin_engines.calls >= 2  # every step's rollout (and the evaluations) went through it
