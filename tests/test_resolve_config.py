"""Loading a config only checks it; ``resolve_config`` fills in what depends on other sections or on the
environment (``rollout.engine=auto``, torchrun's world size) on a copy, and the run's ``config.yaml``
records the resolved config."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.learn import distributed
from reinforge.orchestrate import run
from reinforge.orchestrate.components import resolve_config
from reinforge.rollout import auto_engine


def _recorded_config(monkeypatch, tmp_path: Path, overrides: list[str]) -> str:
    """The ``config.yaml`` that ``train`` writes for ``overrides`` (nothing built, no step run)."""
    monkeypatch.setattr(run, "build_components", lambda cfg: types.SimpleNamespace(cfg=cfg))
    monkeypatch.setattr(run, "Loop", lambda *args: types.SimpleNamespace(run=lambda: None))
    run.train(load_config(None, [f"output_dir={tmp_path}", "name=run", *overrides]))
    return (tmp_path / "run" / "config.yaml").read_text()


def test_auto_engine_stays_in_the_loaded_config_and_the_run_records_the_choice(monkeypatch, tmp_path):
    monkeypatch.setattr(auto_engine, "vllm_installed", lambda: False)
    loaded = load_config(None, ["rollout.engine=auto"])
    assert loaded.rollout.engine == "auto"
    assert resolve_config(loaded).rollout.engine == "torch"
    assert loaded.rollout.engine == "auto"  # a copy: the loaded config is not changed
    assert "engine: torch" in _recorded_config(monkeypatch, tmp_path, ["rollout.engine=auto"])


def test_eval_builds_the_engine_auto_chooses(monkeypatch):
    from reinforge.eval.cli_eval import build_eval_engine
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    monkeypatch.setattr(auto_engine, "vllm_installed", lambda: False)
    assert isinstance(build_eval_engine("tiny-base", 0, engine="auto"), TorchRolloutEngine)


def test_torchrun_world_size_is_resolved_and_init_only_checks_it(monkeypatch, tmp_path):
    """Under torchrun (its variables set, no process group started) the resolved config takes its
    world size; ``init`` compares and assigns nothing; config.yaml records torchrun's size."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setattr(distributed, "_init_group", lambda cfg: None)
    loaded = load_config(None, ["rollout.prompts_per_step=4"])
    resolved = resolve_config(loaded)
    assert (loaded.train.world_size, resolved.train.world_size) == (1, 2)
    assert resolve_config(resolved).train.world_size == 2
    assert distributed.init(resolved) and resolved.train.world_size == 2
    with pytest.raises(ConfigError, match="train.world_size=1, but torchrun started 2 processes"):
        distributed.init(loaded)
    assert loaded.train.world_size == 1
    with pytest.raises(ConfigError, match="train.world_size=3, but torchrun started 2 processes"):
        resolve_config(load_config(None, ["train.world_size=3", "rollout.prompts_per_step=4"]))
    assert "world_size: 2" in _recorded_config(monkeypatch, tmp_path, ["rollout.prompts_per_step=4"])


def test_a_fresh_process_resolves_an_unpickled_config(tmp_path):
    """A spawned rank resolves its (unpickled, unvalidated) config before building anything: the
    engine's entry is found though nothing registered it in that process yet."""
    import pickle
    import subprocess
    import sys

    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps(load_config(None, ["rollout.engine=vllm"])))
    code = ("import pickle, sys; from reinforge.orchestrate.run import resolve_config; "
            "print(resolve_config(pickle.loads(open(sys.argv[1], 'rb').read())).rollout.engine)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cfg.pkl")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["vllm"]


def test_auto_device_is_the_gpu_when_present_else_the_cpu_and_the_run_records_it(monkeypatch, tmp_path):
    """``model.device=auto`` loads as written; ``resolve_config`` picks cuda when torch sees a GPU, else cpu;
    the run's ``config.yaml`` records the device it ran on; a bad device is refused at load."""
    import torch

    loaded = load_config(None, ["model.device=auto"])
    assert loaded.model.device == "auto"
    assert resolve_config(loaded).model.device == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_config(loaded).model.device == "cuda" and loaded.model.device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_config(loaded).model.device == "cpu"
    assert "device: cpu" in _recorded_config(monkeypatch, tmp_path, ["model.device=auto"])
    with pytest.raises(ConfigError, match="model.device"):
        load_config(None, ["model.device=gpu0"])


def test_building_from_an_unresolved_auto_device_names_the_fix():
    from reinforge.orchestrate.components import build_components

    with pytest.raises(ConfigError, match=r"resolve_config"):
        build_components(load_config(None, ["model.device=auto"]))
