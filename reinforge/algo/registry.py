"""The registries of algorithm parts are ``reinforge.registry.Registry`` tables (see that module)."""

from reinforge.registry import Entry, Registry

__all__ = ["Entry", "Registry"]
