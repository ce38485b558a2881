"""Named registries of parts: every kind of part a recipe can name lives in one ``Registry``.

An entry is a plain function (or a class) registered under a name with its formula and paper.
What an entry *needs* from the loop is declared, never inferred from its name:

* the function's own parameters name the fields of the context record it reads (``Registry.call``
  binds them by name: an advantage estimator with a ``values`` parameter gets the critic's values,
  a policy loss with ``ref_logp`` the reference log-probs), and only those; ``cfg`` is the part's
  settings;
* ``settings`` is a pydantic model of the part's own options (usually a ``Settings``), validated
  from the recipe; a part that reads no option declares none;
* ``needs`` lists the inputs the loop must produce for it because nothing else would (a critic's
  ``values``, a ``greedy_baseline``, ``turn_returns``, ``ref_logp``, ...); the loop asks
  ``Registry.needs(name)`` and provides them.

No code outside a registry module tests a part's name (tests/test_architecture.py greps for it).
``KINDS`` indexes every registry by the recipe key that names its parts (``reinforge.parts``
imports the modules that fill them); a user's module named in a recipe's ``plugins:`` registers
parts exactly like built-in ones (``reinforge.plugins``). A registry made with ``references=True``
(advantage estimators, policy losses) also takes a plain function named ``module:qualname``: looked up,
it is imported and registered under that name, in every process that looks it up (no plug-in needed).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from reinforge.errors import ConfigError

F = TypeVar("F", bound=Callable)


class Settings(BaseModel):
    """Base of a part's settings model: unknown options are errors and assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


@dataclass(frozen=True)
class Entry(Generic[F]):
    name: str
    fn: F
    formula: str
    paper: str
    needs: frozenset[str] = frozenset()
    params: tuple[str, ...] = field(default=(), compare=False)  # the fn's parameters, for Registry.call
    settings: type | None = None  # the part's own options (a pydantic model), validated from the recipe
    description: str = ""  # what the part is, for a part that has no formula (an environment, an engine)

    def options(self) -> dict[str, Any]:
        """The part's options with their defaults (none without a settings model)."""
        if self.settings is None:
            return {}
        return {k: f.default for k, f in self.settings.model_fields.items()}

    def make_settings(self, values: Mapping[str, Any], where: str) -> Any:
        """The part's settings from a recipe mapping (``where`` names it in errors); with no settings
        model declared, the mapping must be empty."""
        if self.settings is None:
            if values:
                raise ConfigError(f"{where}: {self.name} takes no settings (got {', '.join(sorted(values))})")
            return None
        try:
            return self.settings(**values)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise ConfigError(f"{where}: {problems}") from None


NEEDS: dict[str, str] = {
    # what a part may declare in ``needs=(...)``; each is interpreted by the loop (anything else is an error)
    "values": "a critic is built; its values V(s_t) are computed before the advantages",
    "ref_logp": "a frozen reference model; its log-probs are computed before the advantages",
    "old_logp": "pi_old's log-probs are recomputed even with a single update per batch",
    "sampling_logp": "the rollout engine's log-probs (the behaviour policy) reach the estimator",
    "entropy": "pi_old's per-token entropy, from its no-grad pass, reaches the estimator",
    # the three producers of the per-sequence ``baseline`` field (a run may need one of them)
    "greedy_baseline": "a greedy rollout per prompt: each sequence's baseline is its prompt's greedy reward (ReMax)",
    "optimal_value": "V*(x) per prompt from reference samples, in baseline (A*-PO)",
    "reference_value": "a reference policy's mean reward per prompt, in baseline (PVPO)",
    "turn_returns": "multi-turn: the discounted return from each token's turn on",
    "turn_states": "multi-turn: the environment state each turn acted from",
    "subgroups": "the nested groups a group sampler made (tree rollouts)",
    "prompt_key": "a hash of each sequence's task, for state kept per prompt across steps",
    "state_values": "Monte Carlo values of intermediate states (VinePPO's re-rollouts)",
    "budget_scores": "each completion cut at token budgets and an answer scored at each cut (AnytimeReasoner)",
    "answer_probs": "multi-turn: the policy's teacher-forced probability of the gold answer before each turn (IGPO)",
    "search_steps": "multi-turn search: each turn's information gain of its retrieved documents against the "
                    "task's gold evidence and their redundancy (StepSearch)",
    "teacher_logp_vocab": "a frozen teacher's full next-token distributions (algo.teacher)",
    "old_vocab_mean": "pi_old's mean log-probability over the vocabulary at each position, from its no-grad pass",
    "old_topk": "pi_old's sparse support at each position (the taken token and its most probable others) and its log-probabilities there, from its no-grad pass",
    "masked_pictures": "one more forward of the policy (with gradient) on each row with patches of its picture "
                       "masked: masked_logp, masked_entropy (PAPO)",
    "demonstrations": "rows given, not sampled (demonstrations.path); the part trains on them",
    "whole_groups": "a loss computed per group: micro-batches keep groups whole",
    "ungrouped": "the estimator's baseline is not its group's: equal-reward groups are kept",
    "other_context": "a group sampler whose update conditions a sample on another context than it was sampled "
                     "in (NoisyRollout's clean picture): pi_old is never the sampler's (train.old_logprobs)",
    "carry_over": "a group sampler that carries unfinished generations into the next step (T-PPO)",
    "cpu_bound": "a verifier computing in pure Python under the GIL: scored in processes",
    "reference_logp": "a verifier whose value is the policy's likelihood of the reference answer after each "
                      "sample's reasoning: the reference-rewards stage sets it after rollout (RLPR, DRO's R3)",
}


