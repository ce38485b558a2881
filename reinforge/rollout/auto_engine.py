"""``rollout.engine: auto``: the faster engine for the model and the hardware at hand.

Chosen from the run's config (``EngineSpec.resolve``): the config checks read the choice
(``effective_engine``) and the run's resolved config (``resolve_config``), which its ``config.yaml``
records, names the engine that ran; the loaded config keeps ``auto``. The rule, from
``benchmarks/bench_engines.py`` on a 2-core CPU (docs/rollout.md):

- vLLM when it is installed and the model runs on CUDA, or when the model has at least
  ``VLLM_CROSSOVER_PARAMS`` parameters (on a CPU the torch engine was measured faster at every size
  up to 134.5M; above that nothing was measured);
- the torch engine otherwise.

The model's size is read from its ``config.json`` (the model built on the meta device: no weights
are loaded). vLLM counts as installed when ``import vllm`` would find the package.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from reinforge.errors import ConfigError
from reinforge.rollout.engines import register_engine

VLLM_CROSSOVER_PARAMS = 150_000_000
"""Parameters from which vLLM is taken on a CPU: above the largest model measured, at which the torch
engine still out-generated vLLM on 2 idle CPU cores (134.5M: 1.19x; 27.3M: 1.04x; tiny-base 2.4M:
3.3x; 2026-11-26, docs/rollout.md, benchmarks/BENCHMARKS.md). Larger models were not measured: there
vLLM is the peers' choice and is kept."""


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def parameter_count(model_path: str) -> int:
    """The number of parameters of the model at ``model_path`` (a directory or a shipped alias)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from reinforge.models.adapters import adapter_base_path, is_adapter_dir
    from reinforge.models.loading import _existing_model_dir

    directory = _existing_model_dir(model_path)
    if is_adapter_dir(directory):  # a LoRA checkpoint: the size of its base
        return parameter_count(str(adapter_base_path(directory)))
    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def choose_engine(device: str, params: int, vllm_available: bool) -> str:
    """The engine ``auto`` stands for (the rule of the module docstring)."""
    if not vllm_available:
        return "torch"
    if device.startswith("cuda") or params >= VLLM_CROSSOVER_PARAMS:
        return "vllm"
    return "torch"


def resolve_auto(cfg: Any) -> str:
    """``choose_engine`` for a run's config (its model and device)."""
    if not vllm_installed():  # no need to read the model
        return "torch"
    try:
        params = parameter_count(cfg.model.path)
    except Exception as e:  # noqa: BLE001 - any failure to read the size is reported with the field
        raise ConfigError(f"rollout.engine=auto: cannot read the size of model.path={cfg.model.path!r} ({e}); "
                          "name the engine instead (rollout.engine=torch or vllm)") from None
    return choose_engine(cfg.model.resolved_device(), params, True)


@register_engine("auto", description="the faster of torch and vllm for the model and hardware, chosen when the "
                 "run's config is resolved", replicable=True, resolve=resolve_auto)
class AutoEngine:
    """Never built: the resolved config (``resolve_config``) names the engine ``auto`` chooses."""

    @classmethod
    def from_config(cls, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError("rollout.engine=auto stands for another engine; build the run's engine from its "
                          "resolved config (orchestrate.components.resolve_config)")
