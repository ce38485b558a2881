"""Step-reward shaping: the process rewards of one completion refined so that their sum is bounded, before
they become per-token rewards (``reward.step_shaping``, applied by ``rewards.steps.StepRewards``).

Gao et al. 2024, On Designing Effective RL Reward at Training Time for LLM Reasoning (arXiv:2410.15115): a
policy trained on summed process rewards learns to repeat correct but needless steps, each one paid for.
Both refinements bound the return of any completion, whatever its number of steps. With s_1..s_K the
completion's step scores:

- ``clip``: s'_k = min(s_k - eta, 0): no step earns a positive reward, so an extra step never helps;
- ``delta``: s'_k = s_k - s_{k+1} (k < K), s'_K = s_K: the sum telescopes to s_1;
- ``clip_delta``: ``clip``, then ``delta``.

Registered in ``STEP_SHAPERS`` (kind ``step_shaper``); a shaper maps the list of scores to a list of the
same length (``shape_steps``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import Field

from reinforge.registry import Registry, Settings, kind

StepShaper = Callable[..., list[float]]
STEP_SHAPERS: Registry[StepShaper] = kind("step_shaper", Registry("step-reward shaper",
                                                                 inputs=frozenset({"scores", "cfg"})))
PAPER = ("Gao et al. 2024, On Designing Effective RL Reward at Training Time for LLM Reasoning "
         "(arXiv:2410.15115), section 5 (Clip and Delta)")


class ClipSettings(Settings):
    eta: float = Field(1.0, description="eta: a step's score above it is cut to 0 and the rest shifted down by "
                       "it (the top score of the step verifier makes every step reward <= 0)")


def clipped(scores: Sequence[float], eta: float) -> list[float]:
    """min(s_k - eta, 0) for each step."""
    return [min(s - eta, 0.0) for s in scores]


def delta(scores: Sequence[float]) -> list[float]:
    """s_k - s_{k+1} for every step but the last, which keeps s_K: sum_k s'_k = s_1."""
    return [s - nxt for s, nxt in zip(scores, scores[1:], strict=False)] + list(scores[-1:])


@STEP_SHAPERS.register("clip", formula="s'_k = min(s_k - eta, 0)", paper=PAPER, settings=ClipSettings)
def clip_steps(scores: Sequence[float], cfg: ClipSettings) -> list[float]:
    """The Clip mechanism: every step reward at most 0, a step scoring below eta penalised by the gap."""
    return clipped(scores, cfg.eta)


@STEP_SHAPERS.register("delta", formula="s'_k = s_k - s_{k+1} for k < K, s'_K = s_K (the sum is s_1)", paper=PAPER)
def delta_steps(scores: Sequence[float]) -> list[float]:
    """The Delta mechanism: each step rewarded by how much better it scores than the next one."""
    return delta(scores)


@STEP_SHAPERS.register("clip_delta", formula="s'_k = Delta(Clip(s))_k: min(s_k - eta, 0) - min(s_{k+1} - eta, 0), "
                       "the last step min(s_K - eta, 0)", paper=PAPER, settings=ClipSettings)
def clip_delta_steps(scores: Sequence[float], cfg: ClipSettings) -> list[float]:
    """Clip, then Delta."""
    return delta(clipped(scores, cfg.eta))


def shape_steps(name: str, settings: object, scores: Sequence[float]) -> list[float]:
    """The scores after the registered shaper ``name`` (empty stays empty)."""
    return STEP_SHAPERS.call(name, None, settings, scores=list(scores)) if scores else []
