"""One rollout path: collectors by episode kind, evaluation through them, multi-turn rewards in the
reward pool, and reward shapers as registered parts."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

from reinforge.algo.shaping import REWARD_SHAPERS, ShapeInputs
from reinforge.config import EnvConfig, RolloutConfig, load_config
from reinforge.envs.registry import build_environment
from reinforge.errors import ConfigError
from reinforge.eval.heldout import evaluate
from reinforge.orchestrate.collectors import (
    MultiTurn,
    SingleTurn,
    build_collector,
    greedy_baseline,
    play,
    sampling_params,
)
from reinforge.orchestrate.multi_turn import EpisodeLimits
from reinforge.rewards.pool import FailedReward, VerifierError, VerifierPool
from reinforge.rewards.verifiers import RewardResult, exact_match, numeric_match
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task


@pytest.fixture(scope="module")
def tiny(tiny_tokenizer):
    from reinforge.assets import resolve_model_path
    from reinforge.models.loading import load_model

    return TorchRolloutEngine(load_model(str(resolve_model_path("tiny-base"))), tiny_tokenizer, seed=0)


def _tasks(n: int) -> list[Task]:
    from reinforge.data.arithmetic import arithmetic_splits

    return list(arithmetic_splits(digits=2, heldout_size=n, seed=3).heldout)


@pytest.mark.slow
def test_evaluation_through_the_collector_equals_the_plain_single_turn_player(tiny):
    """The collector's player (environment reset + reward pool) scores exactly what the verifier-only
    single-turn player scores: same greedy accuracy, same mean@n, pass@k and maj@k."""
    tasks = _tasks(24)
    with VerifierPool(numeric_match, workers=2) as pool:
        make_env = build_environment("single_turn", pool.as_verifier(), None)
        collector = SingleTurn(tiny, make_env, pool)
        results = []
        for player in (play(collector), None):
            tiny.generator.manual_seed(5)
            results.append(evaluate(tiny, tasks, numeric_match, 8, samples=4, ks=(1, 4), player=player))
    a, b = results
    assert a.greedy_accuracy == b.greedy_accuracy and a.mean_at_n == b.mean_at_n
    assert a.pass_at_k == b.pass_at_k and a.maj_at_k == b.maj_at_k


def test_greedy_baseline_is_one_reward_per_task(tiny):
    tasks = _tasks(5)
    with VerifierPool(numeric_match, workers=1) as pool:
        collector = SingleTurn(tiny, build_environment("single_turn", pool.as_verifier(), None), pool)
        params = SamplingParams(max_new_tokens=6, n=4)
        baseline = greedy_baseline(collector, tasks, params, seed=1)
        again = greedy_baseline(collector, tasks, params, seed=2)
    assert len(baseline) == 5 and baseline == again  # greedy: the same whatever the seed
    assert set(baseline) <= {0.0, 1.0}


def test_the_environment_declares_the_collector(tiny):
    with VerifierPool(exact_match, workers=1) as pool:
        make = build_environment("retry", pool.as_verifier(), None)
        kinds = {name: type(build_collector(EnvConfig(name=name), RolloutConfig(), tiny, make, pool, 64)).__name__
                 for name in ("single_turn", "retry", "calculator")}
    assert kinds == {"single_turn": "SingleTurn", "retry": "MultiTurn", "calculator": "MultiTurn"}


# ---- multi-turn rewards go through the reward pool ---------------------------------------------


def _broken(task: Task, completion: str) -> RewardResult:
    raise RuntimeError("verifier bug")


def _slow(task: Task, completion: str) -> RewardResult:
    time.sleep(2.0)
    return RewardResult(1.0, True)


def _multi_turn_episodes(verifier, on_error: str, timeout_s: float = 30.0):
    tok = ascii_chat_tokenizer()
    engine = TorchRolloutEngine(tiny_random_llama(tok), tok, "cpu", seed=0)
    with VerifierPool(verifier, workers=1, timeout_s=timeout_s, on_error=on_error) as pool:
        make_env = build_environment("retry", pool.as_verifier(), None, {"max_attempts": 2})
        collected = MultiTurn(engine, make_env, EpisodeLimits(max_turns=2, max_turn_tokens=4)).collect(
            [Task("t0", "1+1=", "2")], SamplingParams(max_new_tokens=4, n=2), seed=0)
        return collected.trajectories, dict(pool.stats)


def test_a_failed_reward_in_an_episode_is_zeroed_and_marked():
    trajs, stats = _multi_turn_episodes(_broken, "zero")
    assert len(trajs) == 2 and stats["errors"] == 4  # 2 episodes x 2 attempts, every call counted
    for t in trajs:
        assert t.reward == 0.0 and t.metadata["reward_status"] == "error"
        assert "verifier bug" in t.metadata["reward_error"]


def test_a_failed_reward_in_an_episode_stops_the_run_with_raise():
    with pytest.raises(VerifierError, match="verifier bug"):
        _multi_turn_episodes(_broken, "raise")


def test_a_hung_reward_in_an_episode_times_out():
    t0 = time.perf_counter()
    trajs, stats = _multi_turn_episodes(_slow, "zero", timeout_s=0.2)
    assert stats["timeouts"] >= 1 and all(t.metadata["reward_status"] == "timeout" for t in trajs)
    assert time.perf_counter() - t0 < 8.0  # never the verifier's 2 s per call, 4 calls in a row


def test_pooled_verifier_returns_the_result_or_a_failed_reward():
    with VerifierPool(exact_match, workers=1) as pool:
        assert pool.as_verifier()(Task("t", "p", "4"), "4") == RewardResult(1.0, True, "4")
    with VerifierPool(_broken, workers=1, on_error="zero") as pool:
        out = pool.as_verifier()(Task("t", "p", "4"), "4")
    assert isinstance(out, FailedReward) and (out.reward, out.correct, out.status) == (0.0, False, "error")


# ---- reward shapers ----------------------------------------------------------------------------


def _inputs(lengths, truncated=None) -> ShapeInputs:
    n = len(lengths)
    return ShapeInputs(rewards=torch.ones(n, dtype=torch.float64), lengths=torch.tensor(lengths),
                       truncated=torch.tensor(truncated or [False] * n), group_index=torch.zeros(n, dtype=torch.long),
                       max_new_tokens=10)


def test_overlong_penalty_shaper_hand_values():
    """L_max = 10, buffer 0.4 -> L_cache = 4: 0 up to 6 tokens, then -(L - 6) / 4, -1 beyond 10."""
    settings = REWARD_SHAPERS.entry("overlong_penalty").make_settings({"buffer": 0.4}, "test")
    out = REWARD_SHAPERS.call("overlong_penalty", _inputs([5, 6, 8, 10, 12]), settings)
    assert out.trainable is None
    np.testing.assert_allclose(out.reward.numpy(), [0.0, 0.0, -0.5, -1.0, -1.0])


def test_overlong_filter_shaper_masks_truncated():
    out = REWARD_SHAPERS.call("overlong_filter", _inputs([3, 10], [False, True]), None)
    assert out.reward is None and out.trainable.tolist() == [True, False]


def test_reward_shaper_settings_are_validated_with_the_field_named():
    with pytest.raises(ConfigError, match="buffer"):
        load_config(None, ["algo.reward_shapers=[{name: overlong_penalty, buffer: 2}]"])
    with pytest.raises(ConfigError, match="reward shaper"):
        load_config(None, ["algo.reward_shapers=[{name: no_such_shaper}]"])


def test_sampling_params_follow_the_rollout_section():
    p = sampling_params(RolloutConfig(group_size=3, temperature=0.7, max_new_tokens=9))
    assert (p.n, p.temperature, p.max_new_tokens, p.greedy) == (3, 0.7, 9, False)


@pytest.mark.slow
def test_eval_with_a_multi_turn_recipe_plays_its_episodes(tmp_path):
    """``reinforge eval --recipe`` evaluates the way training does: the retry recipe's episodes (up to 3
    attempts), not one completion. Greedy decoding: the first attempt is the single-turn answer, so
    episodes score at least as well, and exactly what the collector's player scores in process."""
    from reinforge.assets import resolve_model_path
    from reinforge.data.sources import build_task_splits
    from reinforge.eval.cli_eval import run_eval
    from reinforge.models.loading import load_model, load_tokenizer

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {path: tiny-agent}\ntask: {kind: arithmetic, heldout_size: 24, verifier: exact_match}\n"
                      "env: {name: retry, max_attempts: 3, max_turns: 3, max_turn_tokens: 5}\n"
                      "rollout: {max_new_tokens: 5}\n")
    episodes = run_eval(["tiny-agent"], "arithmetic", None, 0, 1.0, 5, 24, 0, recipe=str(recipe))
    single = run_eval(["tiny-agent"], "arithmetic", None, 0, 1.0, 5, 24, 0)
    multi_acc = episodes["models"]["tiny-agent"]["greedy_accuracy"]
    assert multi_acc >= single["models"]["tiny-agent"]["greedy_accuracy"]
    path = str(resolve_model_path("tiny-agent"))
    engine = TorchRolloutEngine(load_model(path), load_tokenizer(path), seed=0)
    with VerifierPool(exact_match, workers=1) as pool:
        make_env = build_environment("retry", pool.as_verifier(), None, {"max_attempts": 3})
        collector = MultiTurn(engine, make_env, EpisodeLimits(max_turns=3, max_total_tokens=2048, max_turn_tokens=5))
        heldout = build_task_splits(load_config(recipe).task).heldout  # the recipe's split
        expected = evaluate(engine, heldout, None, 5, player=play(collector)).greedy_accuracy
    assert multi_acc == expected


def test_the_flat_overlong_keys_say_where_they_moved():
    with pytest.raises(ConfigError, match=r"algo.overlong_buffer: moved: use algo.reward_shapers: "
                                          r"\[\{name: overlong_penalty, buffer: 0.25\}\]"):
        load_config(None, ["algo.overlong_buffer=0.25"])
    with pytest.raises(ConfigError, match=r"algo.overlong_filter: moved: .*\{name: overlong_filter\}"):
        load_config(None, ["algo.overlong_filter=true"])
