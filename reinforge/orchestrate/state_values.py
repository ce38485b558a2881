"""Monte Carlo values of intermediate states, for a part that declares the need ``state_values``
(VinePPO's estimator, algo/vineppo.py; Kazemnejad et al. 2024, arXiv:2410.01679).

After a step's rollout (``LocalBatches``: every round drawn, replayed samples mixed in), each kept
completion is cut into steps: its cut points are the first generated token (the prompt's state) and
the first token after the end of each step, at most ``max_cuts`` of them after the first (the rest of
the completion is one step). A step ends with a line (``step_split: newline``: a line of only
whitespace joins the next one), every ``step_tokens`` tokens (``step_split: tokens``), or at every
``cut_interval``-th token sampled with probability below ``prob_threshold`` (``step_split: low_prob``,
Segment Policy Optimization's cutpoint partition, arXiv:2505.23564). Every distinct
state (task, prompt + generated tokens before a cut) is continued K = ``rollouts`` times by the current
policy, all states of the step in one engine call, each continuation within what is left of
``rollout.max_new_tokens`` and scored by the run's reward pool as a whole completion
(``ContinuesStates.continue_states``; single-turn collectors). V(s) is the mean of the K rewards.

Each trajectory gets ``metadata['state_values']``: ``[[position, V], ...]`` (position in its token ids),
which ``episodes.build_batch`` turns into the batch's ``state_values`` / ``state_mask``. The values
are recomputed every step from the current policy: nothing is kept across steps (nothing to
checkpoint). The part's settings give ``rollouts``, ``step_split``, ``step_tokens`` and ``max_cuts`` (and
``prob_threshold``, ``cut_interval`` where it has them).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reinforge.algo.objective import required_inputs
from reinforge.errors import ConfigError
from reinforge.rewards.steps import token_of_offsets
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory

NEED = "state_values"
PREFIX = "rollout/state_values"


@dataclasses.dataclass(frozen=True)
class CutSettings:
    """K continuations per state; where steps end; the cap on intermediate states per completion; for
    ``step_split: low_prob``, the probability below which a token is a cutpoint and how many cutpoints
    make one segment."""

    rollouts: int
    step_split: str = "newline"
    step_tokens: int = 1
    max_cuts: int = 20
    prob_threshold: float = 0.9
    cut_interval: int = 1


def cut_points(generated: Sequence[int], decode: Callable[[list[int]], str], cut: CutSettings,
               logps: Sequence[float] | None = None) -> list[int]:
    """The positions in ``generated`` (0 < p < len) at which a new step starts, at most ``max_cuts``.
    ``low_prob`` (Segment Policy Optimization's cutpoints): the tokens sampled with probability below
    ``prob_threshold`` (``logps``: their sampling log-probs), every ``cut_interval``-th of them counting
    from the first, each starting a segment."""
    n = len(generated)
    if cut.step_split == "low_prob":
        lows = [t for t, lp in enumerate(logps or ()) if t < n and math.exp(lp) < cut.prob_threshold]
        cuts = [t for t in lows[:: cut.cut_interval] if 0 < t]
    elif cut.step_split == "tokens":
        cuts = list(range(cut.step_tokens, n, cut.step_tokens))
    else:
        text = decode(list(generated))
        ends = [i + 1 for i, ch in enumerate(text) if ch == "\n"]
        cuts, start = [], 0
        for end, token in zip(ends, token_of_offsets(decode, generated, ends), strict=True):
            if text[start:end].strip() and 0 < token + 1 < n and (not cuts or token + 1 > cuts[-1]):
                cuts.append(token + 1)
                start = end
    return cuts[: cut.max_cuts]


class StateValues:
    """The stage: ``__call__(tasks, trajectories, params)`` writes each trajectory's state values and
    returns the step's counters (``rollout/state_values/*``)."""

    def __init__(self, collector: Any, cut: CutSettings) -> None:
        if not hasattr(collector, "continue_states"):
            raise ConfigError(f"algo.advantage: a part needs Monte Carlo values of states (state_values), which "
                              f"continue partial completions; the {type(collector).__name__} collector cannot "
                              "(single-turn environments only)")
        self.collector, self.cut = collector, cut

    def __call__(self, tasks: Mapping[str, Task], trajectories: Sequence[Trajectory],
                 params: SamplingParams) -> dict[str, float]:
        decode = self.collector.engine.tokenizer.decode
        index: dict[tuple[str, tuple[int, ...]], int] = {}  # distinct states: (task id, prompt + prefix)
        states: list[tuple[str, list[int], list[int]]] = []  # (task id, prompt, prefix) of each
        where: list[tuple[Trajectory, list[tuple[int, int]]]] = []  # (position, state) of each cut
        for t in trajectories:
            if t.demonstration or 1 not in t.loss_mask:
                continue
            start = t.loss_mask.index(1)
            prompt, gen = t.token_ids[:start], t.token_ids[start:]
            cuts = [0, *cut_points(gen, lambda ids: decode(ids, skip_special_tokens=True), self.cut,
                                   t.logprobs[start:])]
            pos = []
            for c in cuts:
                key = (t.task_id, tuple(t.token_ids[: start + c]))
                if key not in index:
                    index[key] = len(states)
                    states.append((t.task_id, prompt, gen[:c]))
                pos.append((start + c, index[key]))
            where.append((t, pos))
        if not states:
            return {}
        t0 = time.perf_counter()
        got = self.collector.continue_states([tasks[s[0]] for s in states], [s[1] for s in states],
                                             [s[2] for s in states],
                                             dataclasses.replace(params, n=self.cut.rollouts, greedy=False))
        values = [sum(r) / len(r) for r in got.rewards]
        for t, pos in where:
            t.metadata[NEED] = [[p, values[i]] for p, i in pos]
        cuts = [len(pos) - 1 for _, pos in where]
        return {f"{PREFIX}/states": float(len(states)),
                f"{PREFIX}/continuations": float(len(states) * self.cut.rollouts),
                f"{PREFIX}/tokens_generated": float(got.tokens_generated),
                f"{PREFIX}/cuts_mean": sum(cuts) / len(cuts), f"{PREFIX}/value_mean": sum(values) / len(values),
                f"{PREFIX}/time_s": time.perf_counter() - t0, f"{PREFIX}/reward_s": got.reward_s}


def cut_settings(algo: Any) -> CutSettings | None:
    """The stage's options from the settings of the estimator that declares ``state_values`` (None when
    no part of the run does)."""
    if NEED not in required_inputs(algo):
        return None
    s = algo.advantage.settings
    try:
        return CutSettings(int(s.rollouts), str(s.step_split), int(s.step_tokens), int(s.max_cuts),
                           float(getattr(s, "prob_threshold", 0.9)), int(getattr(s, "cut_interval", 1)))
    except AttributeError:
        raise ConfigError(f"algo.advantage={algo.advantage} declares {NEED} but its settings give no rollouts, "
                          "step_split, step_tokens and max_cuts") from None


def state_value_stage(algo: Any, collector: Any) -> StateValues | None:
    """The run's stage over ``collector`` when a part needs ``state_values`` (None otherwise)."""
    cut = cut_settings(algo)
    return StateValues(collector, cut) if cut is not None else None
