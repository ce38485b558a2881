"""reinforge: reinforcement-learning post-training for language models and language agents.

Heavy modules (torch, transformers) are imported lazily by the parts that need them, so
`import reinforge` and `reinforge --help` stay fast.
"""

import os
from typing import Any

# reinforge never uses JAX, but a dependency may import it where it is installed (GPU images often ship
# it); JAX's default then reserves 75% of the GPU's memory at its first use, which the learner needs.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

__version__ = "0.1.0"


def train(*args: Any, **kwargs: Any) -> Any:
    """The one-call Python API, ``reinforge.api.train`` (imported on the first call): e.g.
    ``reinforge.train(preset="grpo", model="tiny-base", task="arithmetic", verifier="exact_match")``."""
    from reinforge.api import train as api_train

    return api_train(*args, **kwargs)
