"""Asynchronous RL: admission control, version lags, the decoupled objective, worker recovery,
timeouts and resume with requests in flight."""

from __future__ import annotations

import copy
import os
import random
import shutil
import signal
import threading

import pytest
import torch
from numerics import assert_all_exact, exact_approx, float64_model

from reinforge.config import load_config
from reinforge.errors import ConfigError, ReinforgeError
from reinforge.learn.learner import Learner
from reinforge.learn.logprobs import token_logprobs
from reinforge.orchestrate import async_batches
from reinforge.orchestrate.components import build_components, resolve_config
from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn
from reinforge.orchestrate.run import train
from reinforge.orchestrate.staleness import AdmissionControl, split_stale
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Trajectory

COMMON = ["orchestrate.mode=async", "eval.every=0", "eval.final_samples=0", "task.heldout_size=16",
          "train.time_limit_s=0", "log.report=false", "rollout.prompts_per_step=8", "rollout.group_size=4",
          "train.lr=1e-4"]  # every step of these 5 has a group with a reward spread at this rate and seed


# ---- admission control (pure) ------------------------------------------------------------------


def test_admission_rule_and_lag():
    c = AdmissionControl(1)
    assert c.may_start(1, 0) and c.may_start(2, 0) and not c.may_start(3, 0) and c.may_start(3, 1)
    assert AdmissionControl(0).may_start(1, 0) and not AdmissionControl(0).may_start(2, 0)
    assert c.lag(update=3, behaviour_version=1) == 1
    with pytest.raises(ValueError):
        AdmissionControl(-1)


def _simulate(max_staleness: int, rng: random.Random, steps: int = 30) -> list[int]:
    """A learner and one rollout worker with random durations, generating while the learner trains;
    weights switch in flight (a token's version is the last one published before it was sampled).
    Returns the lag of every token of every consumed batch."""
    control = AdmissionControl(max_staleness)
    version, now, next_submit, worker_free_at = 0, 0.0, 1, 0.0
    token_times: dict[int, list[float]] = {}
    publishes: list[tuple[float, int]] = [(0.0, 0)]
    lags = []
    for update in range(1, steps + 1):
        while next_submit <= steps and control.may_start(next_submit, version):  # submitted at time `now`
            start = max(worker_free_at, now)
            times = sorted(start + rng.random() * rng.uniform(0.1, 3.0) for _ in range(rng.randint(1, 8)))
            token_times[next_submit], worker_free_at = times, times[-1]
            next_submit += 1
        now = max(now, token_times[update][-1])  # the learner waits for its batch
        lags += [control.lag(update, max(v for t0, v in publishes if t0 <= t)) for t in token_times.pop(update)]
        now += rng.uniform(0.05, 2.0)  # the update, while the worker keeps generating
        version = update
        publishes.append((now, version))
    return lags


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
def test_admission_never_exceeds_the_bound_over_random_timings(max_staleness):
    rng = random.Random(max_staleness)
    for _ in range(100):
        lags = _simulate(max_staleness, rng)
        assert min(lags) >= 0 and max(lags) <= max_staleness
    if max_staleness > 0:  # and the bound is used: some batches are genuinely stale
        assert any(max(_simulate(max_staleness, rng)) > 0 for _ in range(20))


def test_stale_groups_are_dropped_whole():
    trajs = [Trajectory([1], [1], [0.0], version=v, group_id=g, task_id="t") for g, v in ((0, 5), (0, 3), (1, 5))]
    kept, dropped = split_stale(trajs, update=7, control=AdmissionControl(2))  # lags 1, 3, 1
    assert dropped == 1 and [t.group_id for t in kept] == [1]


# ---- the decoupled objective -------------------------------------------------------------------


