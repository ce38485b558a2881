"""Named registries of algorithm parts.

Every advantage estimator, policy loss, loss aggregation and KL estimator is a plain
function registered under a name with its formula and paper. Recipes choose parts by name
(``algo.advantage: grpo``) and the training loop only ever calls ``REGISTRY.get(name)``: there
is no if/elif on names anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from reinforge.errors import ConfigError

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class Entry(Generic[F]):
    name: str
    fn: F
    formula: str
    paper: str


class Registry(Generic[F]):
    """A name -> function table for one kind of algorithm part."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, *, formula: str, paper: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = Entry(name, fn, formula, paper)
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._entries[name].fn
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[F]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries
