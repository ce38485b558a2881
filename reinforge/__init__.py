"""reinforge: reinforcement-learning post-training for language models and language agents.

Heavy modules (torch, transformers) are imported lazily by the parts that need them, so
`import reinforge` and `reinforge --help` stay fast.
"""

__version__ = "0.1.0"
