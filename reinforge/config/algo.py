"""The algorithm: ``algo`` (estimator, loss, aggregation, KL, mismatch, critic, data-side pieces, loss terms)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from reinforge.config.base import LossTermConfig, RewardShaperConfig, _check_registered, _Strict


class KLConfig(_Strict):
    estimator: str = "k3"
    coef: float = Field(0.0, ge=0, description="initial KL coefficient; 0 disables the KL term (no reference model)")
    placement: Literal["loss", "reward"] = Field(
        "loss", description="'loss': coef * KL added to the loss; 'reward': -coef * KL per token added to the reward"
    )
    target: float = Field(0.0, ge=0, description="target KL of the adaptive controller (0 = fixed coefficient)")
    horizon: int = Field(10000, ge=1, description="adaptive controller horizon (Ziegler et al. 2019)")

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


class AlgoConfig(_Strict):
    advantage: str = "grpo"
    scale_by_std: bool = True
    adv_eps: float = Field(1e-6, gt=0)
    policy_loss: str = "ppo_clip"
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0)
    tis_cap: float = Field(0.0, ge=0, description="truncated importance-sampling cap C for policy_loss=reinforce (0 = off)")
    loss_agg: str = "token_mean"
    max_len_norm: float = Field(0.0, ge=0, description="L_max for seq_mean_token_sum_norm; 0 = rollout.max_new_tokens")
    dual_clip: float = Field(0.0, ge=0, description="PPO dual-clip constant c > 1 for A < 0 (0 = off)")
    gamma: float = Field(1.0, ge=0, le=1, description="discount of per-token rewards (gae, returns-to-go)")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    kl: KLConfig = Field(default_factory=KLConfig)
    entropy_coef: float = Field(0.0, description="entropy bonus coefficient (loss -= coef * entropy)")
    mismatch: MismatchConfig = Field(default_factory=MismatchConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
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

    @field_validator("advantage")
    @classmethod
    def _adv(cls, v: str) -> str:
        return _check_registered("advantage", v)

    @field_validator("policy_loss")
    @classmethod
    def _pl(cls, v: str) -> str:
        return _check_registered("policy_loss", v)

    @field_validator("loss_agg")
    @classmethod
    def _agg(cls, v: str) -> str:
        return _check_registered("loss_agg", v)

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip(cls, v: float) -> float:
        if 0 < v <= 1:
            raise ValueError("must be 0 (off) or a constant c > 1 (e.g. 3.0)")
        return v


