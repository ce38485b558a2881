"""The algorithm: ``algo`` (estimator, loss, aggregation, KL, mismatch, critic, data-side pieces, loss terms).

The estimator, policy loss and aggregation are part fields (``config.base.Part``): each part's own
options live in its settings model, next to the part, and are written inline in the recipe."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from reinforge.config.base import (
    LossTermConfig,
    Part,
    PartRef,
    RewardShaperConfig,
    _check_registered,
    _Strict,
)


class KLConfig(_Strict):
    estimator: str = "k3"
    coef: float = Field(0.0, ge=0, description="initial KL coefficient; 0 disables the KL term (no reference model)")
    placement: Literal["loss", "reward"] = Field(
        "loss", description="'loss': coef * KL added to the loss; 'reward': -coef * KL per token added to the reward"
    )
    target: float = Field(0.0, ge=0, description="target KL of the adaptive controller (0 = fixed coefficient)")
    horizon: int = Field(10000, ge=1, description="adaptive controller horizon (Ziegler et al. 2019)")
    measure: bool = Field(False, description="with coef 0: still load the reference and log train/kl_ref, the KL "
                          "from the start (the x axis of a reward over-optimisation curve); nothing is penalised")

    @field_validator("estimator")
    @classmethod
    def _registered(cls, v: str) -> str:
        return _check_registered("kl_estimator", v)


class MismatchConfig(_Strict):
    mode: str = Field(
        "none", description="rollout/training mismatch correction, a registered one (none, token_tis, seq_tis, "
        "token_mask, seq_mask, or a plug-in's); the statistics are reported in every mode"
    )
    cap: float = Field(2.0, gt=1, description="truncation cap C (TIS) or masking threshold (ratio outside [1/C, C])")

    @field_validator("mode")
    @classmethod
    def _registered(cls, v: str) -> str:
        return _check_registered("mismatch", v)


class CriticConfig(_Strict):
    path: str | None = Field(None, description="critic initialisation (HF model dir); default: the policy's weights")
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    value_clip: float = Field(0.2, ge=0, description="value-loss clipping range around the old values (0 = off)")
    warmup_steps: int = Field(0, ge=0, description="first N steps train only the critic (the policy is frozen)")


class TeacherConfig(_Strict):
    """The frozen teacher of a distillation term (``gkd``; docs/distillation.md)."""

    path: str | None = Field(None, description="the teacher model: an HF model directory, a shipped alias or a run "
                             "directory (its latest checkpoint); it must share the policy's tokenizer")


MOVED_OPTIONS = ("scale_by_std", "adv_eps", "gamma", "lam", "clip_low", "clip_high", "dual_clip", "tis_cap",
                 "max_len_norm")
"""Options that were flat ``algo`` keys and are now the settings of the part that reads them."""

MOVED_TO_SHAPERS = {"overlong_buffer": "{{name: overlong_penalty, buffer: {}}}",
                    "overlong_penalty": "{{name: overlong_penalty, penalty: {}}}",
                    "overlong_filter": "{{name: overlong_filter}}"}
"""DAPO's flat length-shaping keys, now reward shapers (``algo.reward_shapers``)."""


class Discount(NamedTuple):
    """The discount of the run's returns: gamma, and GAE's lambda."""

    gamma: float
    lam: float


