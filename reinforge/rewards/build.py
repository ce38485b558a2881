"""The run's reward function from its config: ``task.verifier`` alone, or ``reward.terms`` composed."""

from __future__ import annotations

from reinforge.config import JudgeConfig, RewardConfig, RewardTermConfig
from reinforge.rewards.imported import resolve_verifier
from reinforge.rewards.pool import PoolKind, VerifierPool
from reinforge.rewards.verifiers import CPU_BOUND, VERIFIERS, Verifier


def build_reward(reward: RewardConfig, task_verifier: str, device: str = "cpu") -> Verifier:
    """``reward.terms`` empty: the task's verifier (``task.verifier``). Otherwise a ``CompositeReward``
    of the terms (registered verifiers, reward models on ``device``, LLM judges) with the
    configured error policy."""
    if not reward.terms:
        return resolve_verifier(task_verifier)
    from reinforge.rewards.composite import CompositeReward, RewardTerm

    terms = [RewardTerm(t.name, _term_verifier(t, device), t.weight, t.primary, t.params) for t in reward.terms]
    return CompositeReward(terms, on_error="zero" if reward.on_error == "zero" else "raise")


def cpu_bound(verifier: str) -> bool:
    """A registered verifier that declares it computes in pure Python under the GIL (``CPU_BOUND``): worth
    a process each (math-verify scores 1.74x faster on 2 processes than inline, threads 0.90x:
    benchmarks/BENCHMARKS.md). Your own ``module:function`` declares nothing (threads)."""
    return verifier in VERIFIERS and CPU_BOUND in VERIFIERS.needs(verifier)


def pool_kind(reward: RewardConfig, task_verifier: str, multi_turn: bool) -> PoolKind:
    """``reward.pool``, with ``auto`` resolved: processes when a single-turn reward uses a CPU-bound
    pure-Python verifier (``cpu_bound``) and no reward model or judge (a model would be
    loaded in every worker; a judge waits on HTTP); threads otherwise (sandboxed code, models, judges
    and cheap string checks gain nothing from a process, and threads start at once). A multi-turn
    environment scores one completion at a time as its episodes step, so its pool stays threads
    (no pickling round trip per call)."""
    if reward.pool != "auto":
        return reward.pool
    if multi_turn:
        return "thread"
    terms = reward.terms
    if any(t.verifier is None for t in terms):
        return "thread"
    names = [t.verifier for t in terms] if terms else [task_verifier]
    return "process" if any(cpu_bound(name) for name in names) else "thread"


def build_reward_pool(reward: RewardConfig, verifier: Verifier, kind: PoolKind) -> VerifierPool:
    """The loop's scorer: ``reward.workers`` threads or processes (``kind``, see ``pool_kind``) with
    ``reward.timeout_s`` per call; the policy starts at ``raise`` for ``on_error: auto`` (the loop
    relaxes it after the first step)."""
    pool = VerifierPool(verifier, workers=reward.workers, timeout_s=reward.timeout_s, kind=kind,
                        on_error="zero" if reward.on_error == "zero" else "raise")
    step = reward.step_verifier
    if step is not None:
        from reinforge.rewards.steps import StepRewards

        shaping = reward.step_shaping
        pool.steps = StepRewards(step.name, step.settings(), step.coef, shaping.name if shaping else None,
                                 shaping.settings() if shaping else None)
    return pool


def run_reward_pool(cfg) -> VerifierPool:
    """A run's reward pool from its ``reward``, ``task``, ``env`` and ``model`` sections."""
    verifier = build_reward(cfg.reward, cfg.task.verifier, cfg.model.device)
    return build_reward_pool(cfg.reward, verifier, pool_kind(cfg.reward, cfg.task.verifier, cfg.env.multi_turn))


def _term_verifier(term: RewardTermConfig, device: str) -> str | Verifier:
    if term.verifier is not None:
        return term.verifier
    if term.reward_model is not None:
        from reinforge.assets import resolve_model_path
        from reinforge.models.loading import load_tokenizer
        from reinforge.rewards.reward_model import (
            RewardModelScorer,
            RewardModelVerifier,
            ensemble_members,
            reward_model_dir,
        )

        rm = term.reward_model
        path = str(resolve_model_path(rm.path))
        members = ensemble_members(path)
        first = str(members[0]) if members else path
        reward_model_dir(first, f"reward term {term.name!r}: reward_model.path")  # before its tokenizer loads
        scorer = RewardModelScorer(path, load_tokenizer(first), batch_size=rm.batch_size, normalise=rm.normalise,
                                   max_length=rm.max_length, device=device, aggregate=rm.aggregate,
                                   aggregate_cfg=rm.aggregate.settings, transform=rm.transform,
                                   transform_cfg=rm.transform.settings)
        if rm.co_evolve is not None:
            from reinforge.rewards.co_evolve import CoEvolvingRewardModel

            co = rm.co_evolve
            return CoEvolvingRewardModel(scorer, resolve_verifier(co.verifier), threshold=rm.threshold, lr=co.lr,
                                         pairs_per_group=co.pairs_per_group, batch_size=co.batch_size, seed=co.seed)
        return RewardModelVerifier(scorer, threshold=rm.threshold)
    assert term.judge is not None  # exactly one source, checked by RewardTermConfig
    return build_judge(term.judge)


def build_judge(j: JudgeConfig) -> Verifier:
    """The judge of a ``judge`` section by its ``mode``: ``LLMJudge`` (pointwise), ``GroupJudge`` or
    ``PairwiseJudge``; an unset rubric or pattern is the mode's default."""
    client = dict(api_key=j.api_key, max_tokens=j.max_tokens, timeout_s=j.timeout_s, max_retries=j.max_retries)
    if j.mode == "pointwise":
        from reinforge.rewards.judge import DEFAULT_RUBRIC, DEFAULT_SCORE_PATTERN, LLMJudge

        return LLMJudge(j.base_url, j.model, j.rubric or DEFAULT_RUBRIC, score_pattern=j.score_pattern or
                        DEFAULT_SCORE_PATTERN, scale=j.scale, threshold=j.threshold, **client)
    from reinforge.rewards import judge_group as g

    if j.mode == "group":
        return g.GroupJudge(j.base_url, j.model, j.rubric or g.DEFAULT_GROUP_RUBRIC, scale=j.scale,
                            threshold=j.threshold, **client)
    return g.PairwiseJudge(j.base_url, j.model, j.rubric or g.DEFAULT_PAIRWISE_RUBRIC,
                           verdict_pattern=j.verdict_pattern or g.DEFAULT_VERDICT_PATTERN, swap=j.swap,
                           max_pairs=j.max_pairs, pair_seed=j.pair_seed, concurrency=j.concurrency,
                           threshold=j.threshold, **client)
