"""Every kind of part, with every built-in part registered: ``all_kinds()`` imports the modules that
register them and returns ``registry.KINDS`` (recipe key -> ``Registry``)."""

from __future__ import annotations

from collections.abc import Mapping

from reinforge.registry import KINDS, Registry


def all_kinds() -> Mapping[str, Registry]:
    """Every registry, with every built-in part registered (plug-ins add theirs when imported)."""
    import reinforge.algo  # noqa: F401  (every module of algo/: its __init__ imports them all)
    import reinforge.classic.cql_box  # noqa: F401  (classic agents: cql)
    import reinforge.classic.dqn  # noqa: F401  (classic agents: dqn)
    import reinforge.classic.impala  # noqa: F401  (classic agents: impala)
    import reinforge.classic.mappo  # noqa: F401  (classic agents: ippo, mappo)
    import reinforge.classic.mbpo  # noqa: F401  (classic agents: mbpo)
    import reinforge.classic.pets  # noqa: F401  (classic agents: pets)
    import reinforge.classic.ppo  # noqa: F401  (classic agents: ppo)
    import reinforge.classic.rlpd  # noqa: F401  (classic agents: rlpd)
    import reinforge.classic.sac  # noqa: F401  (classic agents: sac)
    import reinforge.classic.td3bc  # noqa: F401  (classic agents: td3_bc)
    import reinforge.classic.vdn  # noqa: F401  (classic agents: vdn)
    import reinforge.classic.wsrl  # noqa: F401  (classic agents: wsrl)
    import reinforge.data.budgets  # noqa: F401  (uniform, knapsack rollout budgets)
    import reinforge.data.curriculum  # noqa: F401  (difficulty_filter, dump task samplers)
    import reinforge.data.insight  # noqa: F401  (insight task sampler)
    import reinforge.data.samplers  # noqa: F401
    import reinforge.data.spo_sampler  # noqa: F401  (spo task sampler)
    import reinforge.envs.registry  # noqa: F401
    import reinforge.orchestrate.guidance_rules  # noqa: F401  (every_group, failed_groups)
    import reinforge.orchestrate.hints  # noqa: F401  (ghpo, guide hint parts)
    import reinforge.orchestrate.replay  # noqa: F401  (RePO's replay strategies)
    import reinforge.rewards  # noqa: F401
    import reinforge.rewards.prm  # noqa: F401  (the prm step verifier: a trained process reward model)
    import reinforge.rewards.step_shaping  # noqa: F401  (step-reward shapers: clip, delta)
    import reinforge.rewards.steps  # noqa: F401  (step verifiers: process rewards)
    import reinforge.rollout.auto_engine  # noqa: F401
    import reinforge.rollout.budget_groups  # noqa: F401  (hbpo_budgets group sampler: HBPO's budget subgroups)
    import reinforge.rollout.eptree  # noqa: F401  (eptree group sampler: TreeRL's entropy-guided tree search)
    import reinforge.rollout.group_samplers  # noqa: F401
    import reinforge.rollout.micro_groups  # noqa: F401  (micro_groups group sampler: Infinite Sampling)
    import reinforge.rollout.noisy_rollout  # noqa: F401  (noisy_rollout group sampler: NoisyRollout)
    import reinforge.rollout.openai_engine  # noqa: F401
    import reinforge.rollout.spec_rl  # noqa: F401  (spec_rl group sampler)
    import reinforge.rollout.think_prompts  # noqa: F401  (autothink_ellipsis, thinkfree group samplers)
    import reinforge.rollout.torch_engine  # noqa: F401
    import reinforge.rollout.tppo  # noqa: F401  (tppo group sampler: T-PPO's truncated rollouts)
    import reinforge.rollout.tree_sampler  # noqa: F401  (treepo group sampler)
    import reinforge.rollout.vllm_engine  # noqa: F401  (vllm itself is imported when the engine is built)

    return KINDS
