"""Sequential comparison of two agents: AdaStop restricted to two agents.

AdaStop (Mathieu et al. 2023, "AdaStop: adaptive statistical testing for sound comparisons of
Deep RL agents", arXiv:2306.10882) is a group-sequential permutation test. Seeds come in batches of
n per agent; after batch k (N_k = k n seeds each) the statistic is the difference of means

    D_k = mean(a_1..a_{N_k}) - mean(b_1..b_{N_k})

and the test stops with "a_better"/"b_better" when |D_k| > c_k, else asks for another batch; after
the last planned batch K it stops with "equal" (no significant difference; not proof of equality).

The boundary c_k comes from the permutation distribution of the whole trajectory (D_1..D_k):
under H0 (both agents' scores are i.i.d. from one distribution) the labels a/b can be swapped
within each batch without changing the joint law, so every relabelling sigma (one subset of n of
the 2n scores per batch) gives an equally likely trajectory D_j(sigma). With an alpha-spending
function alpha(k), c_k is the smallest value such that the fraction of relabellings that cross
for the first time at look k, i.e. |D_k(sigma)| > c_k and |D_j(sigma)| <= c_j for j < k,
is at most alpha(k) - (fraction that crossed before). Summed over looks, at most alpha(K) = alpha
of the relabellings ever cross, so P(reject | H0) <= alpha over all looks: family-wise error control
over the interim looks (and over the direction of the claim). Nothing about normality is assumed;
only exchangeability of the two agents' scores under H0 and a design (n, K) fixed in advance.

Relabellings: as in AdaStop, all C(2n, n)^k of them while that is at most ``n_permutations``;
past that, each kept trajectory is extended by random relabellings of the new batch (the observed
trajectory always by the identity). The identity plus i.i.d. uniform group elements keeps the
test exact, not approximate (Hemerik & Goeman 2018, "Exact testing with random permutations").

Spending: "linear" alpha(k) = alpha k / K is AdaStop's choice (Pocock-like: boundaries of similar
height at every look, so a clear difference stops early); "obrien_fleming" is the Lan-DeMets
O'Brien-Fleming-type alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), t = k / K, which spends almost
nothing early and keeps nearly the full alpha for the last look. AdaStop's optional early
acceptance ("equal" before K, its beta) is not implemented.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

Outcome = Literal["a_better", "b_better", "equal", "continue"]
SPENDING = ("linear", "obrien_fleming")


@dataclass(frozen=True)
class Decision:
    """The test's state after a look: ``decision`` is "continue" until it stops."""

    decision: Outcome
    batch: int  # looks done so far (1-based)
    n_seeds: int  # seeds per agent used so far (batch * n_per_batch)
    mean_a: float
    mean_b: float
    statistic: float  # D_k = mean_a - mean_b
    boundary: float  # c_k: stop with a winner when |D_k| > c_k (inf: this look cannot reject)
    alpha_spent: float  # alpha(k): the level spent up to and including this look

    @property
    def stopped(self) -> bool:
        return self.decision != "continue"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def spent_alpha(k: int, max_batches: int, alpha: float, spending: str = "linear") -> float:
    """Cumulative level alpha(k) spent up to look k of K (see the module docstring)."""
    t = k / max_batches
    if spending == "linear":
        return alpha * t
    if spending == "obrien_fleming":
        nd = NormalDist()
        return min(alpha, 2.0 * (1.0 - nd.cdf(nd.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t))))
    raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")


