"""The training objective of one micro-batch, composed from registered parts over a ``Context``.

    L = agg(w_t * l_t^policy) + sum_k c_k * agg(l_t^k)

A batch may hold demonstration rows (given answers, ``Context.demo``): the policy loss and the
terms are aggregated over the sampled rows, and a term that declares it needs ``demonstrations``
(``nll``) over the demonstration rows, each with its own global denominators. A policy loss that
declares it needs ``demonstrations`` (LUFFY's) also trains on the demonstrations placed in a sampled
group (``Rows.guided``), in one aggregate with the sampled rows. ``algo.mixing`` weighs the two
sides: L = w_rl * (policy loss + sampled terms) + w_demo * (demonstration terms).

``l^policy`` is a ``POLICY_LOSSES`` entry, ``w_t`` the mismatch-correction weight
(``MISMATCH_CORRECTIONS``), ``agg`` a ``LOSS_AGG`` entry with the mini-batch's global denominators,
and each ``l^k`` an extra loss term (``LOSS_TERMS``: the KL penalty, the entropy bonus, or a
plug-in's) with its coefficient ``c_k``. Every part reads the context fields it names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from reinforge.algo.aggregation import LOSS_AGG, AggNorm
from reinforge.algo.context import PART_INPUTS, Context
from reinforge.algo.kl import KL_ESTIMATORS
from reinforge.algo.mismatch import mismatch_correction
from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.registry import Registry, kind

LOSS_TERMS: Registry = kind("loss_term", Registry("loss term", inputs=PART_INPUTS))


@LOSS_TERMS.register(
    "kl",
    formula="+ beta * agg(k(log pi, log pi_ref)), k = algo.kl.estimator",
    paper="Ouyang et al. 2022, InstructGPT (arXiv:2203.02155); in the loss: Shao et al. 2024, GRPO (arXiv:2402.03300)",
    needs=("ref_logp",),
)
def kl_term(logp: Tensor, ref_logp: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """The KL penalty against the reference policy, per token: k(log pi, log pi_ref)."""
    kl = KL_ESTIMATORS.get(cfg.kl.estimator)(logp, ref_logp)
    return kl, {"kl_ref": kl}


@LOSS_TERMS.register(
    "entropy",
    formula="- c * agg(H_t), H_t = -sum_v pi(v) log pi(v)",
    paper="Williams & Peng 1991; Mnih et al. 2016, A3C (arXiv:1602.01783)",
)
def entropy_term(entropy: Tensor, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """The entropy bonus: -H_t per token (a positive coefficient raises the entropy)."""
    return -entropy, {}


@dataclass(frozen=True)
class Term:
    """An extra loss term of the objective: a ``LOSS_TERMS`` entry, its coefficient and its settings."""

    name: str
    coef: float
    cfg: Any = None


@dataclass(frozen=True)
class Objective:
    """The parts of one run's objective (names of registered entries), the algorithm's config (``cfg``:
    for the loss terms without settings of their own, e.g. the KL term's estimator) and the policy
    loss's settings (``policy_cfg``)."""

    policy_loss: str
    loss_agg: str
    mismatch: str
    mismatch_cap: float
    cfg: Any
    policy_cfg: Any = None

    def reads(self, field: str, terms: Iterable[Term] = ()) -> bool:
        """Whether the policy loss or any of ``terms`` reads context ``field`` (e.g. needs the entropy's gradient)."""
        return field in POLICY_LOSSES.entry(self.policy_loss).params or any(
            field in LOSS_TERMS.entry(t.name).params for t in terms)

    @property
    def trains_on_guidance(self) -> bool:
        """Does the policy loss train on the demonstrations in groups (id >= 0)? When it declares it
        needs ``demonstrations`` (LUFFY's mixed-policy loss) or ``whole_groups`` (a loss computed per
        group, e.g. DPO's per pair, sees every member of a group, given or sampled)."""
        return bool({"demonstrations", "whole_groups"} & POLICY_LOSSES.needs(self.policy_loss))

    def rows(self, n: int, demo: Tensor | None, group_index: Tensor | None,
             device: torch.device | str = "cpu") -> Rows:
        """Which of ``n`` rows each part of this objective is aggregated over."""
        return row_sets(n, demo, group_index if self.trains_on_guidance else None, device)

    def loss(self, ctx: Context, norm: AggNorm, terms: Iterable[Term], demo_norm: AggNorm | None = None,
             weights: tuple[float, float] = (1.0, 1.0)) -> tuple[Tensor, Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """(loss, policy-loss part, per-token metrics, the mask each metric averages over) of the
        micro-batch ``ctx``: w_rl * (policy loss + the sampled rows' terms) + w_demo * (demonstration
        terms), ``weights`` = (w_rl, w_demo) from ``algo.mixing``. ``norm`` holds the global
        denominators of the rows the policy loss trains on, ``demo_norm`` those of the demonstrations."""
        aggregate = LOSS_AGG.get(self.loss_agg)
        rows = self.rows(ctx.mask.shape[0], ctx.demo, ctx.group_index, ctx.mask.device)
        sampled, guided, demos = (rows.mask(r, ctx.mask) for r in (rows.sampled, rows.guided, rows.demos))
        is_weight, metrics = mismatch_correction(ctx.old_logp, ctx.sampling_logp, sampled, self.mismatch,
                                                 self.mismatch_cap)
        metrics = {f"mismatch/{k}": v for k, v in metrics.items()}
        pg, pg_metrics = POLICY_LOSSES.call(self.policy_loss, ctx, self.policy_cfg)
        masks = dict.fromkeys(metrics, sampled)
        for name, value in pg_metrics.items():  # a (values, rows) pair averages over those rows only
            metrics[name], masks[name] = (value[0], value[1] * (sampled + guided)) if isinstance(value, tuple) \
                else (value, sampled)
        is_weight = torch.where(rows.guided[:, None], torch.ones_like(is_weight), is_weight)  # no sampler to correct
        pg_loss = aggregate(pg * is_weight, sampled + guided, norm)
        rl_loss, demo_loss = pg_loss, pg_loss.new_zeros(())
        for term in terms:
            on_demos = "demonstrations" in LOSS_TERMS.needs(term.name)
            if on_demos and (demo_norm is None or not rows.demos.any()):
                continue  # a demonstration term, no demonstration in this micro-batch
            mask, term_norm = (demos, demo_norm) if on_demos else (sampled, norm)
            values, term_metrics = LOSS_TERMS.call(term.name, ctx, term.cfg if term.cfg is not None else self.cfg)
            part = term.coef * aggregate(values, mask, term_norm)
            demo_loss, rl_loss = (demo_loss + part, rl_loss) if on_demos else (demo_loss, rl_loss + part)
            metrics.update(term_metrics)
            masks.update(dict.fromkeys(term_metrics, mask))
        return weights[0] * rl_loss + weights[1] * demo_loss, pg_loss, metrics, masks


@dataclass(frozen=True)
class Rows:
    """Which rows ([N] bool) each part of an objective is aggregated over: ``sampled`` (the policy
    loss and the ordinary terms), ``guided`` (demonstrations in a sampled group, group id >= 0, when
    the policy loss trains on them; none otherwise) and ``demos`` (every demonstration: the terms that
    need ``demonstrations``)."""

    sampled: Tensor
    guided: Tensor
    demos: Tensor

    @property
    def policy(self) -> Tensor:
        """The rows the policy loss is aggregated over."""
        return self.sampled | self.guided

    @staticmethod
    def mask(rows: Tensor, mask: Tensor) -> Tensor:
        """``mask`` [N, T] on ``rows`` only."""
        return mask * rows[:, None].to(mask.dtype)


def row_sets(n: int, demo: Tensor | None, group_index: Tensor | None = None,
             device: torch.device | str = "cpu") -> Rows:
    """The ``Rows`` of a batch of ``n`` rows with demonstration flags ``demo`` (None: none); with
    ``group_index``, the demonstrations in a sampled group (id >= 0) are ``guided``. Without ``demo``
    the rows are made on ``device`` (the micro-batch's)."""
    if demo is None:
        demo = torch.zeros(n, dtype=torch.bool, device=device)
    demo = demo.bool()
    guided = demo & (group_index >= 0) if group_index is not None else torch.zeros_like(demo)
    return Rows(sampled=~demo, guided=guided, demos=demo)


def loss_terms(cfg: Any, kl_coef: float | None = None, controllers: dict[int, Any] | None = None) -> list[Term]:
    """The extra loss terms a run's ``AlgoConfig`` asks for: the KL penalty when ``kl.coef`` > 0 and it
    is placed in the loss (coefficient ``kl_coef``, the adaptive controller's current value; with
    ``kl.measure`` and coefficient 0 the term is there at 0, for its ``kl_ref`` metric), the
    entropy bonus when ``entropy_coef`` != 0, then every ``loss_terms`` entry of the recipe (its cfg:
    its settings, or its controller from ``controllers`` when it has one, see ``term_controllers``)."""
    terms = []
    if cfg.kl.coef > 0 and cfg.kl.placement == "loss":
        terms.append(Term("kl", cfg.kl.coef if kl_coef is None else kl_coef))
    elif cfg.kl.coef == 0 and getattr(cfg.kl, "measure", False):  # measured, not penalised: coefficient 0
        terms.append(Term("kl", 0.0))
    if cfg.entropy_coef != 0:
        terms.append(Term("entropy", cfg.entropy_coef))
    for i, t in enumerate(getattr(cfg, "loss_terms", ())):
        ctl = (controllers or {}).get(i)
        terms.append(Term(t.name, t.coef, ctl if ctl is not None else t.settings()))
    return terms


def term_controllers(cfg: Any) -> dict[int, Any]:
    """The state of the stateful ``loss_terms`` entries, by their index: a term whose settings class
    declares a ``controller`` class gets one, built from its settings. The learner owns them: it hands
    each to its term as ``cfg`` (``loss_terms``), calls ``update(metrics) -> metrics`` after every
    update and saves ``state_dict()`` / ``load_state_dict()`` with its checkpoint (e.g. EPO's entropy
    history, AEnt's coefficient: algo/entropy.py)."""
    out = {}
    for i, t in enumerate(getattr(cfg, "loss_terms", ())):
        settings = t.settings()
        controller = getattr(type(settings), "controller", None)
        if controller is not None:
            out[i] = controller(settings)
    return out


def advantage_controller(cfg: Any) -> Any | None:
    """The state of a stateful advantage estimator: when its settings class declares a ``controller``
    class, one built from its settings (None otherwise). As for the loss terms' controllers, the
    learner owns it: it is the estimator's ``cfg`` (its ``settings`` attribute the options), its
    ``update(metrics) -> metrics`` runs after every update and ``state_dict()`` / ``load_state_dict()``
    go into the checkpoint (e.g. SPO's per-prompt value tracker: algo/spo.py)."""
    settings = cfg.advantage.settings
    controller = getattr(type(settings), "controller", None)
    return controller(settings) if controller is not None else None


def read_fields(cfg: Any) -> frozenset[str]:
    """The context fields the run reads: those its estimator, policy loss and loss terms name as
    parameters, and those they declare in ``needs`` (``required_inputs``)."""
    from reinforge.algo.advantage_estimators import ADVANTAGES

    entries = [ADVANTAGES.entry(cfg.advantage), POLICY_LOSSES.entry(cfg.policy_loss),
               *(LOSS_TERMS.entry(term.name) for term in loss_terms(cfg))]
    return frozenset(p for e in entries for p in e.params if p in PART_INPUTS and p != "cfg") | required_inputs(cfg)


def required_inputs(cfg: Any) -> frozenset[str]:
    """What the run's parts declare the loop must provide (``Entry.needs``): e.g. ``values`` (a
    critic), ``ref_logp`` (a reference model), ``greedy_baseline`` (a greedy rollout), ``turn_returns``."""
    from reinforge.algo.advantage_estimators import ADVANTAGES

    needs = set(ADVANTAGES.needs(cfg.advantage)) | POLICY_LOSSES.needs(cfg.policy_loss)
    for term in loss_terms(cfg):
        needs |= LOSS_TERMS.needs(term.name)
    if cfg.kl.coef > 0 or getattr(cfg.kl, "measure", False):  # in the loss (the kl term) or in the reward
        needs.add("ref_logp")
    return frozenset(needs)
