"""The learner: model loading, optimizer, micro-batched policy updates, checkpoints.

The package is also the one-call Python API: ``reinforge.train(preset="grpo", model=..., ...)`` calls
``reinforge.api.train`` (the package object is callable, so the name works whether or not its modules
were imported first).
"""

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        from reinforge.api import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
