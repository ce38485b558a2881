"""Supervised terms over demonstration rows (``Context.demo``): the objective aggregates a term that
needs ``demonstrations`` over the demonstration tokens only, with their own global denominators."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from reinforge.algo.objective import LOSS_TERMS


@LOSS_TERMS.register(
    "nll",
    formula="+ c * agg_demo(-log pi(y_t)), over the demonstrations' answer tokens",
    paper="maximum likelihood on demonstrations, the SFT stage of Ouyang et al. 2022, InstructGPT (arXiv:2203.02155)",
    needs=("demonstrations",),
)
def nll_term(logp: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Negative log-likelihood per token, -log pi(y_t): SFT alone (``reinforge sft``) or, with a
    coefficient, mixed into an RL objective (``demonstrations.mix: true``). Metric ``nll``: its mean
    over the demonstration tokens (exp of it is the demonstrations' perplexity)."""
    return -logp, {"nll": -logp.detach()}