class Registry(Generic[F]):
    """A name -> part table for one kind of part. ``inputs``: the names its parts' parameters may take
    (the fields of the record the part is called with, and ``cfg``); None where any name goes.
    ``references``: a ``module:qualname`` name not registered yet is imported and registered on lookup."""

    def __init__(self, kind: str, inputs: frozenset[str] | None = None, references: bool = False) -> None:
        self.kind = kind
        self.inputs = inputs
        self.references = references
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, *, paper: str, formula: str = "", description: str = "",
                 needs: tuple[str, ...] | frozenset[str] = (), settings: type | None = None) -> Callable[[F], F]:
        """Register ``fn`` as ``name``: its ``formula`` (a part of the algorithm's maths), or a plain
        ``description`` for a part that has none (an environment, a rollout engine); one at least."""
        if not (formula or description):
            raise TypeError(f"{self.kind} {name!r}: give its formula or, for a part without one, its description")

        def deco(fn: F) -> F:
            if name in self._entries and not _same_definition(self._entries[name].fn, fn):
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            params = _parameters(fn)
            self._check_declared(name, params, needs)
            self._entries[name] = Entry(name, fn, formula, paper, frozenset(needs), params, settings, description)
            return fn

        return deco

    def _check_declared(self, name: str, params: tuple[str, ...], needs: tuple[str, ...] | frozenset[str]) -> None:
        """A parameter that is no field of the record the part is called with, or a need the loop does not
        know, is an error naming the part and the name (a plug-in's fails when the config loads)."""
        for need in needs:
            if need not in NEEDS:
                raise ConfigError(f"{self.kind} {name!r}: unknown need {need!r}{_close(need, NEEDS)}; known: "
                                  f"{', '.join(sorted(NEEDS))}")
        for param in params if self.inputs is not None else ():
            if param not in self.inputs:
                raise ConfigError(f"{self.kind} {name!r}: parameter {param!r} is not a field it can read"
                                  f"{_close(param, self.inputs)}; fields: {', '.join(sorted(self.inputs))}")

    def entry(self, name: str) -> Entry[F]:
        if name not in self._entries and self.references and ":" in name:
            self._register_reference(name)
        try:
            return self._entries[name]
        except KeyError:
            yours = ", or your own function as module:function" if self.references else ""
            raise ConfigError(f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}{yours}") from None

    def _register_reference(self, name: str) -> None:
        """Import the function ``module:qualname`` (or ``path/file.py:qualname``) names and register it
        under that name: its docstring's first line is its description; it declares no needs or settings."""
        from reinforge.plugins import import_callable

        target, _, qualname = name.rpartition(":")
        if not target or not qualname:
            return
        obj = import_callable(name, self.kind, ConfigError)
        doc = (inspect.getdoc(obj) or "").strip().split("\n")[0]
        self.register(name, paper=f"your function {name}", description=doc or f"your function {name}")(obj)

    def get(self, name: str) -> F:
        return self.entry(name).fn

    def needs(self, name: str) -> frozenset[str]:
        """The inputs ``name`` declares that the loop must provide for it."""
        return self.entry(name).needs

    def call(self, name: str, context: Any, cfg: Any = None, **extra: Any) -> Any:
        """``fn(**{p: context.p for each parameter p}, cfg=cfg)``: the context record's fields that the
        function names as parameters (``extra`` first), so each part reads only what it uses."""
        entry = self.entry(name)
        kwargs = {p: extra[p] if p in extra else cfg if p == "cfg" else getattr(context, p) for p in entry.params}
        return entry.fn(**kwargs)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def in_order(self) -> list[str]:
        """The names in the order they were registered (built-in parts first)."""
        return list(self._entries)

    def entries(self) -> list[Entry[F]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __getitem__(self, name: str) -> F:
        return self.get(name)


def _same_definition(a: Any, b: Any) -> bool:
    """The same function defined again (a plug-in module imported or reloaded twice), not a clash."""
    def where(x: Any) -> tuple:
        x = getattr(x, "make", x)  # a spec object registered for its factory
        return getattr(x, "__module__", None), getattr(x, "__qualname__", None)
    return where(a) == where(b) and where(a) != (None, None)


def _close(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, if one is close."""
    match = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _parameters(fn: Callable) -> tuple[str, ...]:
    if not callable(fn):
        return ()
    target = fn.__init__ if inspect.isclass(fn) else fn
    names = [p.name for p in inspect.signature(target).parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return tuple(n for n in names if n != "self")


KINDS: dict[str, Registry] = {}


def kind(key: str, registry: Registry) -> Registry:
    """Index ``registry`` under ``key`` (the recipe key that names its parts); returns it."""
    if key in KINDS and KINDS[key] is not registry:
        raise ValueError(f"part kind {key!r} is indexed twice")
    KINDS[key] = registry
    return registry
