"""reinforge: reinforcement-learning post-training for language models and language agents.

Heavy modules (torch, transformers) are imported lazily by the parts that need them, so
`import reinforge` and `reinforge --help` stay fast.
"""

__version__ = "0.1.0"



def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``reinforge.train``: the learner package, callable as the one-call Python API (reinforge/api.py)."""
    if name == "train":
        import reinforge.train as train_package

        return train_package
    raise AttributeError(f"module 'reinforge' has no attribute {name!r}")
