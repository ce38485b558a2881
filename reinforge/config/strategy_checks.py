"""Cross-section checks of a run's rollout strategies, and of the inputs the loop estimates for a part
(Monte Carlo state values): each raises ``ValueError`` naming the field (``RunConfig`` turns it into the
config error). What remains refused is what the method itself cannot do there: a stage's state that
ranks would split, generations carried inside one engine, partial turns of a multi-turn episode."""

from __future__ import annotations

from typing import Any

# a ``reinforge.config.run.RunConfig`` (not imported: run.py calls these checks, so no cycle)
RunConfig = Any


def check_strategies(cfg: RunConfig) -> None:
    """Every check below, in order."""
    for check in (one_baseline_producer, rollout_parts_run_in_one_rank, carried_generations_fit,
                  state_values_are_estimated, reference_rewards_fit, adapter_sync_fits, role_adapters_fit):
        check(cfg)


BASELINE_PRODUCERS = ("greedy_baseline", "optimal_value", "reference_value")


def one_baseline_producer(cfg: RunConfig) -> None:
    """The per-sequence ``baseline`` field has one producer per run: the greedy rollout (ReMax), A*-PO's
    V*(x) or PVPO's V_ref(x), whichever the run's parts declare (``needs``); two would overwrite each other."""
    from reinforge.algo.objective import required_inputs

    asked = [n for n in BASELINE_PRODUCERS if n in required_inputs(cfg.algo)]
    if len(asked) > 1:
        raise ValueError(f"algo: the parts need {' and '.join(asked)}, each a different per-sequence baseline "
                         f"(algo.advantage={cfg.algo.advantage}, algo.policy_loss={cfg.algo.policy_loss}); "
                         "a run has one: choose parts that agree")


def rollout_parts_run_in_one_rank(cfg: RunConfig) -> None:
    """Replay buffers and budgets keep one state over every prompt's samples (orchestrate/stages.py); with
    several ranks each would see only its share of the samples and a checkpoint would hold rank 0's."""
    for key, part in (("rollout.replay", cfg.rollout.replay), ("rollout.budget", cfg.rollout.budget)):
        if part is not None and cfg.train.world_size > 1:
            raise ValueError(f"{key} runs with train.world_size=1 (its state covers every prompt's samples; "
                             "ranks would each hold a part of it)")


def carried_generations_fit(cfg: RunConfig) -> None:
    """A group sampler that carries generations over (``needs=("carry_over",)``, T-PPO) runs in the
    loop's process, with an estimator that reads ``continues``."""
    from reinforge.algo.advantage_estimators import ADVANTAGES
    from reinforge.rollout.group_samplers import GROUP_SAMPLERS

    name = cfg.rollout.group_sampler.name
    if "carry_over" not in GROUP_SAMPLERS.needs(name):
        return
    where = f"rollout.group_sampler={name} carries unfinished generations across steps"
    if cfg.orchestrate.mode == "async" or cfg.train.world_size > 1:
        raise ValueError(f"{where} in the loop's process: use orchestrate.mode=sync and train.world_size=1")
    if "continues" not in ADVANTAGES.entry(cfg.algo.advantage).params:
        raise ValueError(f"algo.advantage={cfg.algo.advantage}: {where}; the estimator must bootstrap the "
                         "windows that continue (it reads `continues`): use algo.advantage: egae")
    on = {"algo.dynamic_sampling": cfg.algo.dynamic_sampling, "algo.reward_shapers": cfg.algo.reward_shapers,
          "rollout.replay": cfg.rollout.replay is not None}
    for key in [k for k, v in on.items() if v][:1]:
        raise ValueError(f"{key}: not supported with {where} (a window cut is not an outcome)")


def state_values_are_estimated(cfg: RunConfig) -> None:
    """Monte Carlo values of intermediate states (``state_values``, VinePPO's) continue single-turn
    completions (orchestrate/state_values.py)."""
    from reinforge.algo.objective import required_inputs
    from reinforge.envs.registry import environment_spec

    if "state_values" not in required_inputs(cfg.algo):
        return
    spec = environment_spec(cfg.env.name)
    if spec.multi_turn or spec.agent_driven:
        raise ValueError(f"env.name={cfg.env.name}: algo.advantage={cfg.algo.advantage} needs Monte Carlo "
                         "values of intermediate states, which continue single-turn completions; a multi-turn "
                         "or agent episode cannot be continued from a partial turn (use env.name=single_turn)")


