"""RePO's replay (issue 18): strategies, the per-prompt buffer, the ``repo`` loss, the rollout token metrics.

Hand-computed values are worked out in the comments."""

from __future__ import annotations

import json
import math

import pytest
import torch

from reinforge.algo.policy_losses import ClipSettings, PPOClipSettings, ppo_clip_loss, repo_loss
from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.replay import REPLAY_STRATEGIES, ReplayBuffer, ReplaySettings
from reinforge.orchestrate.stages import interleave
from reinforge.orchestrate.step_metrics import token_metrics
from reinforge.types import Trajectory

REWARDS = [0.0, 1.0, 1.0, 0.0, 1.0, 0.5]  # a prompt's buffer, oldest first


def pick(name: str, k: int, rewards=REWARDS, seed: int = 0) -> list[int]:
    buf = ReplayBuffer(name, ReplaySettings(capacity=8, replays=k, min_to_replay=1), seed)
    buf.buffers["x"] = [[[1], [0], [0.0], 0, [], r, "stop", "", r > 0, 0, [], []] for r in rewards]
    where = {id(r): i for i, r in enumerate(buf.buffers["x"])}
    return [where[id(r)] for r in buf.select("x", step=3)]


def test_strategies_pick_what_a_hand_computation_says():
    assert pick("recent", 3) == [3, 4, 5]  # the newest three
    assert pick("highest", 3) == [1, 2, 4]  # the three 1.0 rewards
    assert pick("highest", 2) == [2, 4]  # ties: the newer first
    assert pick("all", 2) == [0, 1, 2, 3, 4, 5]
    # k = 2: {1, 0} has variance 0.25, the largest; the newest 1 (index 4) and the newest 0 (index 3)
    assert pick("max_variance", 2) == [3, 4]
    # k = 3: {1, 0, 0} and {1, 1, 0} both have variance 2/9 (mean 1/3: (4/9 + 1/9 + 1/9) / 3); the larger sum wins
    assert pick("max_variance", 3) == [2, 3, 4]
    drawn = pick("random", 3)
    assert len(set(drawn)) == 3 and drawn == pick("random", 3)  # seeded by (seed, step, prompt)
    assert {tuple(pick("random", 3, seed=s)) for s in range(10)} != {tuple(drawn)}


def test_max_variance_equals_the_exhaustive_search():
    import itertools
    import random

    rng = random.Random(0)
    for _ in range(30):
        rewards = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(7)]
        k = rng.randint(1, 6)
        cfg = ReplaySettings(capacity=8, replays=k, min_to_replay=1)
        got = REPLAY_STRATEGIES.get("max_variance")(rewards, cfg)

        def var(s, rewards=rewards, k=k):
            v = [rewards[i] for i in s]
            return round(sum((x - sum(v) / k) ** 2 for x in v) / k, 12), sum(v)

        assert var(got) == max(var(s) for s in itertools.combinations(range(7), k))


def traj(task: str, group: int, reward: float, n_gen: int = 2, version: int = 0) -> Trajectory:
    return Trajectory([7] + [5] * n_gen, [0] + [1] * n_gen, [0.0] + [-0.5] * n_gen, version, group, task,
                      reward=reward, metadata={"correct": reward > 0})


def test_buffer_fills_evicts_and_replays_before_the_steps_own_samples_join():
    buf = ReplayBuffer("recent", ReplaySettings(capacity=3, replays=2, min_to_replay=2), seed=0)
    step1 = [traj("a", 0, 1.0), traj("a", 0, 0.0), traj("b", 1, 0.0)]
    assert buf.mix(step1, 1, next_group=2) == []  # empty buffers: nothing to replay
    buf.add(step1, 1)
    assert [len(buf.buffers[k]) for k in ("a", "b")] == [2, 1]
    step2 = [traj("a", 0, 0.5, version=1), traj("a", 0, 0.0, version=1), traj("b", 1, 1.0, version=1)]
    replayed = buf.mix(step2, 2, next_group=2)
    # a has 2 >= min_to_replay: its two step-1 samples, as a group of their own (id 2); b has 1 < 2: none
    assert [(t.task_id, t.group_id, t.reward, t.version, t.metadata["replay_age"]) for t in replayed] == [
        ("a", 2, 1.0, 0, 1), ("a", 2, 0.0, 0, 1)]
    assert replayed[0].logprobs == [0.0, -0.5, -0.5] and replayed[0].loss_mask == [0, 1, 1]  # mu kept
    assert buf.metrics()["replay/samples"] == 2 and buf.metrics()["replay/age_mean"] == 1
    buf.add(step2, 2)
    assert [r[5] for r in buf.buffers["a"]] == [0.0, 0.5, 0.0]  # capacity 3: the oldest (1.0) evicted
    assert buf.metrics()["replay/buffer_samples"] == 5


