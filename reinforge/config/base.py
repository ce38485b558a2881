"""The config models' base: strict models, registered-name checks, and parts named with their settings."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_registered(kind: str, name: str) -> str:
    from reinforge.parts import all_kinds  # torch import, deferred until a config is built

    registry = all_kinds()[kind]
    if name not in registry:
        raise ValueError(f"unknown {registry.kind} {name!r}; allowed: {', '.join(registry.names())}")
    return name


class PartConfig(_Strict):
    """A registered part named in a recipe with its own settings: ``{name: ..., params: {...}}``; the
    params are validated by the part's declared settings model (``Registry.register(settings=...)``)."""

    KIND: ClassVar[str] = ""
    name: str
    params: dict[str, Any] = Field(default_factory=dict, description="the part's own settings")

    @model_validator(mode="after")
    def _registered_with_valid_settings(self) -> PartConfig:
        _check_registered(self.KIND, self.name)
        self.settings()  # fail now, naming the field
        return self

    def settings(self) -> Any:
        from reinforge.parts import all_kinds

        return all_kinds()[self.KIND].entry(self.name).make_settings(self.params, f"{self.KIND} {self.name} params")


class LossTermConfig(PartConfig):
    """An extra term of the loss: ``coef * agg(term)``, a registered loss term (reinforge algos)."""

    KIND: ClassVar[str] = "loss_term"
    coef: float = Field(1.0, description="the term's coefficient in the loss")


class TaskSamplerConfig(PartConfig):
    """Which training prompts each step draws (a registered task sampler)."""

    KIND: ClassVar[str] = "task_sampler"
    name: str = "uniform"


class GroupSamplerConfig(PartConfig):
    """How the completions of a prompt's group are produced (a registered group sampler)."""

    KIND: ClassVar[str] = "group_sampler"
    name: str = "independent"




class RewardShaperConfig(PartConfig):
    """A change to the rewards from rollout statistics (a registered reward shaper, e.g. DAPO's
    ``overlong_penalty`` and ``overlong_filter``)."""

    KIND: ClassVar[str] = "reward_shaper"