@pytest.mark.numerics
def test_decoupled_loss_equals_the_synchronous_loss_when_on_policy(tmp_path):
    """With behaviour = proximal policy the truncated-IS (decoupled) update is the plain one. The engine's
    log-probs give IS weights of 1 up to its numerics; with the learner's own log-probs as the behaviour's
    (exactly on-policy) both updates are compared in float64 (tests/numerics.py)."""
    cfg = load_config(None, [f"output_dir={tmp_path}", "rollout.prompts_per_step=4", "rollout.group_size=4",
                             "algo.skip_equal_reward_groups=false", "task.heldout_size=4", "model.dtype=float64"])
    c = build_components(cfg)
    float64_model(c.learner.model)
    tasks = c.sampler.next_batch(4)
    _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=0)
    trajs = score_single_turn(tasks, gens, 4, c.reward_pool)
    results = {}
    for mode, behaviour in (("none", "engine"), ("token_tis", "engine"), ("token_tis", "learner")):
        run_cfg = cfg.model_copy(update={"algo": cfg.algo.model_copy(
            update={"mismatch": cfg.algo.mismatch.model_copy(update={"mode": mode})})})
        learner = Learner.for_run(copy.deepcopy(c.learner.model), run_cfg)
        batch, _ = build_batch(trajs, run_cfg.algo, c.engine.pad_id)
        if behaviour == "learner":
            with torch.no_grad():
                own, _ = token_logprobs(learner.model, batch.input_ids, batch.attention_mask, cfg.rollout.temperature)
            batch.sampling_logprobs = own * batch.loss_mask
        metrics = learner.update(batch)
        results[mode, behaviour] = (metrics, [p.detach().clone() for p in learner.model.parameters()])
    (m0, p0), (m1, _), (m2, p2) = results["none", "engine"], results["token_tis", "engine"], results["token_tis", "learner"]
    assert m1["mismatch/is_weight"] == pytest.approx(1.0, abs=1e-4)  # behaviour = proximal up to numerics
    assert m2["mismatch/is_weight"] == exact_approx(1.0)
    assert m2["pg_loss"] == exact_approx(m0["pg_loss"])
    assert_all_exact(p2, p0)


def test_loading_validates_only_and_the_run_records_what_it_resolved():
    """The validators leave the config as given; ``resolve_config`` (orchestrate/run.py calls it before
    building anything) fills the async default, and ``config.yaml`` is written from its result."""
    from reinforge.config import dump_config

    loaded = load_config(None, ["orchestrate.mode=async"])
    assert loaded.algo.mismatch.mode == "none" and "mode" not in loaded.algo.mismatch.model_fields_set
    resolved = resolve_config(loaded)
    assert loaded.algo.mismatch.mode == "none"  # a copy: the loaded config is not changed
    assert "mode: token_tis" in dump_config(resolved)


def test_async_defaults_to_truncated_is_and_rejects_what_it_cannot_do(tmp_path):
    assert resolve_config(load_config(None, ["orchestrate.mode=async"])).algo.mismatch.mode == "token_tis"
    assert resolve_config(load_config(None, ["orchestrate.mode=async", "algo.mismatch.mode=none"])
                          ).algo.mismatch.mode == "none"
    assert resolve_config(load_config(None, [])).algo.mismatch.mode == "none"
    with pytest.raises(ConfigError, match="rollout.engine=openai"):  # one server, no copy per worker
        load_config(None, ["orchestrate.mode=async", "rollout.engine=openai", "rollout.server_url=http://x/v1"])


@pytest.mark.slow
def test_async_dynamic_sampling_tops_up_each_batch(tmp_path):
    """DAPO's dynamic sampling in async mode: a batch short of groups with reward spread gets further
    rounds from the task sampler until it has prompts_per_step of them (or the round cap)."""
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=3", "algo.dynamic_sampling=true",
                                      "algo.dynamic_sampling_max_rounds=4", "orchestrate.max_staleness=1"]))
    rows = _metrics(result)
    assert len(rows) == 3 and max(m["rollout/rounds"] for m in rows) > 1  # the tiny base: many flat groups
    for m in rows:
        assert 1 <= m["rollout/rounds"] <= 4
        if m["rollout/rounds"] < 4:  # stopped early: the batch is full of groups with spread
            assert m["batch/sequences"] == 8 * 4


@pytest.mark.slow
def test_async_rollout_workers_give_remax_its_greedy_baseline(tmp_path, monkeypatch):
    """ReMax declares that it needs a baseline (``needs=("greedy_baseline",)``): the rollout worker samples the
    greedy completion of every task too, and the learner gets one baseline per kept trajectory."""
    seen = []
    collect = async_batches.WorkerBatches.collect

    def spy(self, step):
        rollout = collect(self, step)
        seen.append((len(rollout.kept), rollout.baseline))
        return rollout

    monkeypatch.setattr(async_batches.WorkerBatches, "collect", spy)
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "algo.advantage=remax", "train.steps=2"]))
    assert result.steps == 2 and len(seen) == 2
    for kept, baseline in seen:
        assert baseline is not None and len(baseline) == kept and all(b in (0.0, 1.0) for b in baseline)


# ---- end to end (worker processes) -------------------------------------------------------------


def _metrics(result):
    return [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]