def test_mixed_groups_and_the_prompt_limit():
    buf = ReplayBuffer("all", ReplaySettings(capacity=4, replays=1, min_to_replay=1, groups="mixed",
                                             max_prompts=2), seed=0)
    buf.add([traj("a", 0, 1.0)], 1)
    buf.add([traj("b", 0, 1.0)], 2)
    buf.add([traj("c", 0, 1.0)], 3)
    assert list(buf.buffers) == ["b", "c"]  # a, sampled least recently, evicted
    buf.add([traj("b", 0, 0.0)], 4)
    assert list(buf.buffers) == ["c", "b"]
    replayed = buf.mix([traj("b", 5, 1.0)], 5, next_group=6)
    assert [(t.group_id, t.reward) for t in replayed] == [(5, 1.0), (5, 0.0)]  # mixed: the fresh group's id


def test_state_round_trips_through_json_and_replays_the_same():
    def run(buf, steps):
        out = []
        for s in steps:
            fresh = [traj(k, g, float((s + g) % 2)) for g, k in enumerate("ab")]
            out.append([(t.task_id, t.group_id, t.reward, t.metadata["replay_age"]) for t in buf.mix(fresh, s, 2)])
            buf.add(fresh, s)
        return out

    settings = ReplaySettings(capacity=3, replays=2, min_to_replay=1)
    straight = ReplayBuffer("random", settings, seed=4)
    a = run(straight, range(1, 7))
    first = ReplayBuffer("random", settings, seed=4)
    run(first, range(1, 4))
    resumed = ReplayBuffer("random", settings, seed=4)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert run(resumed, range(4, 7)) == a[3:]
    assert json.dumps(resumed.state_dict()) == json.dumps(straight.state_dict())


def test_interleave_puts_replays_after_their_group_with_its_baseline():
    kept = [traj("a", 0, 1.0), traj("a", 0, 0.0), traj("b", 1, 1.0)]
    rep = [traj("a", 2, 0.5), traj("b", 3, 0.0)]
    rows, base = interleave(kept, [0.3, 0.3, 0.7], rep)
    assert [(t.task_id, t.group_id) for t in rows] == [("a", 0), ("a", 0), ("a", 2), ("b", 1), ("b", 3)]
    assert base == [0.3, 0.3, 0.3, 0.7, 0.7]
    assert interleave(kept, None, rep)[1] is None


def test_repo_loss_clips_the_ratio_to_the_behaviour_policy():
    logp = torch.log(torch.tensor([[0.6, 0.9, 0.25]]))
    mu = torch.log(torch.tensor([[0.5, 0.6, 0.5]]))  # rho = 1.2, 1.5, 0.5
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    old = torch.zeros_like(logp)  # pi_old is not read: the ratio is to mu
    loss, m = repo_loss(logp, mu, adv, ClipSettings())
    # 1.2: inside [0.8, 1.2] -> -1.2; 1.5 clipped to 1.2 -> -1.2; A = -1, rho 0.5: max(0.5, 0.8) = 0.8
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.2, 0.8]]), atol=1e-6)
    assert torch.allclose(m["ratio"], torch.tensor([[1.2, 1.5, 0.5]]), atol=1e-6)
    assert m["clip_frac"].tolist() == [[0.0, 1.0, 1.0]]
    same, _ = ppo_clip_loss(logp, mu, adv, PPOClipSettings())  # with mu as pi_old: PPO's clip
    assert torch.equal(loss, same) and not torch.equal(loss, ppo_clip_loss(logp, old, adv, PPOClipSettings())[0])
    logp.requires_grad_(True)
    repo_loss(logp, mu, adv, ClipSettings())[0].sum().backward()
    # d/dlogp of -rho A = -rho A on the unclipped token; 0 where the clip is active
    assert torch.allclose(logp.grad, torch.tensor([[-1.2, 0.0, 0.0]]), atol=1e-6)


