"""algo/ope.py against SCOPE-RL's estimators (Kiyohara et al. 2023) on the same logged data; skipped without
``scope-rl`` (it installs beside our dependencies only without its pins: docs/classic.md, "Checks against
SCOPE-RL and d3rlpy"). SCOPE-RL needs episodes of one length, so shorter episodes are padded with steps that
change no estimate: reward 0, both policies' probability 1 on the logged action, Q = 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reinforge.algo.ope import ope_value, per_episode_terms

scope = pytest.importorskip("scope_rl.ope.discrete", reason="the cross-check needs scope-rl (pip install scope-rl)")


def _logged(n: int = 40, horizon: int = 6, actions: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """Episodes of random length 1..horizon: logged actions, rewards, mu(a|s), pi(.|s), Q(s, .), padded."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, horizon + 1, n)
    mask = (np.arange(horizon)[None] < lengths[:, None]).astype(float)
    mu = rng.dirichlet(np.ones(actions), (n, horizon))
    pi = rng.dirichlet(np.ones(actions), (n, horizon))
    action = np.array([[rng.choice(actions, p=p) for p in row] for row in mu])
    one_hot = np.eye(actions)[action]
    pi = np.where(mask[..., None] > 0, pi, one_hot)  # padding: pi = mu = 1 on the logged action
    pscore = np.where(mask > 0, np.take_along_axis(mu, action[..., None], -1)[..., 0], 1.0)
    q = rng.normal(size=(n, horizon, actions)) * mask[..., None]
    return {"mask": mask, "action": action, "reward": rng.normal(size=(n, horizon)) * mask, "pscore": pscore,
            "pi": pi, "q": q}


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_is_wis_pdis_dr_equal_scope_rls(gamma):
    d = _logged()
    n, horizon = d["mask"].shape
    flat = {"step_per_trajectory": horizon, "action": d["action"].reshape(-1), "reward": d["reward"].reshape(-1),
            "pscore": d["pscore"].reshape(-1), "evaluation_policy_action_dist": d["pi"].reshape(n * horizon, -1),
            "state_action_value_prediction": d["q"].reshape(n * horizon, -1), "gamma": gamma}
    t = {k: torch.as_tensor(v) for k, v in d.items()}
    target_logp = torch.log(torch.take_along_dim(t["pi"], t["action"][..., None], -1)[..., 0])
    q_taken = torch.take_along_dim(t["q"], t["action"][..., None], -1)[..., 0]
    v_pi = (t["pi"] * t["q"]).sum(-1) * t["mask"]
    ours = {name: ope_value(*per_episode_terms(name, t["reward"], torch.log(t["pscore"]), target_logp, t["mask"],
                                               gamma, q_taken=q_taken, v_pi=v_pi))
            for name in ("is", "wis", "pdis", "dr")}
    theirs = {"is": scope.TrajectoryWiseImportanceSampling(), "wis": scope.SelfNormalizedTIS(),
              "pdis": scope.PerDecisionImportanceSampling(), "dr": scope.DoublyRobust()}
    for name, estimator in theirs.items():
        assert ours[name] == pytest.approx(estimator.estimate_policy_value(**flat), rel=1e-9), name