class AlgoConfig(_Strict):
    """The algorithm. ``advantage``, ``policy_loss`` and ``loss_agg`` name registered parts, each with its
    own options inline: ``policy_loss: {name: ppo_clip, clip_high: 0.28}`` (or just ``ppo_clip``)."""

    advantage: Annotated[PartRef, Part("advantage")] = Field(
        "grpo", validate_default=True,
        description="advantage estimator: a name or {name: ..., <option>: ...} (reinforge algos lists the options)")
    policy_loss: Annotated[PartRef, Part("policy_loss")] = Field(
        "ppo_clip", validate_default=True,
        description="policy loss: a name or {name: ..., <option>: ...} (reinforge algos lists the options)")
    loss_agg: Annotated[PartRef, Part("loss_agg")] = Field(
        "token_mean", validate_default=True,
        description="loss aggregation: a name or {name: ..., <option>: ...} (reinforge algos lists the options)")
    mixing: Annotated[PartRef, Part("mixing")] = Field(
        "sum", validate_default=True,
        description="how the RL loss and the demonstration terms are weighed: sum, convex (a fixed mu), "
        "chord (CHORD's mu schedule); only runs with demonstrations are affected")
    kl: KLConfig = Field(default_factory=KLConfig)
    entropy_coef: float = Field(0.0, description="entropy bonus coefficient (loss -= coef * entropy)")
    mismatch: MismatchConfig = Field(default_factory=MismatchConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    skip_equal_reward_groups: bool = Field(True, description="drop groups whose rewards are all equal (zero advantage)")
    dynamic_sampling: bool = Field(
        False, description="DAPO: keep sampling prompts until the batch has prompts_per_step groups with reward spread"
    )
    dynamic_sampling_max_rounds: int = Field(4, ge=1, description="cap on rollout rounds per step (dynamic sampling)")
    reward_shapers: list[RewardShaperConfig] = Field(
        default_factory=list, description="reward shapers applied in order after scoring (e.g. DAPO's "
        "overlong_penalty, overlong_filter)"
    )
    loss_terms: list[LossTermConfig] = Field(
        default_factory=list, description="extra loss terms beyond the KL and entropy ones (e.g. a plug-in's)"
    )

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, data: Any) -> Any:
        """A moved option is an error saying where it lives now; ``{<option>: ...}`` without a name is
        the field's default part with that option."""
        if not isinstance(data, dict):
            return data
        errors = [_moved(data, k) for k in MOVED_OPTIONS if k in data]
        errors += [_moved_to_shapers(data, k) for k in MOVED_TO_SHAPERS if k in data]
        if errors:
            raise ValidationError.from_exception_data("AlgoConfig", errors)
        data = dict(data)
        for key in PART_FIELDS:
            if isinstance(data.get(key), dict) and "name" not in data[key]:
                data[key] = {"name": cls.model_fields[key].default, **data[key]}
        return data

    @model_validator(mode="after")
    def _teacher_is_used(self) -> AlgoConfig:
        """A part that reads a teacher's distributions needs ``teacher.path``, and a teacher needs such a part."""
        from reinforge.algo.objective import required_inputs

        reads = "teacher_logp_vocab" in required_inputs(self)
        if reads and self.teacher.path is None:
            raise ValueError("teacher.path: a loss term distills from a teacher (e.g. gkd); set algo.teacher.path")
        if self.teacher.path is not None and not reads:
            raise ValueError("teacher.path: no part of algo reads the teacher; add algo.loss_terms: "
                             "[{name: gkd, coef: 1.0}]")
        return self

    @model_validator(mode="after")
    def _ungrouped_keeps_every_group(self) -> AlgoConfig:
        """An estimator whose baseline is not its group's (it declares ``ungrouped``, e.g. SPO's tracked
        value) gives a group of equal rewards a signal: dropping such groups would drop them all at
        group size 1."""
        from reinforge.algo.objective import required_inputs

        if "ungrouped" in required_inputs(self) and (self.skip_equal_reward_groups or self.dynamic_sampling):
            raise ValueError(f"skip_equal_reward_groups / dynamic_sampling: advantage {self.advantage} does not "
                             "compare the samples of a group, equal-reward groups carry signal; set "
                             "algo.skip_equal_reward_groups: false and leave dynamic_sampling off")
        return self

    @property
    def discount(self) -> Discount:
        """gamma and lam of the advantage estimator's settings (the defaults where it declares none): the
        discount its returns use, which the multi-turn turn returns and the critic's targets share."""
        from reinforge.algo.advantage_estimators import GAESettings

        defaults = GAESettings.model_fields
        s = self.advantage.settings
        return Discount(float(getattr(s, "gamma", defaults["gamma"].default)),
                        float(getattr(s, "lam", defaults["lam"].default)))


PART_FIELDS = tuple(k for k, f in AlgoConfig.model_fields.items() if any(isinstance(m, Part) for m in f.metadata))


def _moved_to_shapers(data: dict[str, Any], key: str) -> dict[str, Any]:
    msg = f"moved: use algo.reward_shapers: [{MOVED_TO_SHAPERS[key].format(data[key])}] (docs/algorithms.md)"
    return {"type": PydanticCustomError("moved_option", "{msg}", {"msg": msg}), "loc": (key,), "input": data[key]}


def _moved(data: dict[str, Any], option: str) -> dict[str, Any]:
    """The error of a moved flat option: which part field takes it now, with the recipe's part if it is one
    that reads it, else the first registered that does."""
    from reinforge.parts import all_kinds

    for field in PART_FIELDS:
        registry = all_kinds()[field]
        takers = [e.name for e in registry.entries() if option in e.options()]
        if not takers:
            continue
        default = AlgoConfig.model_fields[field].default
        given = data.get(field, default)
        given = given.get("name") if isinstance(given, dict) else given
        first = next(n for n in registry.in_order() if n in takers)  # the earliest registered (built-in) one
        name = next(n for n in (given, default, first) if n in takers)
        value = str(data[option]).lower() if isinstance(data[option], bool) else data[option]
        msg = f"moved: use algo.{field}: {{name: {name}, {option}: {value}}} (an option of {', '.join(takers)})"
        return {"type": PydanticCustomError("moved_option", "{msg}", {"msg": msg}), "loc": (option,),
                "input": data[option]}
    raise AssertionError(f"no part takes {option}")