def test_token_metrics_count_decoded_and_reused_tokens_and_group_sizes():
    a = traj("a", 0, 1.0, n_gen=4)
    a.metadata["tokens_reused"] = 3  # e.g. a reused prefix: 1 of its 4 tokens decoded
    trajs = [a, traj("a", 0, 0.0, n_gen=2), traj("b", 1, 0.0, n_gen=5)]
    m = token_metrics(trajs, reused_elsewhere=10, generate_s=2.0)
    # decoded 4 + 2 + 5 - 3 = 8; reused 3 + 10 = 13; saved 13 tokens at 2.0 s / 8 tokens = 3.25 s
    assert m["rollout/tokens_generated"] == 8 and m["rollout/tokens_reused"] == 13
    assert math.isclose(m["rollout/gen_time_saved_s"], 3.25)
    assert (m["rollout/budget_min"], m["rollout/budget_mean"], m["rollout/budget_max"]) == (1, 1.5, 2)


@pytest.mark.parametrize(("override", "field"), [
    ("rollout.replay={name: recent, capacity: 4, min_to_replay: 8}", "min_to_replay"),
    ("rollout.replay={name: newest}", "replay strategy"),
    ("rollout.replay={name: recent, size: 3}", "size"),
])
def test_a_bad_replay_setting_names_it(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [override])


def test_replay_and_budgets_run_in_one_rank_sync_or_async():
    assert load_config(None, ["rollout.replay={name: recent}", "orchestrate.mode=async"]).rollout.replay.name == "recent"
    with pytest.raises(ConfigError, match="rollout.budget runs with"):
        load_config(None, ["rollout.budget={name: knapsack}", "train.world_size=2"])
    cfg = load_config(None, ["preset=repo"])
    assert cfg.rollout.replay.name == "highest" and cfg.algo.policy_loss == "repo"


@pytest.mark.slow
@pytest.mark.parametrize("parts", [
    ["rollout.replay={name: highest, capacity: 8, replays: 4, min_to_replay: 4}", "algo.policy_loss=repo"],
    ["rollout.budget={name: knapsack, min_per_prompt: 2, max_per_prompt: 8}"],
], ids=["replay", "knapsack"])
def test_kill_and_resume_is_exact(tmp_path, monkeypatch, parts):
    """4 steps straight == 2 steps, a kill and a resume: same metrics, same buffer or statistics, same weights.
    4 training prompts (1-digit grid, 96 held out), so every prompt comes back every step."""
    from resume_fixtures import straight_and_resumed, untimed
    from safetensors.torch import load_file
    from test_docs_metrics import _undocumented

    torch.set_num_threads(1)

    def cfg(name):
        return load_config(None, [
            f"output_dir={tmp_path}", f"name={name}", "task.digits=1", "task.heldout_size=96",
            "rollout.prompts_per_step=4", "rollout.group_size=4", "train.time_limit_s=0", "eval.final_samples=0",
            "log.report=false", "train.steps=4", "eval.every=2", "checkpoint.every=2", *parts])

    straight, resumed = straight_and_resumed(monkeypatch, cfg)
    a, b = untimed(straight), untimed(resumed)
    assert a == b and [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert _undocumented({k for r in a for k in r}) == set()
    state = json.loads((straight.run_dir / "checkpoints/step_4/state.json").read_text())
    assert state == json.loads((resumed.run_dir / "checkpoints/step_4/state.json").read_text())
    if "replay" in state:  # 4 samples a step per prompt, capacity 8: the last two steps' samples of each prompt
        assert sorted(len(v) for _, v in state["replay"]["buffers"]) == [8, 8, 8, 8]
        assert [r["replay/samples"] for r in a[1:]] == [0, 16, 16, 16]  # from step 2 on: 4 replays x 4 prompts
        assert all(r["rollout/tokens_reused"] > 0 for r in a[2:]) and a[1]["rollout/tokens_reused"] == 0
    else:  # the knapsack's statistics; the step's samples always sum to the budget of 4 x 4
        assert state["budget"]["stats"]["step"] == 4
        assert all(r["rollout/sampled"] == 16 and r["rollout/budget_min"] >= 2 for r in a[1:])
    wa = load_file(straight.run_dir / "checkpoints/step_4/model.safetensors")
    wb = load_file(resumed.run_dir / "checkpoints/step_4/model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_docs_strategies_lists_every_replay_strategy_and_budget_with_its_formula():
    from pathlib import Path

    from reinforge.parts import all_kinds

    doc = (Path(__file__).resolve().parents[1] / "docs" / "strategies.md").read_text().replace("\\|", "|")
    for key in ("replay", "budget"):
        for entry in all_kinds()[key].entries():
            assert f"| `{entry.name}` | `{entry.formula}` |" in doc, entry.name
            assert entry.paper == "-" or entry.paper.split("arXiv:")[1][:10] in doc, entry.name
