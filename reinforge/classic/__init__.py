"""Classic deep RL on reinforge's core: Gymnasium environments and agents built from the parts of ``algo/``.

``reinforge train cartpole_ppo`` runs a shipped classic recipe (``reinforge/recipes/classic/``; a recipe
is classic when it has a top-level ``classic:`` section). Modules: ``config`` (the recipe's pydantic
models), ``envs`` (vectorised Gymnasium environments and their wrappers), ``networks`` (MLP
actor-critic), ``ppo`` (the PPO agent, top to bottom), ``run`` (run directory, metrics, checkpoints,
evaluation). Gymnasium is imported lazily: ``import reinforge`` does not need it
(``pip install reinforge[classic]``). docs/classic.md.
"""