@pytest.mark.slow
@pytest.mark.parametrize("max_staleness", [0, 2])
def test_async_run_respects_the_bound(tmp_path, max_staleness):
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=5",
                                      f"orchestrate.max_staleness={max_staleness}"]))
    rows = _metrics(result)
    assert [m["policy_version"] for m in rows] == [1, 2, 3, 4, 5]
    assert all(m["async/lag_max"] <= max_staleness for m in rows) and all(m["batch/sequences"] > 0 for m in rows)
    if max_staleness == 0:
        assert all(m["async/lag_max"] == 0 for m in rows)
    else:  # it ran ahead of the learner (how far depends on timing: a slow worker takes newer weights)
        assert max(m["async/in_flight"] for m in rows) >= 1
    assert rows[-1]["async/dropped_groups"] == 0


@pytest.mark.slow
def test_steps_without_rows_still_advance_the_version(tmp_path):
    """Groups of one sample have no reward spread, so every group is skipped and no step has rows to
    train on: each step still publishes a version, so the next batch is admitted (with
    max_staleness=0 the run waited for a version that never came, until orchestrate.timeout_s)."""
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=3", "rollout.group_size=1",
                                      "orchestrate.max_staleness=0", "orchestrate.timeout_s=60"]))
    rows = _metrics(result)
    assert [m["policy_version"] for m in rows] == [1, 2, 3]
    assert all("train/loss" not in m for m in rows) and all(m["async/lag_max"] == 0 for m in rows)


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_its_batch_reissued(tmp_path, monkeypatch):
    collect = async_batches.WorkerBatches.collect

    def killing_collect(self, step):
        if step == 2:
            os.kill(self.workers.procs[0].pid, signal.SIGKILL)
        return collect(self, step)

    monkeypatch.setattr(async_batches.WorkerBatches, "collect", killing_collect)
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=4",
                                      "orchestrate.max_staleness=1"]))
    rows = _metrics(result)
    assert len(rows) == 4 and rows[-1]["async/worker_restarts"] >= 1


def test_the_learner_never_waits_forever(tmp_path):
    with pytest.raises(ReinforgeError, match="no rollout batch arrived in 0.01s"):
        train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=2", "orchestrate.timeout_s=0.01"]))


@pytest.mark.slow
def test_resume_reissues_the_requests_in_flight(tmp_path):
    overrides = [*COMMON, "train.steps=4", "checkpoint.every=2", "checkpoint.keep=5", "orchestrate.max_staleness=2",
                 "log.samples_per_step=100"]
    full = train(load_config(None, [f"output_dir={tmp_path}", "name=full", *overrides]))
    tasks = {s: sorted(r["task_id"] for r in read_jsonl(full.run_dir / "samples.jsonl") if r["step"] == s)
             for s in (3, 4)}
    state = (full.run_dir / "checkpoints" / "step_2" / "state.json").read_text()
    assert '"async"' in state and '"update": 3' in state and '"update": 4' in state
    shutil.rmtree(full.run_dir / "checkpoints" / "step_4")
    resumed = train(resume=full.run_dir)
    again = {s: sorted(r["task_id"] for r in read_jsonl(resumed.run_dir / "samples.jsonl") if r["step"] == s)
             for s in (3, 4)}
    assert again == tasks  # the same batches, neither skipped nor drawn twice


@pytest.mark.slow
def test_wait_samples_every_request_with_its_admission_weights(tmp_path):
    """``weight_update: wait``: a request samples with the weights published when it was submitted,
    even when newer ones are published before its worker gets to it (the worker is busy with an
    earlier request here). ``publish`` waits until the request has taken its weights; without that
    gate the second request below took version 1 and an uninterrupted run depended on timing."""
    from reinforge.orchestrate.rollout_worker import RolloutRequest, RolloutWorkers

    cfg = load_config(None, [f"output_dir={tmp_path}", *COMMON, "orchestrate.weight_update=wait",
                             "orchestrate.timeout_s=120", "rollout.max_new_tokens=48"])
    c = build_components(cfg)
    workers = RolloutWorkers(cfg, c.learner.model, version=0)
    try:
        tasks = c.sampler.next_batch(8)
        workers.submit(RolloutRequest(1, tasks))
        workers.submit(RolloutRequest(2, tasks))  # queued behind the first
        workers.publish(c.learner.model, 1)
        results = {r.update: r for r in (workers.next_result(120), workers.next_result(120))}
        assert {t.version for t in results[2].trajectories} == {0}
        workers.submit(RolloutRequest(3, tasks))
        assert {t.version for t in workers.next_result(120).trajectories} == {1}
    finally:
        workers.close()


