"""The critic of PPO: a separate value model, V(s_t) for every token position.

Choice: a *separate* model (the policy architecture's trunk, initialised from the policy or from
``algo.critic.path``, plus a zero-initialised linear head), not a value head on the policy's
trunk. A shared trunk would save one forward/backward, but the value loss would then pull on
the policy's representation (the two losses need a mixing weight that interacts with the
learning rate), and the critic could not have its own optimizer settings or warm up while the
policy is frozen. InstructGPT, verl and OpenRLHF make the same choice; the cost is a second
trunk in memory and one more forward/backward per micro-batch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reinforge.algo.aggregation import AggNorm, token_mean
from reinforge.algo.value import clipped_value_loss
from reinforge.config import CriticConfig
from reinforge.errors import TrainingDiverged
from reinforge.learn.metric_sums import MetricSums
from reinforge.models.precision import at_least_float32
from reinforge.types import Batch


class ValueModel(nn.Module):
    """values[:, t] = w . h_{t-1} + b: the value of the state in which token t is chosen (column 0 is 0),
    aligned with the per-token log-probs of ``token_logprobs``."""

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.trunk = causal_lm.base_model
        self.config = causal_lm.config
        self.head = nn.Linear(causal_lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.head.to(device=next(self.trunk.parameters()).device, dtype=next(self.trunk.parameters()).dtype)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        values = at_least_float32(self.head(hidden[:, :-1]).squeeze(-1))
        return torch.cat([values.new_zeros(values.shape[0], 1), values], dim=1)


class Critic:
    """The value model and its own optimizer (AdamW, constant learning rate)."""

    def __init__(self, model: ValueModel, cfg: CriticConfig) -> None:
        self.model = model.train()
        self.cfg = cfg
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def backward(self, mb: Batch, norm: AggNorm, stats: MetricSums, value_clip: float, step: int) -> None:
        """Clipped value loss of micro-batch ``mb`` (token mean over the mini-batch: ``norm``), backward
        into the critic; its per-token statistics into ``stats`` as ``critic/*``."""
        assert mb.values is not None and mb.returns is not None
        values = self.model(mb.input_ids, mb.attention_mask)
        loss_t, metrics = clipped_value_loss(values, mb.values, mb.returns, value_clip)
        mask = value_mask(mb)
        loss = token_mean(loss_t, mask, norm)
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"step {step}: the value loss is {loss.item()} (non-finite)")
        loss.backward()
        stats.add_tokens("critic/value_loss", loss_t, mask)
        stats.add_tokens("critic/values", values, mask)
        for name, v in metrics.items():
            stats.add_tokens(f"critic/{name}", v, mask)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def value_mask(mb: Batch) -> Tensor:
    """The tokens with a value target: the loss mask's, less the rows whose generation continues in a later
    step (``Batch.continues``, T-PPO's truncated rollouts: no return is known yet; the paper trains the value
    model on finished responses only)."""
    if mb.continues is None:
        return mb.loss_mask
    return mb.loss_mask * (~mb.continues.to(torch.bool)).to(mb.loss_mask.dtype)[:, None]


def build_critic(policy_path: str, cfg: CriticConfig, dtype: str, device: str) -> Critic:
    from reinforge.models.loading import load_model

    return Critic(ValueModel(load_model(cfg.path or policy_path, dtype, device)), cfg)
