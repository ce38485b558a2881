"""IMPALA's actors as Ray actor processes (classic/impala.py): each owns ``env.num_envs`` environments
and a copy of the network, and returns one unroll per call with the weights version it acted with.
The learner keeps one call in flight per actor: when an unroll arrives it trains on it, puts the new
weights into Ray's object store once (``publish``) and sends that actor its next call with the newest
reference (``resubmit``), so actors run ahead of the learner by one unroll and their weights lag by
the updates made meanwhile (the learner's ``async/lag_*``). Ray is imported here only (the ``ray`` extra).
Actor i's environments are seeded ``seed + 1000 (i + 1)``.
"""

from __future__ import annotations

from typing import Any

import torch

from reinforge.errors import ReinforgeError


class UnrollActor:
    """One actor process: environments, a network and its weights version."""

    def __init__(self, env_cfg: dict[str, Any], gamma: float, seed: int, hidden: list[int], steps: int) -> None:
        import numpy as np

        from reinforge.classic.envs import EnvConfig, make_vec_env, obs_tensor
        from reinforge.classic.networks import ActorCritic, action_spec

        torch.set_num_threads(1)
        self.envs = make_vec_env(EnvConfig(**env_cfg), gamma, seed)
        obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        self.net = ActorCritic(obs_dim, action_spec(self.envs.single_action_space), hidden)
        self.generator = torch.Generator().manual_seed(seed)
        self.steps, self.version = steps, -1
        obs, _ = self.envs.reset(seed=seed)
        self.obs = obs_tensor(obs)

    def ready(self) -> bool:
        return True

    def unroll(self, state: dict[str, torch.Tensor], version: int) -> tuple[dict, int, list]:
        from reinforge.classic.unroll import collect_unroll

        if version > self.version:
            self.net.load_state_dict(state)
            self.version = version
        data, self.obs, episodes = collect_unroll(self.net, self.envs, self.obs, self.steps, self.generator)
        return data, self.version, episodes


class ImpalaActors:
    """``cfg.actors`` UnrollActors on Ray and the one call each has in flight."""

    def __init__(self, cfg: Any, env_cfg: Any, seed: int, net: torch.nn.Module) -> None:
        try:
            import ray
        except ImportError:
            raise ReinforgeError("classic.agent.actors > 0 needs Ray: pip install 'reinforge[ray]'") from None
        if env_cfg is None:
            raise ReinforgeError("impala with actors needs the environment's config (build_agent(env_cfg=...))")
        self.ray = ray
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            kwargs = {"address": cfg.ray_address} if cfg.ray_address else {
                "num_cpus": max(2, cfg.actors + 1), "include_dashboard": False, "log_to_driver": False}
            ray.init(**kwargs)
        remote = ray.remote(num_cpus=1)(UnrollActor)
        env = env_cfg.model_dump()
        self.actors = [remote.remote(env, cfg.gamma, seed + 1000 * (i + 1), list(cfg.hidden), cfg.unroll_length)
                       for i in range(cfg.actors)]
        ray.get([actor.ready.remote() for actor in self.actors])  # started (imports, environments) before timing
        self.pending: dict[Any, int] = {}
        self.ready: list[int] = []
        self.publish(net, 0)
        for i in range(len(self.actors)):
            self._submit(i)

    def publish(self, net: torch.nn.Module, version: int) -> None:
        self.weights = (self.ray.put({k: v.detach().clone() for k, v in net.state_dict().items()}), version)

    def _submit(self, i: int) -> None:
        self.pending[self.actors[i].unroll.remote(*self.weights)] = i

    def next_unroll(self) -> tuple[dict, int, list]:
        """The first unroll any actor finishes (blocking)."""
        done, _ = self.ray.wait(list(self.pending), num_returns=1)
        self.ready.append(self.pending.pop(done[0]))
        return self.ray.get(done[0])

    def resubmit(self) -> None:
        """Send the actors whose unroll was consumed their next call, with the newest weights."""
        while self.ready:
            self._submit(self.ready.pop())

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self.pending = [], {}
        if self.started_ray:
            self.ray.shutdown()