def test_ray_actor_samples_with_the_weights_its_request_carries(tmp_path):
    """Ray with ``wait``: a request carries its admission version's weights and samples with exactly
    those, even when the actor has received newer ones."""
    from reinforge.orchestrate.ray_backend import RolloutActor
    from reinforge.orchestrate.rollout_worker import RolloutRequest

    cfg = load_config(None, [f"output_dir={tmp_path}", *COMMON, "orchestrate.weight_update=wait"])
    c = build_components(cfg)
    actor = RolloutActor(0, cfg)
    state = {n: p.detach().clone() for n, p in c.learner.model.named_parameters()}
    actor.set_weights(state, 2)
    result = actor.generate(RolloutRequest(3, c.sampler.next_batch(2), min_version=1), ([state], 1))
    assert result.error is None and {t.version for t in result.trajectories} == {1}


def test_ray_actor_waits_for_the_admitted_weights(tmp_path):
    """Ray does not order calls across an actor's concurrency groups: with ``inflight`` a batch that
    arrives before the weights the learner published first must wait for them, not sample with older ones."""
    import threading

    from reinforge.orchestrate.ray_backend import RolloutActor
    from reinforge.orchestrate.rollout_worker import RolloutRequest

    cfg = load_config(None, [f"output_dir={tmp_path}", *COMMON, "orchestrate.weight_update=inflight",
                             "orchestrate.timeout_s=60"])
    c = build_components(cfg)
    actor = RolloutActor(0, cfg)
    state = {n: p.detach().clone() for n, p in c.learner.model.named_parameters()}
    actor.set_weights(state, 0)
    out = {}
    request = RolloutRequest(3, c.sampler.next_batch(2), min_version=1)
    thread = threading.Thread(target=lambda: out.setdefault("r", actor.generate(request)))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()  # blocked: version 1 has not arrived
    actor.set_weights(state, 1)
    thread.join(60)
    result = out["r"]
    assert result.error is None and {t.version for t in result.trajectories} == {1}
    actor.timeout_s = 0.05
    late = actor.generate(RolloutRequest(4, request.tasks, min_version=2))
    assert "version 2 did not arrive" in late.error


@pytest.mark.slow
def test_ray_backend_on_one_machine(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'reinforge[ray]')")
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=3", "orchestrate.backend=ray",
                                      "orchestrate.max_staleness=1"]))
    rows = _metrics(result)
    assert [m["policy_version"] for m in rows] == [1, 2, 3]
    assert all(m["async/lag_max"] <= 1 and m["batch/sequences"] > 0 for m in rows)
    import ray

    assert not ray.is_initialized()  # the run started Ray and shut it down


@pytest.mark.slow
@pytest.mark.parametrize("parts", [
    ["preset=astar_po", "rollout.prompts_per_step=4", "rollout.group_size=1", "algo.policy_loss.value_samples=2",
     "rollout.budget={name: knapsack, min_per_prompt: 1, max_per_prompt: 2}"],
    ["algo.advantage={name: vineppo, rollouts: 2, step_split: tokens, step_tokens: 2, max_cuts: 2}",
     "algo.skip_equal_reward_groups=false", "task.digits=1", "task.heldout_size=96", "rollout.prompts_per_step=4",
     "rollout.replay={name: recent, capacity: 8, replays: 2, min_to_replay: 2}"],
    ["demonstrations.path=task", "demonstrations.mix=true", "demonstrations.per_step=3",
     "algo.loss_terms=[{name: nll, coef: 0.1}]"],
], ids=["prompt-values+budget", "state-values+replay", "demonstrations"])
def test_async_runs_the_same_stages_after_collection(tmp_path, parts):
    """The stages after collection (orchestrate/stages.py) run in the learner's process in async mode as in
    sync: budget sizes travel with each request, the replay buffer, A*-PO's prompt values and VinePPO's
    state values act on every step's batch, and mixed-in demonstrations join it."""
    result = train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=2", "rollout.max_new_tokens=6",
                                      *parts]))
    rows = _metrics(result)
    assert [m["policy_version"] for m in rows] == [1, 2]
    if "preset=astar_po" in parts:
        assert all(m["value_estimates/prompts"] >= 4 and m["value_estimates/reference_samples"] > 0 for m in rows)
        assert all(1 <= m["rollout/budget_min"] <= m["rollout/budget_max"] <= 2 for m in rows)
    elif "demonstrations.mix=true" in parts:
        assert all(m["demonstrations/rows"] == 3 and m["train/nll"] > 0 for m in rows)
    else:
        assert all(m["rollout/state_values/states"] > 0 for m in rows)
        assert rows[0]["replay/samples"] == 0 and rows[1]["replay/samples"] > 0


