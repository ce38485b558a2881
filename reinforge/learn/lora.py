"""LoRA adapters on the policy, via ``peft`` (docs/lora.md).

The policy is the base model with low-rank adapters on ``model.lora.target_modules``: a target
linear layer computes ``W x + (alpha / r) * B A x`` with W frozen and only A, B trained, so the
optimizer sees the adapter parameters alone.

- Reference policy (KL): the same model under ``peft``'s ``disable_adapter()``: the base, with
  no second copy of the weights.
- Rollout engine: gets merged weights ``W + (alpha / r) * B @ A`` under the plain HF parameter
  names (``merged_weights``), computed per layer on access without modifying the training
  model; or, with ``model.lora.sync=adapter``, the adapter tensors alone (``adapter_weights``),
  which the torch engine applies unmerged.
- Checkpoints: the adapter alone (``adapter_config.json`` + ``adapter_model.safetensors``, the
  peft format), restored exactly by ``restore_adapter``; ``models.adapters.merge_adapter`` turns
  such a directory into a plain HF model (eval, serve, ``reinforge export``).

QLoRA-ready: a base loaded quantized (bitsandbytes 4/8-bit, on CUDA) goes through
``get_peft_model`` unchanged, and ``merged_weights`` dequantizes the base weight before adding
the update. Loading a quantized base is not wired into the config: on CPU nothing is quantized.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from reinforge.config import LoraConfig
from reinforge.errors import ConfigError
from reinforge.models.adapters import ADAPTER_NAME, ADAPTER_WEIGHTS, quiet_peft
from reinforge.models.lean_lora import AdapterWeights


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora.enabled=true needs peft: pip install peft") from None
    return peft


def is_lora_model(model: object) -> bool:
    """True for a peft-wrapped model (without importing peft when nothing has)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def _matches(module_name: str, target: str) -> bool:
    return module_name == target or module_name.endswith("." + target)


