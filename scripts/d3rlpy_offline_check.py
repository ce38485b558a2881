"""d3rlpy's behaviour cloning, TD3+BC and CQL on the Pendulum-v1 tiers of scripts/offline_tiers_pendulum.py, with
the hyper-parameters of reinforge's td3_bc and cql agents, evaluated the same way (docs/classic.md, "Offline RL
for Box actions", the check against d3rlpy). d3rlpy is not a dependency of the package: run with it importable,

    PYTHONPATH=.:/path/to/d3rlpy python scripts/d3rlpy_offline_check.py --data DIR [--train-steps 3000]
        [--cql-hidden 256,256]

(DIR: the tiers' ``<tier>.parquet`` files). The settings matched: networks 256-256 ReLU, batch 256, gamma 0.99,
tau 0.005; TD3+BC: Adam 3e-4 for both, alpha 2.5, smoothing noise 0.2 clipped at 0.5, the actor every 2 critic
steps, observations standardised (StandardObservationScaler) and actions rescaled to [-1, 1]
(MinMaxActionScaler; reinforge computes its behaviour-cloning term on actions rescaled the same way); BC:
d3rlpy's deterministic BC at Adam 3e-4 (reinforge: td3_bc with alpha 0, observations standardised the same
way); CQL: Adam 1e-4 (actor, temperature) and 3e-4 (critics), a fixed penalty weight 5 (alpha_learning_rate 0,
initial_alpha 1, alpha_threshold 0), 10 action samples, initial temperature 1. What differs and cannot be
matched: d3rlpy's CQL target takes the policy's mean action at s' (reinforge's a sample, as the authors'
code), d3rlpy drops each truncated episode's last transition (its next observation is not stored), and the
random streams.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from reinforge.classic.envs import EnvConfig, finished_episodes, make_vec_env
from reinforge.classic.offline import load_parquet


def dataset(path: Path):  # noqa: ANN201
    import d3rlpy  # noqa: PLC0415

    data = load_parquet(path)
    ends = np.append(data.episode[1:] != data.episode[:-1], True)
    return d3rlpy.dataset.MDPDataset(data.obs, np.asarray(data.action, dtype=np.float32).reshape(len(data.obs), -1),
                                     data.reward.astype(np.float32), data.terminated.astype(np.float32),
                                     (ends & ~data.terminated).astype(np.float32))


def algorithms(cql_hidden: list[int]) -> dict[str, object]:
    import d3rlpy  # noqa: PLC0415

    cql_encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=cql_hidden)

    def scalers():  # noqa: ANN202
        return {"observation_scaler": d3rlpy.preprocessing.StandardObservationScaler(),
                "action_scaler": d3rlpy.preprocessing.MinMaxActionScaler(minimum=np.array([-2.0]),
                                                                         maximum=np.array([2.0]))}

    return {
        "BC": lambda: d3rlpy.algos.BCConfig(learning_rate=3e-4, batch_size=256, **scalers()),
        "TD3+BC": lambda: d3rlpy.algos.TD3PlusBCConfig(
            actor_learning_rate=3e-4, critic_learning_rate=3e-4, batch_size=256, gamma=0.99, tau=0.005,
            target_smoothing_sigma=0.2, target_smoothing_clip=0.5, alpha=2.5, update_actor_interval=2, **scalers()),
        "CQL": lambda: d3rlpy.algos.CQLConfig(
            actor_learning_rate=1e-4, critic_learning_rate=3e-4, temp_learning_rate=1e-4, alpha_learning_rate=0.0,
            batch_size=256, gamma=0.99, tau=0.005, initial_temperature=1.0, initial_alpha=1.0, alpha_threshold=0.0,
            conservative_weight=5.0, n_action_samples=10, actor_encoder_factory=cql_encoder,
            critic_encoder_factory=cql_encoder, action_scaler=scalers()["action_scaler"]),
    }


def play(algo, episodes: int, seed: int) -> list[float]:  # noqa: ANN001
    envs = make_vec_env(EnvConfig(id="Pendulum-v1", num_envs=1), 0.99, seed)
    obs, _ = envs.reset(seed=seed)
    returns: list[float] = []
    while len(returns) < episodes:
        action = algo.predict(np.asarray(obs, dtype=np.float32))
        obs, _, _, _, info = envs.step(np.asarray(action, dtype=np.float32).reshape(1, -1))
        returns += [r for r, _ in finished_episodes(info)]
    return returns


def main() -> None:
    import d3rlpy  # noqa: PLC0415
    from d3rlpy.logging import NoopAdapterFactory  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-steps", type=int, default=3000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--tiers", default="random,medium,expert")
    p.add_argument("--cql-hidden", default="256,256", help="CQL's MLP widths (as offline_tiers_pendulum.py's)")
    p.add_argument("--algos", default="BC,TD3+BC,CQL", help="which of BC, TD3+BC, CQL")
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    algos = {k: v for k, v in algorithms([int(w) for w in args.cql_hidden.split(",")]).items()
             if k in args.algos.split(",")}
    print(f"d3rlpy {d3rlpy.__version__}; " + "; ".join(f"{k}: {v().__class__.__name__}" for k, v in algos.items()))
    print("| tier | " + " | ".join(f"d3rlpy {k}" for k in algos) + " |")
    print("|---|" + "---:|" * len(algos), flush=True)
    for tier in args.tiers.split(","):
        data, cells = dataset(args.data / f"{tier}.parquet"), []
        for make in algos.values():
            d3rlpy.seed(args.seed)
            algo = make().create(device="cpu:0")
            algo.fit(data, n_steps=args.train_steps, n_steps_per_epoch=args.train_steps, show_progress=False,
                     save_interval=10**9, logger_adapter=NoopAdapterFactory())
            returns = play(algo, args.eval_episodes, args.seed + 7)
            cells.append(f"{np.mean(returns):.1f} ({min(returns):.0f} to {max(returns):.0f})")
        print(f"| {tier} | " + " | ".join(cells) + " |", flush=True)
    print(f"({time.time() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