# ---- evaluation in the learner's process -------------------------------------------------------

def test_evaluations_take_the_cores_the_waiting_workers_leave(monkeypatch):
    cfg = load_config(None, ["orchestrate.mode=async", "orchestrate.rollout_workers=2"])
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert async_batches.evaluation_threads(cfg) == 3  # the learner's 1 and the two workers' 1 each
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert async_batches.evaluation_threads(cfg) == 2  # at most the machine's cores
    orchestrate = cfg.orchestrate
    ray = cfg.model_copy(update={"orchestrate": orchestrate.model_copy(update={"backend": "ray"})})
    assert async_batches.evaluation_threads(ray) == 1  # Ray actors may run elsewhere: the learner's own
    threads = torch.get_num_threads()
    own = cfg.model_copy(update={"orchestrate": orchestrate.model_copy(update={"eval_threads": threads + 1})})
    assert async_batches.evaluation_threads(own) == threads + 1
    with async_batches.WorkerBatches.evaluating(type("Source", (), {"cfg": own})()):
        assert torch.get_num_threads() == threads + 1
    assert torch.get_num_threads() == threads  # the learner's own again


def test_the_loop_evaluates_in_its_sources_evaluation_setting(tmp_path):
    """Every evaluation of a run (before, during, after training) runs inside the source's ``evaluating``."""
    from contextlib import contextmanager

    from reinforge.orchestrate.loop import Loop, local_batches
    from reinforge.orchestrate.run_dir import create_run_dir

    cfg = resolve_config(load_config(None, [f"output_dir={tmp_path}", "train.steps=2", "eval.every=1",
                                            "eval.final_samples=2", "task.heldout_size=8", "log.report=false"]))
    c, entered = build_components(cfg), []

    def source(c, collector):
        batches = local_batches(c, collector)

        @contextmanager
        def evaluating():
            entered.append(c.engine.version)
            yield
        batches.evaluating = evaluating
        return batches

    Loop(c, create_run_dir(cfg), 0, 10**6, source).run()
    assert entered == [0, 0, 1, 2, 2]  # greedy and pass@k before, greedy after steps 1 and 2, pass@k after


# ---- the thread backend: asynchronous RL in one process ----------------------------------------

def _untimed(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "async/wait_s", "async/worker_"))
             and k != "memory/peak_mb"} for r in rows]


@pytest.mark.slow
def test_thread_backend_trains_in_one_process_within_the_bound(tmp_path, monkeypatch):
    """Worker threads instead of processes: nothing is spawned, batches stay within the staleness bound, and
    with ``weight_update: wait`` the run does not depend on timing (two runs record the same metrics)."""
    import multiprocessing.context

    def no_process(*args, **kwargs):
        raise AssertionError("the thread backend started a worker process")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", no_process)
    runs = []
    for name in ("a", "b"):
        result = train(load_config(None, [f"output_dir={tmp_path}", f"name={name}", *COMMON, "train.steps=4",
                                          "orchestrate.backend=thread", "orchestrate.weight_update=wait"]))
        runs.append(_metrics(result))
    rows = runs[0]
    assert [m["policy_version"] for m in rows] == [1, 2, 3, 4]
    assert [m["async/lag_max"] for m in rows] == [0, 1, 1, 1]  # one update ahead, never more
    assert all(m["batch/sequences"] > 0 for m in rows)
    assert _untimed(runs[0]) == _untimed(runs[1])
    assert not [t for t in threading.enumerate() if t.name.startswith("reinforge-rollout")]


def test_a_failing_rollout_thread_fails_the_run_with_its_traceback(tmp_path, monkeypatch):
    from reinforge.orchestrate import batch_sources

    def failing_round(*args, **kwargs):
        raise RuntimeError("the environment broke")

    monkeypatch.setattr(batch_sources, "sample_round", failing_round)
    with pytest.raises(ReinforgeError, match=r"(?s)rollout thread 0 failed on the batch for update 1.*the environment broke"):
        train(load_config(None, [f"output_dir={tmp_path}", *COMMON, "train.steps=2", "orchestrate.backend=thread"]))


def test_thread_backend_refuses_torch_threads_of_its_own():
    with pytest.raises(ConfigError, match="rollout_threads=2: with backend=thread"):
        load_config(None, ["orchestrate.mode=async", "orchestrate.backend=thread", "orchestrate.rollout_threads=2"])
