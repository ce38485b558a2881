"""VinePPO's re-rollouts (orchestrate/state_values.py, rollout/continuation.continue_budgeted,
SingleTurn.continue_states): cut points, distinct states continued once, one engine call per step,
budgets, the values written to each trajectory and to the batch; the config's refusals."""

from __future__ import annotations

import pytest
import torch

from reinforge.config import config_from_dict
from reinforge.envs.registry import build_environment
from reinforge.errors import ConfigError
from reinforge.orchestrate.batch_fields import state_value_tensors
from reinforge.orchestrate.collectors import Continued, SingleTurn
from reinforge.orchestrate.episodes import build_batch
from reinforge.orchestrate.state_values import CutSettings, StateValues, cut_points, cut_settings
from reinforge.rewards.pool import VerifierPool
from reinforge.rewards.verifiers import exact_match
from reinforge.rollout.continuation import continue_budgeted
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import Generation, SamplingParams
from reinforge.types import Task, Trajectory

CHARS = {10: "a", 11: "b", 12: "\n", 13: " "}


def _decode(ids, **_):
    return "".join(CHARS[i] for i in ids)


@pytest.fixture(scope="module")
def tiny(tiny_tokenizer):
    from reinforge.models.loading import load_model

    return TorchRolloutEngine(load_model("tiny-base"), tiny_tokenizer, seed=0)


class CountingEngine:
    """The tiny engine, counting its generate calls."""

    def __init__(self, engine) -> None:
        self.inner, self.calls = engine, []
        self.tokenizer, self.model = engine.tokenizer, engine.model

    def generate(self, requests, params):
        self.calls.append((len(requests), params.n, params.max_new_tokens))
        return self.inner.generate(requests, params)


def test_cut_points_by_tokens_and_the_cap():
    gen = [10, 11, 10, 11, 10]
    assert cut_points(gen, _decode, CutSettings(9, "tokens", 1, 20)) == [1, 2, 3, 4]
    assert cut_points(gen, _decode, CutSettings(9, "tokens", 2, 20)) == [2, 4]
    assert cut_points(gen, _decode, CutSettings(9, "tokens", 1, 2)) == [1, 2]
    assert cut_points(gen, _decode, CutSettings(9, "tokens", 1, 0)) == []


def test_cut_points_after_each_line_a_blank_line_joins_the_next():
    # "ab\n" "\n" "a\n" "b"  -> steps end after tokens 2 and 4 (the blank line's newline joins "a\n")
    gen = [10, 11, 12, 12, 10, 12, 11]
    assert cut_points(gen, _decode, CutSettings(9, "newline", 1, 20)) == [3, 6]
    assert cut_points(gen, _decode, CutSettings(9, "newline", 1, 1)) == [3]
    assert cut_points([10, 11, 12], _decode, CutSettings(9, "newline", 1, 20)) == []  # the last line ends it
    assert cut_points([12, 10, 12, 10], _decode, CutSettings(9, "newline", 1, 20)) == [3]  # a leading newline