def check_targets(model: nn.Module, targets: list[str]) -> None:
    """Every name of ``targets`` must match a module of ``model`` (else a ConfigError naming its linear layers)."""
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(_matches(n, t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(f"model.lora.target_modules: {missing} match no module of the model; its linear "
                          f"layers are: {', '.join(linear)}")


def peft_config(cfg: LoraConfig, model: nn.Module | None = None):  # type: ignore[no-untyped-def]
    """peft's ``LoraConfig`` for ``model.lora`` (on ``model``: ``lora_targets`` names the modules)."""
    return _peft().LoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias=cfg.bias, task_type="CAUSAL_LM",
        target_modules=lora_targets(model, cfg) if model is not None else list(cfg.target_modules),
    )


def lora_targets(model: nn.Module, cfg: LoraConfig) -> list[str]:
    """The modules that get adapters. A text model: ``cfg.target_modules`` (name suffixes). A vision-language model
    (its config has a ``vision_config``): the full names of the language model's modules they match (a CLIP or
    SigLIP tower's q_proj stays frozen); with ``vision_tower: lora`` also every linear layer of the vision tower
    and projector (all but the language model and the LM head)."""
    if getattr(model.config, "vision_config", None) is None:
        if cfg.vision_tower != "frozen":
            raise ConfigError("model.lora.vision_tower: the model has no vision tower (it is a text model); leave "
                              "it frozen")
        return list(cfg.target_modules)
    language = model.get_decoder()
    prefix = next(name for name, m in model.named_modules() if m is language) + "."
    names = [n for n, _ in model.named_modules() if n.startswith(prefix)]
    missing = [t for t in cfg.target_modules if not any(_matches(n, t) for n in names)]
    if missing:
        raise ConfigError(f"model.lora.target_modules: {missing} match no module of the language model "
                          f"({prefix[:-1]}); the vision tower takes adapters with model.lora.vision_tower=lora")
    targets = [n for n in names if any(_matches(n, t) for t in cfg.target_modules)]
    if cfg.vision_tower == "lora":
        head = model.get_output_embeddings()
        # on a model peft wrapped already (a second adapter): its layers' base names, none of its adapters
        targets += [n.removesuffix(".base_layer") for n, m in model.named_modules()
                    if isinstance(m, nn.Linear) and not n.startswith(prefix) and m is not head and ".lora_" not in n]
    return targets


def wrap_lora(model: nn.Module, cfg: LoraConfig, base_path: str | None = None, seed: int = 0,
              adapter_name: str = ADAPTER_NAME) -> nn.Module:
    """``model`` with LoRA adapters on ``cfg.target_modules`` (``lora_targets``: a vision-language model's vision
    tower frozen unless ``cfg.vision_tower`` is lora); only the adapters (and the biases ``cfg.bias`` names) train.
    Modifies ``model`` in place (peft injects the adapter layers).

    The adapters' initialisation (A random, B = 0: the wrapped model starts equal to the base)
    depends on ``seed`` alone, not on the global RNG, which it leaves untouched. ``base_path``
    is recorded in the adapter config, so a saved adapter knows its base (``models.adapters.merge_adapter``).
    """
    peft = _peft()
    check_targets(model, list(cfg.target_modules))
    with torch.random.fork_rng(devices=[]), quiet_peft():
        torch.manual_seed(seed)
        wrapped = peft.get_peft_model(model, peft_config(cfg, model), adapter_name=adapter_name)
    if base_path is not None:
        wrapped.peft_config[adapter_name].base_model_name_or_path = _portable_base_path(base_path)
    return wrapped


def _portable_base_path(path: str) -> str:
    """A shipped alias as is (found wherever the package is installed), any other path absolute."""
    from reinforge.assets import SHIPPED_MODELS

    return path if path in SHIPPED_MODELS else str(Path(path).expanduser().resolve())


# ---------------------------------------------------------------------- merged weights
@torch.no_grad()
def merged_weight(module: nn.Module) -> Tensor:
    """The weight a LoRA layer acts with: W + sum over active adapters of (alpha / r) * B @ A.

    The same arithmetic as peft's ``merge`` (``get_delta_weight``), out of place: the layer is
    not modified. A quantized base weight is dequantized first (QLoRA)."""
    from peft.utils.integrations import dequantize_module_weight

    weight = dequantize_module_weight(module.get_base_layer()).detach()
    if module.merged or module.disable_adapters:  # merged in place: W already holds the update
        return weight
    for name in module.active_adapters:
        if name in getattr(module, "lora_variant", {}):  # DoRA and other variants do not merge additively
            raise NotImplementedError(f"merged weights of a {type(module.lora_variant[name]).__name__} adapter")
        if name in module.lora_A or name in getattr(module, "lora_embedding_A", {}):
            weight = torch.add(weight, module.get_delta_weight(name)).to(weight.dtype)
    return weight


class MergedWeights(Mapping[str, Tensor]):
    """The policy's weights under a plain HF model's parameter names, each adapted weight merged
    (``merged_weight``) when it is read; the other parameters are the model's own tensors.

    A rollout engine's ``update_weights`` takes this like a state dict, so at most one merged
    matrix exists at a time beside the engine's copy."""

    def __init__(self, model: nn.Module) -> None:
        from peft.tuners.lora import LoraLayer

        base = model.get_base_model()
        lora_layers = {name for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        self._entries: dict[str, tuple[Tensor, nn.Module | None]] = {}
        for name, param in base.named_parameters():
            owner, _, leaf = name.rpartition(".base_layer.")
            if owner in lora_layers:  # a parameter of the frozen layer inside a LoRA layer
                self._entries[f"{owner}.{leaf}"] = (param, base.get_submodule(owner) if leaf == "weight" else None)
            elif not any(name.startswith(layer + ".") for layer in lora_layers):  # not an adapter parameter
                self._entries[name] = (param, None)

    def __getitem__(self, name: str) -> Tensor:
        param, module = self._entries[name]
        return merged_weight(module) if module is not None else param.detach()

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def merged_weights(model: nn.Module) -> Mapping[str, Tensor]:
    """What a rollout engine should receive from ``model``: merged weights for a LoRA policy,
    the model's own parameters otherwise."""
    return MergedWeights(model) if is_lora_model(model) else dict(model.named_parameters())


def adapter_weights(model: nn.Module, adapter_name: str = ADAPTER_NAME) -> AdapterWeights:
    """Adapter ``adapter_name`` of the peft ``model`` as an engine receives it in adapter-only sync
    (``model.lora.sync=adapter``): per adapted layer, under its plain HF module name, A [r, in],
    B [out, r] and the scale alpha / r. The tensors are the model's own (detached, not copied)."""
    from peft.tuners.lora import LoraLayer

    modules = {}
    for name, module in model.get_base_model().named_modules():
        if isinstance(module, LoraLayer) and adapter_name in module.lora_A:
            if adapter_name in getattr(module, "lora_variant", {}):
                raise NotImplementedError(f"adapter-only sync of a {type(module.lora_variant[adapter_name]).__name__}")
            modules[name] = (module.lora_A[adapter_name].weight.detach(), module.lora_B[adapter_name].weight.detach(),
                             float(module.scaling[adapter_name]))
    if not modules:
        raise KeyError(f"the model has no LoRA adapter {adapter_name!r}")
    return AdapterWeights(modules)


# ---------------------------------------------------------------------- adapter files
def save_adapter(model: nn.Module, directory: Path, adapter_name: str = ADAPTER_NAME) -> None:
    """The adapter alone, in peft's format (``PeftModel.from_pretrained`` reads it)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    # save_embedding_layers=False: reinforge never resizes the vocabulary, and "auto" would look
    # the base model up on the Hub
    state = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(directory / ADAPTER_WEIGHTS))
    model.peft_config[adapter_name].save_pretrained(str(directory))


@torch.no_grad()
def restore_adapter(model: nn.Module, directory: Path, adapter_name: str = ADAPTER_NAME) -> None:
    """Load a saved adapter into the LoRA policy ``model`` (its adapter ``adapter_name``) exactly (every
    adapter tensor must be there)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(directory) / ADAPTER_WEIGHTS), device=str(next(model.parameters()).device))
    expected = set(get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False))
    if set(state) != expected:
        raise ConfigError(f"{directory}: the saved adapter does not fit model.lora (missing "
                          f"{sorted(expected - set(state))[:3]}, unexpected {sorted(set(state) - expected)[:3]})")
    result = set_peft_model_state_dict(model, state, adapter_name=adapter_name)
    if result.unexpected_keys:
        raise ConfigError(f"{directory}: adapter tensors the model has no place for: {result.unexpected_keys[:3]}")
