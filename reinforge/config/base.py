"""The config models' base: strict models, registered-name checks, and parts named with their settings.

A part is written in one form everywhere: its name, or ``{name: NAME, <option>: value, ...}`` with its
options inline: ``Part`` fields (the value is a ``PartRef``) and ``PartConfig`` sections (which also
have fields of their own, such as a loss term's ``coef``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from reinforge.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_registered(kind: str, name: str) -> str:
    from reinforge.parts import all_kinds  # torch import, deferred until a config is built

    registry = all_kinds()[kind]
    try:
        registry.entry(name)  # a registry that takes references imports module:function here
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return name


class PartRef(str):
    """A registered part chosen in a recipe: its name (this string, so it compares equal to the name and
    indexes the registries like one) carrying the part's validated ``settings`` (None when it declares none)."""

    settings: Any

    def __new__(cls, name: str, settings: Any = None) -> PartRef:
        ref = super().__new__(cls, name)
        ref.settings = settings
        return ref

    @property
    def name(self) -> str:
        return str(self)

    def recipe_form(self) -> str | dict[str, Any]:
        """As a recipe writes it: ``{name: ..., <option>: value, ...}``, or the bare name for a part
        that declares no settings."""
        if self.settings is None:
            return self.name
        return {"name": self.name, **self.settings.model_dump(mode="json")}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PartRef):
            return self.name == other.name and self.settings == other.settings
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__

    def __reduce__(self) -> tuple[Any, ...]:
        return PartRef, (self.name, self.settings)


@dataclass(frozen=True)
class Part:
    """The annotation of a config field naming a registered part of ``kind`` (a ``registry.KINDS``
    key): a bare name (all its options at their defaults) or ``{name: ..., <option>: value, ...}``
    with the part's options inline, validated by its settings model (errors name
    ``<field>.<option>``). The field's value is a ``PartRef``; it dumps to the mapping form."""

    kind: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self.validate, serialization=core_schema.plain_serializer_function_ser_schema(PartRef.recipe_form),
            json_schema_input_schema=core_schema.union_schema([core_schema.str_schema(), core_schema.dict_schema()]),
        )

    def validate(self, value: Any) -> PartRef:
        if isinstance(value, PartRef):
            value = value.recipe_form()
        if isinstance(value, str):
            name, options = value, {}
        elif isinstance(value, Mapping) and isinstance(value.get("name"), str):
            name, options = value["name"], {k: v for k, v in value.items() if k != "name"}
        else:
            raise ValueError("must be a part's name or {name: NAME, <option>: value, ...}")
        _check_registered(self.kind, name)
        from reinforge.parts import all_kinds

        entry = all_kinds()[self.kind].entry(name)
        allowed = list(entry.options())
        refuse_params_key(value, name, allowed)
        unknown = [k for k in options if k not in allowed]
        if unknown:
            msg = (f"unknown key, not an option of {name}; allowed keys here: name, {', '.join(allowed)}" if allowed
                   else f"unknown key; {name} takes no options")
            raise ValidationError.from_exception_data("options", [
                {"type": PydanticCustomError("unknown_option", "{msg}", {"msg": msg}), "loc": (k,), "input": options[k]}
                for k in unknown])
        return PartRef(name, entry.settings.model_validate(options) if entry.settings is not None else None)


def _unknown_options(options: Mapping[str, Any], allowed: list[str], what: str) -> ValidationError:
    """The error for keys that are not ``what`` (``unknown key, not an option of NAME``), each at its own
    location."""
    msg = f"{what}; allowed keys here: {', '.join(allowed)}"
    return ValidationError.from_exception_data("options", [
        {"type": PydanticCustomError("unknown_option", "{msg}", {"msg": msg}), "loc": (k,), "input": v}
        for k, v in options.items()])


def inline_form(name: str, options: Mapping[str, Any], key: str = "name") -> str:
    """``{name: NAME, <option>: value, ...}`` as a recipe writes it (for error messages)."""
    return "{" + ", ".join([f"{key}: {name}", *(f"{k}: {_flow(v)}" for k, v in options.items())]) + "}"