class SequentialComparison:
    """AdaStop for two agents: feed one batch of ``n_per_batch`` scores per agent to :meth:`update`.

    Stops with "a_better" or "b_better" as soon as |D_k| exceeds the permutation boundary, or
    with "equal" after ``max_batches`` looks; P(any "better" | no difference) <= alpha.
    """

    def __init__(
        self,
        n_per_batch: int,
        max_batches: int,
        alpha: float = 0.05,
        seed: int = 0,
        n_permutations: int = 10_000,
        spending: str = "linear",
    ) -> None:
        if n_per_batch < 1 or max_batches < 1:
            raise ValueError(f"need n_per_batch >= 1 and max_batches >= 1, got {n_per_batch}, {max_batches}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        spent_alpha(1, max_batches, alpha, spending)  # validates ``spending``
        self.n, self.max_batches, self.alpha, self.spending = n_per_batch, max_batches, alpha, spending
        self.n_permutations = n_permutations
        self.rng = np.random.default_rng(seed)
        self.scores_a: list[float] = []
        self.scores_b: list[float] = []
        self.decisions: list[Decision] = []
        self._traj = np.zeros(1)  # T_k(sigma) = sum over batches of the batch's mean difference; row 0 = observed
        self._crossed = np.zeros(1, dtype=bool)  # trajectories that crossed a boundary at an earlier look
        self._exact = True  # all relabellings enumerated so far
        self._scale = 0.0

    @property
    def finished(self) -> bool:
        return bool(self.decisions) and self.decisions[-1].stopped

    def _batch_contributions(self, z: np.ndarray) -> tuple[np.ndarray, bool]:
        """Mean differences of the batch's relabellings: all of them (exact) or one random per trajectory."""
        n, total = self.n, z.sum()
        n_subsets = math.comb(2 * n, n)
        if self._exact and self._traj.size * n_subsets <= self.n_permutations:
            subsets = np.array(list(itertools.combinations(range(2 * n), n)))  # first: (0..n-1) = identity
            return (2.0 * z[subsets].sum(axis=1) - total) / n, True
        reps = max(1, self.n_permutations // self._traj.size)
        size = self._traj.size * reps
        subsets = np.argpartition(self.rng.random((size, 2 * n)), n - 1, axis=1)[:, :n]
        contrib = (2.0 * z[subsets].sum(axis=1) - total) / n
        contrib[0] = (2.0 * z[:n].sum() - total) / n  # the observed trajectory keeps its labels
        return contrib, False

    def _extend(self, z: np.ndarray) -> None:
        contrib, exact = self._batch_contributions(z)
        if exact:  # every kept trajectory times every relabelling of the batch
            self._traj = (self._traj[:, None] + contrib[None, :]).ravel()
            self._crossed = np.repeat(self._crossed, contrib.size)
        else:  # each trajectory repeated, each copy extended by its own random relabelling
            reps = contrib.size // self._traj.size
            self._traj = np.repeat(self._traj, reps) + contrib
            self._crossed = np.repeat(self._crossed, reps)
        self._exact = exact

    def update(self, scores_a_batch: np.ndarray | list[float], scores_b_batch: np.ndarray | list[float]) -> Decision:
        """Add one batch of ``n_per_batch`` scores per agent; return the decision of this look."""
        if self.finished:
            raise RuntimeError(f"the comparison already stopped: {self.decisions[-1].decision}")
        a = np.asarray(scores_a_batch, dtype=float).ravel()
        b = np.asarray(scores_b_batch, dtype=float).ravel()
        if a.size != self.n or b.size != self.n:
            raise ValueError(f"each batch needs {self.n} scores per agent, got {a.size} and {b.size}")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError("scores must be finite")
        self.scores_a += a.tolist()
        self.scores_b += b.tolist()
        z = np.concatenate([a, b])
        self._scale = max(self._scale, float(np.abs(z).max()), 1e-300)
        self._extend(z)

        k = len(self.decisions) + 1
        level = spent_alpha(k, self.max_batches, self.alpha, self.spending)
        # |T| rounded relative to the data scale, so relabellings equal in exact arithmetic tie exactly
        values = np.round(np.abs(self._traj) / self._scale, 9)
        alive = ~self._crossed
        budget = math.floor(level * values.size + 1e-9) - int(self._crossed.sum())  # crossings allowed now
        survivors = np.sort(values[alive])[::-1]  # budget < survivors.size since level < 1
        boundary = survivors[budget]  # the (budget+1)-th largest: at most ``budget`` lie strictly above
        self._crossed |= alive & (values > boundary)
        reject = bool(values[0] > boundary)

        mean_a, mean_b = float(np.mean(self.scores_a)), float(np.mean(self.scores_b))
        stat = mean_a - mean_b
        if reject:
            outcome: Outcome = "a_better" if stat > 0 else "b_better"
        else:
            outcome = "equal" if k == self.max_batches else "continue"
        # in units of D_k; with no budget left the boundary is the largest relabelling: unreachable
        c_k = math.inf if budget == 0 else float(boundary) * self._scale / k
        decision = Decision(outcome, k, k * self.n, mean_a, mean_b, stat, c_k, level)
        self.decisions.append(decision)
        return decision
