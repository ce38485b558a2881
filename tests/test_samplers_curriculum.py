"""Task samplers that learn from the run (issue 18): per-prompt statistics, difficulty filtering, DUMP, InSight.

Hand-computed values are worked out in the comments; every sampler resumes exactly from its state."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_docs_metrics import _undocumented

from reinforge.config import load_config
from reinforge.data.arithmetic import arithmetic_splits
from reinforge.data.curriculum import DifficultyFilterSampler, DumpSampler, DumpSettings, FilterSettings
from reinforge.data.insight import (
    InsightSampler,
    InsightSettings,
    beta_binomial_information,
    digamma,
    insight_scores,
)
from reinforge.data.prompt_stats import PromptStats
from reinforge.data.samplers import build_task_sampler
from reinforge.errors import ConfigError
from reinforge.types import Task, Trajectory


def traj(task_id: str, group_id: int, reward: float, correct: bool | None = None, **kw) -> Trajectory:
    meta = {} if correct is None else {"correct": correct}
    return Trajectory([1, 2], [0, 1], [0.0, -0.5], 0, group_id, task_id, reward=reward, metadata=meta, **kw)


def group(task_id: str, group_id: int, outcomes: list[int]) -> list[Trajectory]:
    return [traj(task_id, group_id, float(o), bool(o)) for o in outcomes]


def outcomes_of(task: Task) -> list[int]:
    """A fixed fake policy on the 1-digit grid: (a + b) % 3 == 0 all right, == 1 all wrong, == 2 mixed."""
    kind = (task.metadata["a"] + task.metadata["b"]) % 3
    return [1, 1, 1, 1] if kind == 0 else [0, 0, 0, 0] if kind == 1 else [1, 0, 1, 0]


def play(sampler, tasks: list[Task]) -> None:
    sampler.observe([t for g, task in enumerate(tasks) for t in group(task.id, g, outcomes_of(task))])


def json_round_trip(state: dict) -> dict:
    return json.loads(json.dumps(state))  # state.json of a checkpoint


# ------------------------------------------------------------------------------ per-prompt statistics
def test_prompt_stats_update_and_round_trip():
    stats = PromptStats(history=3)
    groups = stats.update(group("x", 0, [1, 0, 1, 1]) + group("y", 1, [0, 0])
                          + [traj("x", 0, 5.0, demonstration=True)])  # a demonstration row is not a sample
    assert [(g.task_id, g.outcome) for g in groups] == [("x", 0), ("y", -1)]
    x = stats.get("x")
    # rewards 1, 0, 1, 1: mean 3/4, E[r^2] = 3/4, variance 3/4 - 9/16 = 3/16
    assert (x.groups, x.samples, x.successes, x.last_step, x.recent) == (1, 4, 3, 1, [0])
    assert x.success_rate == 0.75 and x.reward_variance == pytest.approx(3 / 16)
    stats.update(group("x", 0, [1, 1]) + [traj("z", 3, 0.5)])  # no verdict: correct = reward > 0
    x = stats.get("x")
    assert (x.groups, x.samples, x.successes, x.last_step, x.recent) == (2, 6, 5, 2, [0, 1])
    assert stats.get("z").successes == 1 and stats.get("y").last_step == 1
    assert stats.zero_spread_streak("x") == 1 and stats.zero_spread_streak("y") == 1
    stats.update(group("x", 0, [1, 1]))
    stats.update(group("x", 0, [1, 1]))
    assert stats.get("x").recent == [1, 1, 1] and stats.zero_spread_streak("x") == 3  # history 3 kept
    assert stats.metrics()["sampler/prompts_seen"] == 3.0
    restored = PromptStats()
    restored.load_state_dict(json_round_trip(stats.state_dict()))
    assert restored.state_dict() == stats.state_dict() and restored.records == stats.records


# ------------------------------------------------------------------------------ resume exactness
SAMPLERS = {
    "difficulty_filter": lambda tasks: DifficultyFilterSampler(tasks, 3, FilterSettings(recheck_after=2)),
    "difficulty_filter_steps": lambda tasks: DifficultyFilterSampler(
        tasks, 3, FilterSettings(recheck_unit="steps", recheck_after=4, window=2)),
    "dump": lambda tasks: DumpSampler(tasks, 3, DumpSettings(bucket_key="difficulty")),
    "insight": lambda tasks: InsightSampler(tasks, 3, InsightSettings(decay=0.8)),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_resume_draws_exactly_what_the_uninterrupted_sampler_draws(name):
    tasks = arithmetic_splits(digits=1, heldout_size=10).train  # 90 tasks: several epochs in 12 steps
    make = SAMPLERS[name]
    straight, drawn = make(tasks), []
    for step in range(12):
        batch = straight.next_batch(16)
        play(straight, batch)
        straight.metrics()  # the loop asks for metrics every step (the filter resets its counter)
        if step == 4:
            state = json_round_trip(straight.state_dict())
        if step > 4:
            drawn.append([t.id for t in batch])
    resumed, again = make(tasks), []
    resumed.load_state_dict(state)
    for _ in range(7):
        batch = resumed.next_batch(16)
        play(resumed, batch)
        resumed.metrics()
        again.append([t.id for t in batch])
    assert again == drawn
    assert json_round_trip(resumed.state_dict()) == json_round_trip(straight.state_dict())
    assert len({i for b in drawn for i in b}) > 16  # not one batch over and over


# ------------------------------------------------------------------------------ difficulty filtering
def test_filter_skips_all_right_and_all_wrong_prompts_then_rechecks_them():
    tasks = list(arithmetic_splits(digits=1, heldout_size=10).train)
    mixed = {t.id for t in tasks if outcomes_of(t) == [1, 0, 1, 0]}
    sampler = DifficultyFilterSampler(tasks, 0, FilterSettings(recheck_after=2))
    first = sampler.next_batch(len(tasks))  # epoch 0: the whole split, nothing known yet
    assert sorted(t.id for t in first) == sorted(t.id for t in tasks)
    play(sampler, first)
    assert sampler.metrics()["sampler/filtered"] == len(tasks) - len(mixed)
    second = sampler.next_batch(len(mixed))  # epoch 1: only the prompts whose group had spread
    assert {t.id for t in second} == mixed and len(second) == len(mixed)
    play(sampler, second)
    skipped = sampler.metrics()["sampler/skipped"]  # the zero-spread prompts before the last mixed one
    third = sampler.next_batch(len(tasks))  # the rest of epoch 1 is skipped; epoch 2: drawn 2 epochs ago,
    assert sorted(t.id for t in third) == sorted(t.id for t in tasks)  # so every prompt is re-checked
    assert skipped + sampler.metrics()["sampler/skipped"] == len(tasks) - len(mixed)  # each skipped once


def test_filter_options_steps_window_and_what_to_skip():
    tasks = [Task(f"t{i}", "", "") for i in range(4)]  # t0 always right, t1 always wrong, t2, t3 mixed
    pattern = {"t0": [1, 1], "t1": [0, 0], "t2": [1, 0], "t3": [0, 1]}

    def step(sampler, n):
        batch = sampler.next_batch(n)
        sampler.observe([t for g, task in enumerate(batch) for t in group(task.id, g, pattern[task.id])])
        return sorted(t.id for t in batch)

    only_unsolved = DifficultyFilterSampler(tasks, 0, FilterSettings(skip_solved=False, recheck_unit="steps",
                                                                     recheck_after=10))
    assert step(only_unsolved, 4) == ["t0", "t1", "t2", "t3"]
    assert step(only_unsolved, 3) == ["t0", "t2", "t3"]  # t1 (all wrong) skipped, t0 (all right) kept
    by_steps = DifficultyFilterSampler(tasks, 0, FilterSettings(recheck_unit="steps", recheck_after=2, window=2))
    assert step(by_steps, 4) == ["t0", "t1", "t2", "t3"]
    assert step(by_steps, 4) == ["t0", "t1", "t2", "t3"]  # one zero-spread group is not enough with window 2
    assert step(by_steps, 2) == ["t2", "t3"]  # seen at step 2, now 2 - 2 = 0 < 2 steps: skipped
    assert step(by_steps, 2) == ["t2", "t3"]  # 3 - 2 = 1 < 2: still skipped
    assert step(by_steps, 4) == ["t0", "t1", "t2", "t3"]  # 4 - 2 = 2 steps: re-checked
    everything_solved = DifficultyFilterSampler(tasks[:1], 0, FilterSettings(recheck_after=100))
    step(everything_solved, 1)
    assert step(everything_solved, 3) == ["t0", "t0", "t0"]  # all filtered: drawn anyway, the run goes on


# ------------------------------------------------------------------------------ DUMP
def test_dump_ucb_picks_the_bucket_a_hand_computation_says():
    tasks = [Task(f"{s}{i}", "", "", {"source": s}) for s in "ABC" for i in range(5)]
    sampler = DumpSampler(tasks, 0, DumpSettings())
    # bucket A: one group 1,0,0,0: mean 1/4, unbiased std sqrt((9/16 + 3/16) / 3) = 1/2,
    #   |A| = 3/2, 1/2, 1/2, 1/2 -> window mean 3/4, n_A = 4
    # bucket B: two groups all right: |A| = 0 (8 values), n_B = 8; bucket C: never seen, n_C = 0
    sampler.observe(group("A0", 0, [1, 0, 0, 0]) + group("B0", 1, [1] * 4) + group("B1", 2, [1] * 4))
    # ln(12 + 1) = 2.564949; bonus_j = sqrt(2 * 2.564949 / (n_j + 1)): A 1.012907, B 0.754976, C 2.264928
    # UCB: A 1.762907, B 0.754976, C 2.264928; softmax(UCB / 0.1) = (0.006560, 2.75e-7, 0.993440)
    assert sampler.probabilities() == pytest.approx([0.006560, 2.75e-7, 0.993440], abs=2e-6)
    sampler.cfg.exploration = 0.0  # UCB = window means 0.75, 0, 0: softmax(/0.1) = (0.998895, 0.000552, 0.000552)
    assert sampler.probabilities() == pytest.approx([0.998895, 0.000552, 0.000552], abs=2e-6)
    batch = sampler.next_batch(20)
    assert sum(t.metadata["source"] == "A" for t in batch) >= 18
    first_pass = [t.id for t in batch if t.metadata["source"] == "A"][:5]
    assert sorted(first_pass) == [f"A{i}" for i in range(5)]  # a bucket is drawn without replacement per pass
    m = sampler.metrics()
    assert m["sampler/bucket_prob/A"] == pytest.approx(0.998895, abs=2e-6)
    assert m["sampler/bucket_abs_adv/A"] == pytest.approx(0.75, abs=1e-5) and m["sampler/bucket_abs_adv/C"] == 0.0


def test_dump_buckets_from_any_metadata_key_and_unlabelled_tasks():
    tasks = [Task("a", "", "", {"level": 1}), Task("b", "", "", {"level": 2}), Task("c", "", "", {})]
    sampler = DumpSampler(tasks, 0, DumpSettings(bucket_key="level"))
    assert sampler.buckets == ["-", "1", "2"]
    sampler.cfg.scale_by_std = False  # Dr. GRPO's r - mean: 1,0 -> |A| = 1/2, 1/2
    sampler.observe(group("a", 0, [1, 0]))
    assert sampler.windows[1] == [0.5, 0.5] and list(sampler.counts) == [0, 2, 0]


# ------------------------------------------------------------------------------ InSight
def test_insight_information_and_score_on_hand_computed_posteriors():
    # k = 1, Beta(1, 1): H[y] = ln 2; E H_b(p) = psi(3) - psi(2) = 1/2  ->  I = ln 2 - 1/2 = 0.193147
    # k = 1, Beta(2, 1): mu = 2/3, H_b(2/3) = 0.636514; E H_b(p) = psi(4) - 2/3 psi(3) - 1/3 psi(2)
    #   = (11/6) - (2/3)(3/2) - (1/3)(1) = 1/2  ->  I = 0.136514
    info = beta_binomial_information(np.array([1.0, 2.0]), np.array([1.0, 1.0]), 1)
    assert info.tolist() == pytest.approx([math.log(2) - 0.5, 0.636514 - 0.5], abs=1e-6)
    # the paper's Eq. 15 at target 0.3, eta 3: w(2/3) = (2/3)(1/3) exp(-3 (11/30)^2) = (2/9) exp(-0.403333)
    #   = 0.222222 * 0.668089 = 0.148464; score = 0.148464 * 0.136514 = 0.020267
    score = insight_scores(np.array([2.0]), np.array([1.0]), 1, 0.3, 3.0)
    assert score.item() == pytest.approx(0.020267, abs=1e-6)
    # mu = 1/2 at target 1/2: w = 1/4, the variance filter alone; Beta(1, 1), k = 1: 0.25 * 0.193147 = 0.048287
    assert insight_scores(np.array([1.0]), np.array([1.0]), 1, 0.5, 3.0).item() == pytest.approx(0.048287, abs=1e-6)
    # a prompt the belief says is always solved or never solved has weight 0 however little evidence it has
    assert insight_scores(np.array([1e-9, 1.0]), np.array([1.0, 1e-9]), 8, 0.3, 3.0) == pytest.approx([0, 0], abs=1e-6)
    # digamma: psi(1) = -gamma, psi(1/2) = -gamma - 2 ln 2, psi(10) = H_9 - gamma
    gamma = 0.5772156649015329
    assert digamma(np.array([1.0, 0.5, 10.0])).tolist() == pytest.approx(
        [-gamma, -gamma - 2 * math.log(2), sum(1 / i for i in range(1, 10)) - gamma], abs=1e-10)
    # k = 8, Beta(3, 5): the closed form against numerical integration over p (midpoint rule)
    p = (np.arange(200_000) + 0.5) / 200_000
    dens = p**2 * (1 - p) ** 4 / math.exp(math.lgamma(3) + math.lgamma(5) - math.lgamma(8))
    binom = np.array([math.comb(8, y) * p**y * (1 - p) ** (8 - y) for y in range(9)])  # [9, P]
    marginal = (binom * dens).mean(axis=1)
    cond_entropy = (-(binom * np.log(binom)).sum(axis=0) * dens).mean()
    expected = -(marginal * np.log(marginal)).sum() - cond_entropy
    got = beta_binomial_information(np.array([3.0]), np.array([5.0]), 8).item()
    assert got == pytest.approx(expected, abs=1e-6)
    # more evidence, less information: Beta(30, 50) has the same mean and a tenth of the information's scale
    assert beta_binomial_information(np.array([30.0]), np.array([50.0]), 8).item() < got / 3


def test_insight_posterior_update_and_selection():
    tasks = [Task(f"t{i}", "", "") for i in range(6)]
    defaults = InsightSettings()  # the paper's runs (Appendix D.2; mu* = 0.3 from its Section 7.3)
    assert (defaults.prior_alpha, defaults.prior_beta, defaults.decay) == (1.0, 1.0, 1.0)
    assert (defaults.target, defaults.sharpness, defaults.pool) == (0.3, 3.0, 16.0)
    sampler = InsightSampler(tasks, 0, InsightSettings(decay=0.5, pool=10))
    # from Beta(1, 1), 3 right of 4 with lam = 1/2: a = 0.5 + 0.5 + 3 = 4, b = 0.5 + 0.5 + 1 = 2
    sampler.observe(group("t0", 0, [1, 1, 1, 0]))
    assert sampler.posterior("t0") == (4.0, 2.0) and sampler.rollouts() == 4
    for _ in range(3):  # t1 always solved: its mean goes to 1 and its weight to 0
        sampler.observe(group("t1", 0, [1, 1, 1, 1]))
    a, b = sampler.posterior("t1")
    assert a / (a + b) > 0.85
    batch = sampler.next_batch(4)  # the whole split is the pool: the 4 unseen prompts score highest
    assert sorted(t.id for t in batch) == ["t2", "t3", "t4", "t5"]
    assert sampler.metrics()["sampler/posterior_mean"] == 0.5
    assert [t.id for t in InsightSampler(tasks[:2], 0, InsightSettings()).next_batch(5)].count("t0") >= 2


# ------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("sampler,field", [
    ("{name: dump, temperature: 0}", "temperature"),
    ("{name: dump, window: 0}", "window"),
    ("{name: difficulty_filter, recheck_after: 0}", "recheck_after"),
    ("{name: difficulty_filter, recheck_unit: days}", "recheck_unit"),
    ("{name: insight, decay: 1.5}", "decay"),
    ("{name: insight, target: 1.0}", "target"),
    ("{name: insight, pool: 0.5}", "pool"),
    ("{name: insight, no_such_option: 1}", "no_such_option"),
])
def test_a_bad_setting_is_a_config_error_naming_it(sampler, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [f"task.sampler={sampler}"])


def test_built_from_the_recipe():
    cfg = load_config(None, ["task.sampler={name: dump, bucket_key: difficulty, temperature: 0.5}"])
    tasks = arithmetic_splits(digits=1, heldout_size=10).train
    sampler = build_task_sampler(cfg.task.sampler.name, tasks, 0, cfg.task.sampler.settings())
    assert isinstance(sampler, DumpSampler) and sampler.cfg.temperature == 0.5 and sampler.buckets == ["0", "1"]


# ------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize("sampler", [
    "{name: difficulty_filter, recheck_unit: steps, recheck_after: 2}",
    "{name: dump, bucket_key: difficulty}",
    "{name: insight, pool: 2}",
], ids=["difficulty_filter", "dump", "insight"])
def test_default_recipe_trains_and_resumes_exactly(tmp_path, monkeypatch, sampler):
    """4 steps straight == 2 steps, a kill and a resume: same metrics (sampler/... included), same weights."""
    from resume_fixtures import straight_and_resumed, untimed
    from safetensors.torch import load_file

    # one torch thread: with 2, the float32 update of some batches (InSight's here) differs in its last bits
    # between two identical runs in one process (not the sampler: its draws and the samples are the same)
    torch.set_num_threads(1)  # conftest's autouse fixture restores the test threads for the next test

    def cfg(name):
        return load_config(None, [
            f"output_dir={tmp_path}", f"name={name}", "rollout.prompts_per_step=6", "rollout.group_size=4",
            "task.heldout_size=30", "train.time_limit_s=0", "eval.final_samples=0", "log.report=false",
            "train.steps=4", "eval.every=2", "checkpoint.every=2", f"task.sampler={sampler}"])

    straight, resumed = straight_and_resumed(monkeypatch, cfg)

    a, b = untimed(straight), untimed(resumed)
    assert a == b and [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert any(k.startswith("sampler/") for k in a[-1]) and a[-1]["sampler/prompts_seen"] > 6
    assert _undocumented({k for r in a for k in r}) == set()  # docs/metrics.md lists the sampler/... keys
    wa = load_file(straight.run_dir / "checkpoints/step_4/model.safetensors")
    wb = load_file(resumed.run_dir / "checkpoints/step_4/model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_docs_strategies_lists_every_task_sampler_with_its_formula():
    from pathlib import Path

    from reinforge.parts import all_kinds

    doc = (Path(__file__).resolve().parents[1] / "docs" / "strategies.md").read_text().replace("\\|", "|")
    for entry in all_kinds()["task_sampler"].entries():
        assert f"| `{entry.name}` | `{entry.formula}` |" in doc, entry.name
        assert entry.paper == "-" or f"arXiv:{entry.paper}" in doc, entry.name


@pytest.mark.slow
def test_async_mode_draws_ahead_and_resumes_the_same_batches(tmp_path):
    """Async RL draws up to max_staleness steps ahead of the statistics; a resume from the step-2 checkpoint
    (requests for steps 3 and 4 in flight) trains on the same tasks and ends in the same sampler state."""
    import shutil

    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    overrides = [f"output_dir={tmp_path}", "orchestrate.mode=async", "orchestrate.max_staleness=2", "eval.every=0",
                 "eval.final_samples=0", "task.heldout_size=16", "train.time_limit_s=0", "log.report=false",
                 "rollout.prompts_per_step=8", "rollout.group_size=4", "train.steps=4", "checkpoint.every=2",
                 "checkpoint.keep=5", "log.samples_per_step=100",
                 "task.sampler={name: dump, bucket_key: difficulty}"]
    full = train(load_config(None, ["name=full", *overrides]))

    def drawn(run):
        return {s: sorted(r["task_id"] for r in read_jsonl(run.run_dir / "samples.jsonl") if r["step"] == s)
                for s in (3, 4)}

    tasks = drawn(full)
    final = json.loads((full.run_dir / "checkpoints" / "step_4" / "state.json").read_text())["sampler"]
    shutil.rmtree(full.run_dir / "checkpoints" / "step_4")
    resumed = train(resume=full.run_dir)
    assert drawn(resumed) == tasks
    again = json.loads((resumed.run_dir / "checkpoints" / "step_4" / "state.json").read_text())["sampler"]
    assert again == final and again["stats"]["step"] == 4