def test_continuations_share_one_engine_call_and_keep_each_budget(tiny):
    engine = CountingEngine(tiny)
    tok = tiny.tokenizer
    prompt = tok("1+2=", add_special_tokens=False)["input_ids"]
    prefixes = [[], tok("3", add_special_tokens=False)["input_ids"] * 3, tok("1", add_special_tokens=False)["input_ids"] * 5]
    tiny.generator.manual_seed(0)
    gens, decoded = continue_budgeted(engine, [prompt] * 3, prefixes, SamplingParams(max_new_tokens=6, n=4))
    assert engine.calls == [(3, 4, 6)]  # every state, K = 4 each, at the largest budget (6 - 0)
    assert len(gens) == 12 and decoded >= sum(len(g.token_ids) for g in gens)
    for i, g in enumerate(gens):
        prefix = prefixes[i // 4]
        assert len(g.token_ids) <= 6 - len(prefix)
        if len(g.token_ids) == 6 - len(prefix) and tok.eos_token_id not in g.token_ids:
            assert g.finish_reason == "length"
        assert g.text == tok.decode(prefix + g.token_ids, skip_special_tokens=True)
    gens, _ = continue_budgeted(engine, [prompt] * 3, prefixes, SamplingParams(max_new_tokens=6, n=2, ignore_eos=True))
    assert [len(g.token_ids) for g in gens] == [6, 6, 3, 3, 1, 1]  # cut to 6 - len(prefix)
    assert all(g.finish_reason == "length" for g in gens)


class FixedEngine:
    """Writes token 7 ('3') up to the limit; a model context of ``context`` positions. Records its calls."""

    def __init__(self, tokenizer, context: int) -> None:
        self.tokenizer, self.calls = tokenizer, []
        self.model = type("M", (), {"config": type("C", (), {"max_position_embeddings": context})()})()

    def generate(self, requests, params):
        self.calls.append((len(requests), params.n, params.max_new_tokens))
        return [Generation(r.request_id, r.prompt_ids, [7] * params.max_new_tokens, [-0.1] * params.max_new_tokens,
                           "length", 0, sample_index=c) for r in requests for c in range(params.n)]


def test_a_call_per_budget_when_one_would_exceed_the_context_and_stop_strings_across_the_prefix(tiny_tokenizer):
    engine = FixedEngine(tiny_tokenizer, context=10)
    gens, decoded = continue_budgeted(engine, [[1, 5, 14, 5]] * 2, [[], [4, 4, 4]], SamplingParams(max_new_tokens=6))
    assert engine.calls == [(1, 1, 3), (1, 1, 6)] and decoded == 9  # 4 + 3 + 6 > 10: one call per budget
    assert [len(g.token_ids) for g in gens] == [6, 3]
    engine = FixedEngine(tiny_tokenizer, context=64)
    gens, _ = continue_budgeted(engine, [[1, 5]] * 2, [[4], [7]], SamplingParams(max_new_tokens=5, stop=("33",)))
    assert engine.calls == [(2, 1, 4)]
    assert gens[0].token_ids == [7, 7] and gens[0].finish_reason == "stop"  # "0" + "33": the stop ends in it
    assert gens[1].token_ids == [7] and gens[1].finish_reason == "stop" and gens[1].text == "33"  # "3" + "3"


def _traj(prompt, gen, task_id, group):
    return Trajectory(token_ids=prompt + gen, loss_mask=[0] * len(prompt) + [1] * len(gen),
                      logprobs=[0.0] * (len(prompt) + len(gen)), version=0, group_id=group, task_id=task_id,
                      reward=1.0)


class ScriptedCollector:
    """Continuations scored by a fixed rule: reward 1 for a prefix ending in token 10, else 0.5."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def continue_states(self, tasks, prompts, prefixes, params):
        self.calls.append((list(prompts), list(prefixes), params.n))
        return Continued([[1.0 if p and p[-1] == 10 else 0.5] * params.n for p in prefixes], 7 * len(prompts))


def test_distinct_states_are_continued_once_and_written_to_each_trajectory(tiny):
    col = ScriptedCollector(tiny)
    trajs = [_traj([1, 5], [10, 11, 2], "a", 0), _traj([1, 5], [10, 12, 2], "a", 0), _traj([1, 6], [10, 11, 2], "b", 1)]
    tasks = {"a": Task("a", "x", "1"), "b": Task("b", "y", "2")}
    metrics = StateValues(col, CutSettings(3, "tokens", 1, 20))(tasks, trajs, SamplingParams(max_new_tokens=8, n=2))
    (prompts, prefixes, k), = col.calls
    # task a: the prompt, [10], [10, 11], [10, 12] (the first two shared by its two samples); task b: three
    assert k == 3 and len(prefixes) == 7 and prefixes[:4] == [[], [10], [10, 11], [10, 12]]
    assert prompts[0] == [1, 5] and prompts[-1] == [1, 6]
    assert trajs[0].metadata["state_values"] == [[2, 0.5], [3, 1.0], [4, 0.5]]
    assert metrics["rollout/state_values/states"] == 7.0 and metrics["rollout/state_values/continuations"] == 21.0
    assert metrics["rollout/state_values/tokens_generated"] == 49.0 and metrics["rollout/state_values/cuts_mean"] == 2.0
    values, mask = state_value_tensors(trajs, 6)
    assert mask[0].tolist() == [0, 0, 1, 1, 1, 0] and values[0].tolist() == [0, 0, 0.5, 1.0, 0.5, 0]


def test_the_stage_on_the_tiny_model_scores_continuations_with_the_pool(tiny):
    tasks = [Task("t", [{"role": "user", "content": "1+2="}], "3")]
    with VerifierPool(exact_match, workers=1) as pool:
        collector = SingleTurn(tiny, build_environment("single_turn", pool.as_verifier(), None), pool)
        params = SamplingParams(max_new_tokens=4, n=2)
        trajs = collector.collect(tasks, params, seed=0).trajectories
        metrics = StateValues(collector, CutSettings(4, "tokens", 1, 20))({"t": tasks[0]}, trajs, params)
    for t in trajs:
        start = t.loss_mask.index(1)
        positions = [p for p, _ in t.metadata["state_values"]]
        assert positions == list(range(start, start + min(t.num_generated, 4)))[: len(positions)]
        assert positions[0] == start and all(v in (0.0, 0.25, 0.5, 0.75, 1.0) for _, v in t.metadata["state_values"])
    assert metrics["rollout/state_values/tokens_generated"] > 0


def test_the_batch_carries_the_values_when_the_estimator_needs_them():
    cfg = config_from_dict({"algo": {"advantage": {"name": "vineppo", "step_split": "tokens", "rollouts": 3},
                                     "skip_equal_reward_groups": False}})
    t = _traj([1, 5], [10, 11, 2], "a", 0)
    t.metadata["state_values"] = [[2, 0.25], [3, 0.5]]
    batch, _ = build_batch([t], cfg.algo, pad_id=0)
    assert batch.state_mask[0].tolist() == [0, 0, 1, 1, 0]
    torch.testing.assert_close(batch.state_values[0], torch.tensor([0, 0, 0.25, 0.5, 0]))
    assert cut_settings(cfg.algo) == CutSettings(3, "tokens", 1, 20)
    assert cut_settings(config_from_dict({}).algo) is None


@pytest.mark.parametrize(("overrides", "field"), [
    ({"env": {"name": "retry"}, "model": {"path": "tiny-agent"}}, "env.name"),
    ({"algo": {"skip_equal_reward_groups": True}}, "skip_equal_reward_groups"),
])
def test_the_config_refuses_what_cannot_be_estimated(overrides, field):
    algo = {"advantage": {"name": "vineppo"}, "skip_equal_reward_groups": False}
    raw = {**overrides, "algo": {**algo, **overrides.get("algo", {})}}
    with pytest.raises((ConfigError, ValueError), match=field):
        config_from_dict(raw)


def test_an_asynchronous_run_estimates_state_values_in_the_learner_process():
    """The state-values stage runs after collection in the learner's process (orchestrate/stages.py)."""
    algo = {"advantage": {"name": "vineppo"}, "skip_equal_reward_groups": False}
    assert config_from_dict({"orchestrate": {"mode": "async"}, "algo": algo}).orchestrate.mode == "async"


def test_a_collector_that_cannot_continue_is_refused():
    with pytest.raises(ConfigError, match="state_values"):
        StateValues(object(), CutSettings(3))
