"""Every policy loss keeps its tensors on the micro-batch's device.

The learner runs each micro-batch on the model's device (CUDA on a GPU); a part that makes a helper
tensor without ``device=`` puts it on the CPU and fails there with a device mismatch, which a CPU-only
suite cannot see. Here every field of the record is a ``meta`` tensor (a second device on any machine):
a loss that mixes in a CPU tensor raises torch's device error. Parts whose maths needs the values
(a boolean index, ``unique``, ``.item()``) stop at that first data-dependent op instead; such a stop
is not a device error, and the test counts how many parts ran through to be sure it checks something.
"""

from __future__ import annotations

import pytest
import torch

from reinforge.algo.aggregation import AggNorm
from reinforge.algo.context import CONTEXT_FIELDS, Context
from reinforge.algo.objective import LOSS_TERMS, Objective, Term
from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.config import load_config

N, T, V = 4, 5, 7
LONG = {"group_index", "lengths", "turn_states", "turn_index", "prompt_key", "subgroups", "old_topk_index"}
BOOL = {"demo", "continues", "state_mask"}
VOCAB = {"logp_vocab", "teacher_logp_vocab", "old_topk_logp", "old_topk_index"}
ROW = {"rewards", "group_index", "lengths", "baseline", "prompt_key", "demo", "continues"}
DEVICE_ERRORS = ("not on the expected device", "same device", "device type")


def _meta(name: str) -> torch.Tensor:
    shape = (N,) if name in ROW else (N, T, V) if name in VOCAB else (N, 2) if name == "subgroups" else (N, T)
    dtype = torch.long if name in LONG else torch.bool if name in BOOL else torch.float32
    return torch.empty(shape, dtype=dtype, device="meta")


def _context() -> Context:
    values = {name: _meta(name) for name in CONTEXT_FIELDS - {"metadata"}}
    values["demo"] = None  # no demonstrations: the rows are made on the micro-batch's device (row_sets)
    values["continues"] = None
    return Context(**{k: v for k, v in values.items()})


def _run(name: str) -> str:
    """'ran', 'data-dependent' or the device error's message."""
    cfg = load_config(None, [])
    policy_cfg = POLICY_LOSSES.entry(name).make_settings({}, name)
    objective = Objective(name, "token_mean", "none", 2.0, cfg.algo, policy_cfg)
    try:
        loss, *_ = objective.loss(_context(), AggNorm(num_tokens=10.0, num_seqs=4.0), [])
    except Exception as e:  # noqa: BLE001 - sorted below
        if any(s in str(e) for s in DEVICE_ERRORS):
            return f"{type(e).__name__}: {e}"
        return "data-dependent"
    assert loss.device.type == "meta"
    return "ran"


def test_every_policy_loss_stays_on_the_micro_batchs_device():
    outcomes = {name: _run(name) for name in POLICY_LOSSES.names()}
    wrong = {k: v for k, v in outcomes.items() if v not in ("ran", "data-dependent")}
    assert not wrong, wrong
    ran = [k for k, v in outcomes.items() if v == "ran"]
    assert len(ran) >= len(outcomes) // 2 and "ppo_clip" in ran, outcomes


# the loss terms whose settings need no controller of the run (the adaptive entropy ones get theirs from the loop)
TERMS = ("entropy", "gkd", "gkd_data", "kl", "kl_dads", "nll", "nll_phi", "rapo_kl")


def _run_term(name: str) -> str:
    cfg = load_config(None, [])
    entry = LOSS_TERMS.entry(name)
    term_cfg = entry.make_settings({}, name) if entry.settings is not None else None
    objective = Objective("ppo_clip", "token_mean", "none", 2.0, cfg.algo,
                          POLICY_LOSSES.entry("ppo_clip").make_settings({}, "ppo_clip"))
    norm = AggNorm(num_tokens=10.0, num_seqs=4.0)
    try:
        objective.loss(_context(), norm, [Term(name, 1.0, term_cfg)], norm)
    except Exception as e:  # noqa: BLE001 - sorted below
        return f"{type(e).__name__}: {e}" if any(s in str(e) for s in DEVICE_ERRORS) else "data-dependent"
    return "ran"


def test_the_loss_terms_stay_on_the_micro_batchs_device():
    outcomes = {name: _run_term(name) for name in TERMS}
    assert all(v in ("ran", "data-dependent") for v in outcomes.values()), outcomes
    assert {"entropy", "kl", "gkd"} <= {k for k, v in outcomes.items() if v == "ran"}, outcomes


@pytest.mark.parametrize("n", [3])
def test_rows_of_a_batch_without_demonstrations_are_made_on_its_device(n):
    from reinforge.algo.objective import row_sets

    rows = row_sets(n, None, None, "meta")
    assert rows.sampled.device.type == rows.guided.device.type == rows.demos.device.type == "meta"


def test_importing_reinforge_stops_jax_from_preallocating_the_gpu_unless_the_user_chose():
    """JAX (shipped in many GPU images, imported by some dependency) reserves 75% of the GPU at its first use
    unless told not to; reinforge tells it, and leaves a user's own setting alone."""
    import os
    import subprocess
    import sys

    code = "import os, reinforge; print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    chosen = subprocess.run([sys.executable, "-c", code], env={**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
                            capture_output=True, text=True, check=True)
    assert (default.stdout.strip(), chosen.stdout.strip()) == ("false", "true")
