"""KL coefficient controllers: fixed, or adaptive towards a target KL (Ziegler et al. 2019)."""

from __future__ import annotations

from typing import Any


class KLController:
    """The coefficient beta of the KL penalty, fixed or adapted towards a target KL.

    ``target == 0``: fixed, ``value`` stays ``init_coef``. Otherwise the adaptive rule of Ziegler et
    al. 2019, "Fine-Tuning Language Models from Human Preferences" (arXiv:1909.08593), sec. 2.2:
    e_t = clip(KL_t / target - 1, -0.2, 0.2);  beta_{t+1} = beta_t * (1 + K_beta e_t), with
    K_beta = n_steps / horizon (n_steps: samples or steps the observed KL covers, ``horizon`` in the
    same unit). A KL above target raises beta, below target lowers it, by at most 20% per horizon.
    """

    def __init__(self, init_coef: float, target: float = 0.0, horizon: int = 10000) -> None:
        if init_coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {init_coef}")
        if target < 0:
            raise ValueError(f"KL target must be >= 0, got {target}")
        if target > 0 and horizon <= 0:
            raise ValueError(f"KL controller horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    @property
    def adaptive(self) -> bool:
        return self.target > 0

    def update(self, observed_kl: float, n_steps: int) -> None:
        """beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon); no-op if fixed."""
        if not self.adaptive:
            return
        error = min(max(float(observed_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