def _flow(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def refuse_params_key(data: Mapping[str, Any], name: str, options: Collection[str], key: str = "name") -> None:
    """The old ``{name, params: {...}}`` form, refused with its inline rewrite."""
    if "params" in data and "params" not in options:
        given = data["params"] if isinstance(data["params"], Mapping) else {}
        raise ValueError(f"params: {{{key}, params: {{...}}}} is no longer a form; write the options inline: "
                         f"{inline_form(name, given, key)}")


@dataclass(frozen=True)
class InlineOptions:
    """What a section names (``key: name``, e.g. ``name: kl_dads``), the options it takes (``allowed``),
    ``make``, which validates them into the value the section keeps, and what an unknown key is told."""

    key: str
    name: str
    allowed: list[str]
    make: Callable[[dict[str, Any]], Any] = dict
    unknown: str = ""

    def unknown_key(self) -> str:
        return self.unknown or f"unknown key, not an option of {self.name}"


class InlineSection(_Strict):
    """A section naming a part (or a factory) whose options are written inline beside the section's own
    fields: keys that are the section's fields go to them, every other key is an option, checked
    against ``inline_options``; an option named like a section field is an error, and so is the old
    ``params:`` key. The section dumps to the same form, and a dumped section loads back equal."""

    _options: Any = PrivateAttr(None)

    @classmethod
    def inline_options(cls, data: Mapping[str, Any]) -> InlineOptions | None:
        """The options ``data`` may carry (None when what it names is missing: pydantic reports that)."""
        raise NotImplementedError

    @model_validator(mode="wrap")
    @classmethod
    def _inline(cls, data: Any, handler: ModelWrapValidatorHandler[InlineSection]) -> InlineSection:
        if isinstance(data, str) and "name" in cls.model_fields:
            data = {"name": data}
        spec = cls.inline_options(data) if isinstance(data, Mapping) else None
        if spec is None:
            return handler(data)
        refuse_params_key(data, spec.name, spec.allowed, spec.key)
        clash = [k for k in spec.allowed if k in cls.model_fields]
        if clash:
            raise ValueError(f"{spec.name}'s option {', '.join(clash)} has the name of a field of the section "
                             f"({cls.__name__}.{clash[0]}): rename the option")
        options = {k: v for k, v in data.items() if k not in cls.model_fields}
        unknown = {k: v for k, v in options.items() if k not in spec.allowed}
        if unknown:
            raise _unknown_options(unknown, [*cls.model_fields, *spec.allowed], spec.unknown_key())
        model = handler({k: v for k, v in data.items() if k in cls.model_fields})
        model._options = spec.make(options)
        return model

    def _options_dump(self, mode: str = "python") -> dict[str, Any]:
        if isinstance(self._options, BaseModel):
            return self._options.model_dump(mode=mode)
        return dict(self._options or {})

    @model_serializer(mode="wrap")
    def _dump_inline(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        own = handler(self)
        first = next(iter(own), None)  # the key naming the part (name, kind) stays first
        head = {first: own.pop(first)} if first is not None else {}
        return {**head, **self._options_dump(info.mode), **own}

    def __repr_args__(self) -> Any:
        yield from super().__repr_args__()
        yield from self._options_dump().items()


class PartConfig(InlineSection):
    """A registered part named in a recipe with its own section fields (``coef``, ...): a bare name, or
    ``{name: ..., <option>: value, ..., <section field>: value}``. Every key not a section field is an
    option of the part, validated by its settings model (``Registry.register(settings=...)``); errors
    name ``<field>.<option>``. ``settings()`` is the validated settings object."""

    KIND: ClassVar[str] = ""
    name: str

    @classmethod
    def inline_options(cls, data: Mapping[str, Any]) -> InlineOptions | None:
        default = cls.model_fields["name"].default
        name = data.get("name", default if isinstance(default, str) else None)
        if not isinstance(name, str):
            return None
        _check_registered(cls.KIND, name)
        from reinforge.parts import all_kinds

        entry = all_kinds()[cls.KIND].entry(name)
        settings = entry.settings
        return InlineOptions("name", name, list(entry.options()),
                             lambda options: settings.model_validate(options) if settings is not None else None)

    def settings(self) -> Any:
        """The part's validated settings (None for a part that declares none)."""
        return self._options


class StepVerifierConfig(PartConfig):
    """A step verifier (process rewards, rewards/steps.py): ``coef * score`` on the token ending each step."""

    KIND: ClassVar[str] = "step_verifier"
    coef: float = Field(0.1, description="weight of the step scores against the outcome reward")


class StepShaperConfig(PartConfig):
    """A step-reward shaper (rewards/step_shaping.py) applied to each completion's step scores."""

    KIND: ClassVar[str] = "step_shaper"


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
