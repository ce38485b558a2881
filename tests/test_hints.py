"""Guidance by hints (orchestrate/hints.py, algo/hint_losses.py): GHPO's staged hints and Guide's
importance-corrected hinted samples, against hand-computed values, and one short run through the loop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from reinforge.algo.hint_losses import GuideSettings, guide_loss, shaped_ratio
from reinforge.orchestrate.collectors import Collected
from reinforge.orchestrate.hint_stage import HintStage, unguided_row
from reinforge.orchestrate.hints import HINTS, HintPlan, failed_groups, hint_source, hint_text, with_hint
from reinforge.orchestrate.rollouts import Rollout
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory


def _row(group: int, task: str, correct: bool, prompt=(7, 8)) -> Trajectory:
    return Trajectory([*prompt, 1, 2], [0] * len(prompt) + [1, 1], [0.0] * len(prompt) + [-0.5, -0.25], 0, group,
                      task, reward=float(correct), metadata={"correct": correct})


def test_hint_is_the_first_round_omega_len_characters_of_the_source():
    assert [hint_text("579", w) for w in (0.25, 0.5, 0.75, 1.0)] == ["5", "57", "57", "579"]  # round(.75, 1.5, 2.25)
    assert hint_text("abcdefgh", 0.25) == "ab" and hint_text("abc", 0.1) == ""
    task = Task("t", [{"role": "user", "content": "1+2="}], "3", {"solution": "1+2 is 3"})
    assert hint_source(task, "solution") == "1+2 is 3" and hint_source(task, "hint") == "3"  # else the answer
    assert with_hint(task, " h").prompt == [{"role": "user", "content": "1+2= h"}]
    assert task.prompt[0]["content"] == "1+2="  # the task itself is unchanged
    assert with_hint(Task("s", "Q:", "1"), "x").prompt == "Q:x"


def test_ghpo_and_guide_plans():
    ghpo = HINTS.entry("ghpo")
    plan = ghpo.fn(ghpo.settings())
    assert plan.fractions == (0.25, 0.5, 0.75) and not plan.unguided and plan.source == "solution"
    guide = HINTS.entry("guide")
    plan = guide.fn(guide.settings(fraction=0.5, placement="response"))
    assert plan == HintPlan((0.5,), True, "hint", "response", plan.template)
    with pytest.raises(ValueError, match="increasing"):
        ghpo.settings(fractions=[0.5, 0.25])


def test_only_groups_without_a_correct_row_get_hints():
    kept = [_row(0, "a", False), _row(0, "a", False), _row(1, "b", True), _row(1, "b", False), _row(2, "c", False)]
    demo = _row(3, "d", False)
    demo.demonstration = True
    own = _row(-1, "e", False)
    assert failed_groups([*kept, demo, own]) == {0: [0, 1], 2: [4]}


def test_unguided_row_puts_a_response_hint_among_the_trained_tokens_with_behaviour_probability_one():
    hinted = Trajectory([7, 8, 5, 1, 2], [0, 0, 0, 1, 1], [0, 0, 0, -0.5, -0.25], 3, 0, "a",
                        token_versions=[-1, -1, -1, 3, 3])
    row = unguided_row(hinted, [7, 8], [5])
    assert row.token_ids == [7, 8, 5, 1, 2] and row.loss_mask == [0, 0, 1, 1, 1]
    assert row.logprobs == [0.0, 0.0, 0.0, -0.5, -0.25] and row.token_versions == [-1, -1, -1, 3, 3]
    assert row.metadata["hinted"] and row.metadata["hint_tokens"] == 1
    prompt_hint = Trajectory([7, 8, 9, 9, 1, 2], [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, -0.5, -0.25], 3, 0, "a")
    row = unguided_row(prompt_hint, [7, 8], [])  # a prompt hint is dropped: the unguided prompt + completion
    assert row.token_ids == [7, 8, 1, 2] and row.loss_mask == [0, 0, 1, 1] and row.logprobs == [0, 0, -0.5, -0.25]


def test_guide_loss_weighs_hinted_tokens_by_the_shaped_ratio_to_the_hinted_context():
    p = torch.tensor([[0.5, 0.25], [0.5, 0.2]])
    logp = torch.log(p).requires_grad_(True)
    old = torch.log(torch.tensor([[0.25, 0.25], [0.5, 0.5]]))  # row 0: ratios 2 and 1
    sampling = torch.log(torch.tensor([[0.25, 0.25], [0.25, 0.1]]))  # row 1 hinted: w = 2, 2
    adv, mask, hinted = torch.tensor([[1.0, 1.0], [2.0, 2.0]]), torch.ones(2, 2), torch.tensor([False, True])
    loss, metrics = guide_loss(logp, old, sampling, adv, mask, hinted, GuideSettings(shaping="constant", gamma=1.0))
    # unhinted: -min(2 * 1, 1.2 * 1) = -1.2 (clipped), -1; hinted: -A w / (w + 1) = -2 * 2/3, no clip
    assert_close(loss, torch.tensor([[-1.2, -1.0], [-4 / 3, -4 / 3]]))
    loss.sum().backward()
    # d/dlogp of -A w/(w+g) = -A g w / (w+g)^2 = -2 * 2/9
    assert_close(logp.grad[1], torch.tensor([-4 / 9, -4 / 9]))
    assert_close(metrics["guided/ratio"][0][1], torch.tensor([2.0, 2.0]))
    none, _ = guide_loss(logp, old, sampling, adv, mask, hinted, GuideSettings(shaping="none"))
    assert_close(none[1], torch.tensor([-4.0, -4.0]))  # -A w
    plain, _ = guide_loss(logp, old, sampling, adv, mask, None, GuideSettings())
    assert_close(plain[1], torch.tensor([-2.0, -0.8]))  # no hinted row: the clipped surrogate on old_logp


def test_percentile_gamma_is_the_quantile_of_the_hinted_tokens_ratios():
    ratio = torch.tensor([[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]])
    rows = torch.tensor([[True, True], [True, True], [False, False]])
    shaped, gamma = shaped_ratio(ratio, rows, GuideSettings(shaping="percentile", gamma=0.9))
    assert_close(gamma, torch.tensor(3.7))  # position 0.9 * 3 = 2.7 of [1, 2, 3, 4]: 3 + 0.7
    assert_close(shaped[0], torch.tensor([1 / 4.7, 2 / 5.7]))


class FakeCollector:
    """Samples ``n`` rows of the hinted prompt's length; a row is correct when its task's hint has at least
    ``solve_at`` characters (the prompt grows with the hint)."""

    def __init__(self, solve_at: int) -> None:
        self.solve_at, self.calls, self.pool, self.engine = solve_at, [], object(), object()

    def collect(self, tasks, params, seed, group_offset=0, independent=False):
        task = tasks[0]
        self.calls.append((task.prompt, params.n, independent))
        correct = len(task.prompt) - len("Q:") >= self.solve_at
        return Collected([Trajectory([7] * len(task.prompt) + [1], [0] * len(task.prompt) + [1],
                                     [0.0] * len(task.prompt) + [-0.1], 0, group_offset, task.id,
                                     reward=float(correct), metadata={"correct": correct})
                          for _ in range(params.n)])


def test_ghpo_stage_raises_the_hint_stage_by_stage_until_the_group_is_solved():
    tasks = {"a": Task("a", "Q:", "1234", {"solution": "abcdefgh"}), "b": Task("b", "Q:", "9")}
    kept = [_row(0, "a", False), _row(0, "a", False), _row(1, "b", True), _row(1, "b", False)]
    collector = FakeCollector(solve_at=4)
    shaped = []
    plan = HintPlan((0.25, 0.5, 0.75), False, "solution", "prompt", "{hint}")
    stage = HintStage(plan, collector, SamplingParams(n=2), shaped.extend)
    rollout = Rollout(sampled=list(kept), kept=list(kept))
    metrics = stage.run(rollout, tasks, step=1)
    # group 0: "ab" (2 chars) fails, "abcd" (4) solves: two stages; group 1 had a correct row
    assert [c[0] for c in collector.calls] == ["Q:ab", "Q:abcd"] and all(c[2] for c in collector.calls)
    # two stages of group 0's 2 rows: 4 rows generated again
    assert metrics == {"hints/groups": 1.0, "hints/fraction": 0.5, "hints/solved_groups": 1.0, "hints/reward": 1.0,
                       "hints/samples": 4.0}
    assert [t.group_id for t in rollout.kept] == [0, 0, 1, 1] and rollout.kept[2:] == kept[2:]
    assert all(t.metadata["hint_fraction"] == 0.5 and not t.metadata.get("hinted") for t in rollout.kept[:2])
    assert len(shaped) == 4  # both stages' rows were reward-shaped
    assert rollout.sampled == kept  # the step's own samples are untouched


def test_guide_stage_trains_the_hinted_rows_on_the_unguided_prompt():
    tasks = {"a": Task("a", "Q:", "1234", {"hint": "abcd"})}
    kept = [_row(0, "a", False, prompt=(7, 7))]
    plan = HintPlan((1.0,), True, "hint", "prompt", "{hint}")
    rollout = Rollout(kept=list(kept))
    metrics = HintStage(plan, FakeCollector(solve_at=4), SamplingParams(n=1)).run(rollout, tasks, step=1)
    row = rollout.kept[0]
    assert row.token_ids == [7, 7, 1] and row.loss_mask == [0, 0, 1] and row.logprobs == [0.0, 0.0, -0.1]
    assert row.metadata["hinted"] and metrics["hints/groups"] == 1.0


def test_hint_stage_config_checks():
    from reinforge.config import load_config
    from reinforge.errors import ConfigError
    from reinforge.orchestrate.hint_stage import hint_stage

    single = SimpleNamespace(pool=object(), engine=object())
    c = SimpleNamespace(cfg=load_config(None, ["rollout.hints={name: guide}"]), sampling_params=SamplingParams)
    with pytest.raises(ConfigError, match="policy_loss: guide"):
        hint_stage(c, single)
    c.cfg = load_config(None, ["rollout.hints=ghpo", "algo.dynamic_sampling=true"])
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        hint_stage(c, single)
    c.cfg = load_config(None, ["rollout.hints=ghpo"])
    with pytest.raises(ConfigError, match="single-turn"):
        hint_stage(c, SimpleNamespace())
    assert hint_stage(c, single).plan.fractions == (0.25, 0.5, 0.75)


def test_hinted_samples_are_generated_and_trained_on(tmp_path):
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    extra = ["algo.policy_loss=guide", "rollout.hints={name: guide, placement: response, fraction: 0.67}"]
    cfg = load_config(None, [f"output_dir={tmp_path}", "train.steps=1", "rollout.prompts_per_step=2",
                             "rollout.group_size=4", "task.digits=3", "task.heldout_size=4", "eval.every=0",
                             "eval.final_samples=0", "log.report=false", "checkpoint.every=0",
                             "algo.skip_equal_reward_groups=false", *extra])
    rows = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert rows[0]["hints/groups"] >= 1  # tiny-base solves no 3-digit sum unaided
    assert 0 <= rows[0]["hints/reward"] <= 1
    assert rows[0]["train/guided/ratio"] > 0  # the hinted rows were trained with their importance ratio