def reference_rewards_fit(cfg: RunConfig) -> None:
    """A reward term whose verifier declares ``reference_logp`` (RLPR, DRO's R3: rewards/reference_prob.py)
    gets its value after rollout, from the policy (orchestrate/reference_rewards.py): its ``params`` are its
    verifier's settings, the episodes are single-turn, and nothing reads the rewards before that stage."""
    from reinforge.algo.objective import required_inputs
    from reinforge.envs.registry import environment_spec
    from reinforge.errors import ConfigError
    from reinforge.rewards.reference_prob import RLPRSettings, reference_terms

    try:
        terms = reference_terms(cfg.reward, cfg.task.verifier)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    if not terms:
        return
    where = (f"reward: {terms[0].verifier} is the policy's likelihood of the reference, set after rollout "
             "(the reference-rewards stage)")
    spec = environment_spec(cfg.env.name)
    if spec.multi_turn or spec.agent_driven:
        raise ValueError(f"env.name={cfg.env.name}: {where} reads a single-turn completion's reasoning; use "
                         "env.name=single_turn")
    needs = required_inputs(cfg.algo)
    d = cfg.demonstrations
    before = {"algo.dynamic_sampling": cfg.algo.dynamic_sampling, "rollout.hints": cfg.rollout.hints is not None,
              "demonstrations.placement=in_group": d.path is not None and d.placement == "in_group",
              **{f"algo (a part needs {n})": n in needs for n in (*BASELINE_PRODUCERS, "state_values")}}
    for key in [k for k, v in before.items() if v][:1]:
        raise ValueError(f"{key}: reads the rewards of samples before the stage sets them; {where}")
    stateful = [t.name for t in terms if isinstance(t.settings, RLPRSettings) and t.settings.std_filter]
    if stateful and cfg.train.world_size > 1:
        raise ValueError(f"reward term {stateful[0]!r}: RLPR's std filter keeps an EMA over every prompt's samples; "
                         "run it with train.world_size=1 (or params: {std_filter: false})")


def adapter_sync_fits(cfg: RunConfig) -> None:
    """Adapter-only sync (``model.lora.sync=adapter``) goes from the learner to its own engine; the
    asynchronous workers receive merged weights through shared memory (orchestrate/shared_weights.py)."""
    lora = cfg.model.lora
    if lora.enabled and lora.sync == "adapter" and cfg.orchestrate.mode == "async":
        raise ValueError("model.lora.sync=adapter: the asynchronous rollout workers receive merged weights; "
                         "use orchestrate.mode=sync or model.lora.sync=merged")


def role_adapters_fit(cfg: RunConfig) -> None:
    """``env.role_adapters`` (learn/role_adapters.py): each name a peft adapter name (non-empty, no dots, not
    peft's prefix), each role once and trained; LoRA adapters sent alone to the torch engine, one process;
    the learner splits each batch by ``turn_roles``, so the run's parts must read it."""
    from reinforge.algo.objective import read_fields
    from reinforge.algo.role_credit import ROLES

    roles, env, lora = cfg.env.role_adapters, cfg.env, cfg.model.lora
    if roles is None:
        return
    if not roles or any(not r or "." in r or "lora_" in r for r in roles) or len(set(roles)) != len(roles):
        raise ValueError(f"env.role_adapters: {roles}: give each role once, each a non-empty name without dots "
                         "and without 'lora_'")
    if env.train_roles is not None and set(roles) - set(env.train_roles):
        raise ValueError(f"env.role_adapters: {sorted(set(roles) - set(env.train_roles))} are not in "
                         "env.train_roles (the adapter of a role that is not trained would never change)")
    if not lora.enabled or lora.sync != "adapter":
        raise ValueError("env.role_adapters: one LoRA adapter per role needs model.lora.enabled=true and "
                         "model.lora.sync=adapter (the engine samples each role with its own adapter)")
    if cfg.train.world_size > 1 or cfg.orchestrate.mode != "sync":
        raise ValueError("env.role_adapters: one process (train.world_size=1, orchestrate.mode=sync)")
    if ROLES not in read_fields(cfg.algo):
        raise ValueError(f"env.role_adapters: the learner splits each batch by its turn_roles field, which "
                         f"algo.advantage={cfg.algo.advantage} does not read; use at_grpo or role_ema")


def sampled_log_probs_fit(cfg: RunConfig) -> None:
    """``train.old_logprobs=rollout`` takes pi_old from the sampler: every trained row must have been sampled, in
    the context it is trained in (not a demonstration, not a hinted row trained without its hint, not a group
    sampler that declares ``other_context``, NoisyRollout's)."""
    from reinforge.rollout.group_samplers import GROUP_SAMPLERS

    if cfg.train.old_logprobs == "recompute":
        return
    sampler = cfg.rollout.group_sampler.name
    refused = [("demonstrations.path", cfg.demonstrations.path is not None, "demonstration rows were not sampled"),
               ("rollout.hints", cfg.rollout.hints is not None,
                "a hinted row is trained without its hint, which its completion was sampled with"),
               (f"rollout.group_sampler={sampler}", "other_context" in GROUP_SAMPLERS.needs(sampler),
                "it trains each sample on another context than it was sampled in")]
    for key, applies, reason in refused:
        if applies:
            raise ValueError(f"train.old_logprobs=rollout with {key}: {reason}, so the sampler's log-probs are not "
                             "pi_old's; use train.old_logprobs=recompute")
