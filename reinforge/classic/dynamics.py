"""A probabilistic dynamics ensemble (Chua et al. 2018, PETS, arXiv:1805.12114; Janner et al. 2019, MBPO,
arXiv:1906.08253), shared by classic/mbpo.py and classic/pets.py. Read top to bottom:

- ``DynamicsSettings``: the ensemble's options (the MBPO authors' ``construct_model`` and ``BNN.train``);
- ``ProbabilisticEnsemble``: E members as one batched module (classic/ensemble.py's ``EnsembleLinear``), SiLU
  (swish) MLPs on standardised (s, a), each predicting a Gaussian over [r, s' - s] with a log-variance softly
  bounded by learned limits (``algo/model_based.bound_log_variance``);
- ``fit``: bootstrapped mini-batches per member, Gaussian NLL + the bound penalty + L2 weight decay, a held-out
  split that stops training after ``max_epochs_since_update`` epochs without a 1% gain of any member, each
  member's best weights restored, the elites = the members of least held-out MSE;
- ``sample_step``: (s, a) -> (s', r) drawn from one member per row (a random elite, or the given members).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from torch import Tensor, nn

from reinforge.algo.model_based import (
    bound_log_variance,
    elite_indices,
    gaussian_nll,
    logvar_bound_penalty,
    member_mse,
)
from reinforge.classic.ensemble import EnsembleLinear
from reinforge.registry import Settings


class DynamicsSettings(Settings):
    """The dynamics ensemble (defaults: the MBPO authors' mbpo/models/constructor.py and bnn.py)."""

    members: int = Field(7, ge=1, description="E: networks in the ensemble")
    elites: int = Field(5, ge=1, description="members used for prediction (least held-out MSE)")
    hidden: list[int] = Field(default_factory=lambda: [200, 200, 200, 200], min_length=1,
                              description="MLP widths (SiLU / swish)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    weight_decay: float = Field(5e-5, ge=0, description="L2 coefficient on the weights (the authors: 2.5e-5 to 1e-4 "
                                "by layer; one value here)")
    batch_size: int = Field(256, ge=1, description="transitions per member per gradient step")
    holdout_ratio: float = Field(0.2, ge=0, lt=1, description="share of the data held out to stop and pick elites")
    max_holdout: int = Field(5000, ge=1, description="at most this many held-out transitions")
    max_epochs_since_update: int = Field(5, ge=1, description="stop after this many epochs without a 1% gain")
    max_epochs: int = Field(100, ge=1, description="at most this many epochs per fit (the authors: no limit)")


class ProbabilisticEnsemble(nn.Module):
    """E Gaussian models p_e(r, s' - s | s, a) as [E, B, 1 + obs_dim] means and bounded log-variances."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: DynamicsSettings) -> None:
        super().__init__()
        self.members, self.obs_dim, out = cfg.members, obs_dim, 1 + obs_dim
        layers: list[nn.Module] = []
        width = obs_dim + act_dim
        for h in cfg.hidden:
            layers += [EnsembleLinear(cfg.members, width, h), nn.SiLU()]
            width = h
        layers.append(EnsembleLinear(cfg.members, width, 2 * out))
        self.body = nn.Sequential(*layers)
        self.max_logvar = nn.Parameter(torch.full((1, 1, out), 0.5))
        self.min_logvar = nn.Parameter(torch.full((1, 1, out), -10.0))
        self.register_buffer("in_mean", torch.zeros(obs_dim + act_dim))
        self.register_buffer("in_std", torch.ones(obs_dim + act_dim))
        self.register_buffer("elite_idx", torch.arange(min(cfg.elites, cfg.members)))

    def set_normalizer(self, inputs: Tensor) -> None:
        """Standardise inputs with these data's mean and std (std below 1e-12 -> 1, as the authors' scaler)."""
        std = inputs.std(0, unbiased=False)
        self.in_mean.copy_(inputs.mean(0))
        self.in_std.copy_(torch.where(std < 1e-12, torch.ones_like(std), std))

    def forward(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """inputs [B, in] (the same rows for every member) or [E, B, in] -> means, log-variances [E, B, 1 + obs]."""
        x = (inputs - self.in_mean) / self.in_std
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, *x.shape)
        mean, raw = self.body(x).chunk(2, dim=-1)
        return mean, bound_log_variance(raw, self.min_logvar, self.max_logvar)

    def decay(self) -> Tensor:
        """sum of squared weights (not biases) of all layers."""
        return sum(m.weight.pow(2).sum() for m in self.body if isinstance(m, EnsembleLinear))  # type: ignore[return-value]


def transition_arrays(obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                      next_obs: np.ndarray) -> tuple[Tensor, Tensor]:
    """Model inputs cat(s, a) [N, obs + act] and targets cat(r, s' - s) [N, 1 + obs] (the authors' order)."""
    inputs = np.concatenate([obs, actions.reshape(len(obs), -1)], -1)
    targets = np.concatenate([rewards.reshape(-1, 1), next_obs - obs], -1)
    return torch.as_tensor(inputs, dtype=torch.float32), torch.as_tensor(targets, dtype=torch.float32)


def _split(n: int, cfg: DynamicsSettings, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    perm = rng.permutation(n)
    n_hold = min(int(n * cfg.holdout_ratio), cfg.max_holdout)
    return perm[n_hold:], perm[:n_hold]


def _epoch(model: ProbabilisticEnsemble, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, cfg: DynamicsSettings,
           rng: np.random.Generator) -> float:
    """One pass over bootstrap resamples (one per member, the authors' ``randint`` indices) in mini-batches."""
    n = len(x)
    idx = torch.as_tensor(rng.integers(0, n, size=(model.members, n)))
    total = 0.0
    for start in range(0, n, cfg.batch_size):
        b = idx[:, start:start + cfg.batch_size]
        mean, logvar = model(x[b])
        loss = gaussian_nll(mean, logvar, y[b]).sum() + logvar_bound_penalty(model.min_logvar, model.max_logvar)
        loss = loss + cfg.weight_decay * model.decay()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += loss.item() * b.shape[1]
    return total / n


@torch.no_grad()
def holdout_mse(model: ProbabilisticEnsemble, x: Tensor, y: Tensor) -> Tensor:
    """Each member's MSE [E] on (x, y)."""
    return member_mse(model(x)[0], y)


def _keep_best(model: ProbabilisticEnsemble, best: dict[str, Tensor], better: Tensor) -> None:
    """Copy the members ``better`` ([E] bool) of the current weights into ``best`` (the per-member [E, ., .]
    slices); what the members share (the log-variance bounds, the normaliser) follows the current values."""
    for k, v in model.state_dict().items():
        if k.startswith("body.") and v.dim() == 3:
            best[k][better] = v[better].clone()
        else:
            best[k] = v.clone()


def fit(model: ProbabilisticEnsemble, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, cfg: DynamicsSettings,
        rng: np.random.Generator) -> dict[str, float]:
    """Train on all of (x, y) (the normaliser refit first), stop as the authors' ``BNN.train``, restore each
    member's best held-out weights, set the elites. Returns the losses before and after."""
    model.set_normalizer(x)
    train, hold = _split(len(x), cfg, rng)
    hx, hy = (x[hold], y[hold]) if len(hold) else (x[train], y[train])
    first = best_loss = holdout_mse(model, hx, hy)
    best = {k: v.clone() for k, v in model.state_dict().items()}
    since, epochs, train_loss = 0, 0, float("nan")
    while epochs < cfg.max_epochs and since <= cfg.max_epochs_since_update:
        train_loss = _epoch(model, opt, x[train], y[train], cfg, rng)
        epochs += 1
        loss = holdout_mse(model, hx, hy)
        better = (best_loss - loss) / best_loss.clamp_min(1e-12) > 0.01
        _keep_best(model, best, better)
        best_loss = torch.where(better, loss, best_loss)
        since = 0 if bool(better.any()) else since + 1
    model.load_state_dict(best)
    final = holdout_mse(model, hx, hy)
    model.elite_idx.copy_(elite_indices(final, len(model.elite_idx)))
    elite = final[model.elite_idx]
    return {"model/holdout_mse_before": float(first[model.elite_idx].mean()), "model/holdout_mse": float(elite.mean()),
            "model/train_loss": train_loss, "model/epochs": float(epochs)}


@torch.no_grad()
def sample_step(model: ProbabilisticEnsemble, obs: Tensor, actions: Tensor, generator: torch.Generator,
                members: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(s' [B, obs], r [B]) drawn from N(mu, s^2) of one member per row: ``members`` [B] (indices into the
    ensemble) or, if None, a uniformly random elite per row (the authors' ``FakeEnv.step``)."""
    mean, logvar = model(torch.cat([obs, actions], -1))
    if members is None:
        pick = torch.randint(len(model.elite_idx), (len(obs),), generator=generator)
        members = model.elite_idx[pick]
    rows = torch.arange(len(obs))
    mu, std = mean[members, rows], (0.5 * logvar[members, rows]).exp()
    draw = mu + std * torch.randn(mu.shape, generator=generator)
    return obs + draw[:, 1:], draw[:, 0]
