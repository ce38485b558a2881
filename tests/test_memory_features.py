"""The learner's memory switches: packed dynamic micro-batches, gradient checkpointing, bf16 autocast
and reference offload each leave the update what it was (exactly, or within bf16 precision) and
actually take effect. Packing and checkpointing change the arithmetic's order, not its value: those
updates are compared in float64 (tests/numerics.py)."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_all_exact, exact_approx, float64_model

from reinforge.config import load_config
from reinforge.errors import ConfigError
from reinforge.learn.packing import packed_micro_batches
from reinforge.orchestrate.components import build_components
from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn

pytestmark = pytest.mark.filterwarnings(r"ignore:Seems like `optimizer.step\(\)` has been overridden")

BASE = ["rollout.prompts_per_step=4", "rollout.group_size=4", "task.heldout_size=20", "train.time_limit_s=0",
        "algo.skip_equal_reward_groups=false", "eval.final_samples=0", "log.report=false", "algo.kl.coef=0.05",
        "algo.kl.placement=loss", "train.micro_batch_tokens=120", "rollout.temperature=1.0"]


def _update(tmp_path, *overrides, batch=None, spy=None, exact=False):
    """One learner update on a fixed rollout batch; returns (gradients at the optimizer step,
    metrics, batch, components). ``exact``: policy and reference in float64."""
    c = build_components(load_config(None, [f"output_dir={tmp_path}", *BASE, *overrides,
                                            *(["model.dtype=float64"] if exact else [])]))
    if exact:
        float64_model(c.learner.model)
        float64_model(c.learner.ref_model)
    if batch is None:
        tasks = c.sampler.next_batch(4)
        _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=1)
        batch, _ = build_batch(score_single_turn(tasks, gens, 4, c.reward_pool), c.cfg.algo, c.engine.pad_id)
        batch.rewards = torch.arange(len(batch), dtype=torch.float32) % 3  # spread in every group: a real gradient
    if spy is not None:
        spy(c)
    captured: dict = {}
    model = c.learner.model
    c.learner.optimizer.step = lambda: captured.update(g=[p.grad.clone() for p in model.parameters()])
    metrics = c.learner.update(batch.select(list(range(len(batch)))))
    return captured["g"], metrics, batch, c


def _assert_same_grads(a, b, atol):
    assert len(a) == len(b) > 0 and sum(float(x.norm()) for x in a) > 1e-3
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-4)


def test_packed_micro_batches_hold_the_budget_and_every_sequence_once():
    lengths = [12, 3, 9, 12, 5, 7, 2, 11]
    micros = packed_micro_batches(lengths, budget_tokens=24)  # rows 12 wide, 2 rows per micro-batch
    assert sorted(i for m in micros for i in m) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in m) <= 24 for m in micros)
    assert len(micros) == 3  # 61 tokens in 6 rows of 12; padded micro-batches (2 rows x 12) would need 4
    assert packed_micro_batches([30, 4], budget_tokens=8) == [[0], [1]]  # one row per micro-batch at least
    assert packed_micro_batches([], 8) == []


@pytest.mark.numerics
def test_packing_gives_the_same_update(tmp_path):
    g0, m0, batch, _ = _update(tmp_path, "train.shared_prefix=false", exact=True)
    g1, m1, _, c = _update(tmp_path, "train.packing=true", batch=batch, exact=True)
    assert c.learner.shared_prefix is None  # packing replaces the shared-prefix forward
    assert sum(float(x.norm()) for x in g0) > 1e-3
    assert_all_exact(g1, g0)
    assert m1["kl_ref"] == exact_approx(m0["kl_ref"])
    assert m1["entropy"] == exact_approx(m0["entropy"])


@pytest.mark.numerics
@pytest.mark.parametrize("shared_prefix", ["true", "false"])
def test_gradient_checkpointing_recomputes_and_gives_the_same_update(tmp_path, shared_prefix):
    calls = {"n": 0}

    def count_layer_calls(c):
        q_proj = c.learner.model.model.layers[0].self_attn.q_proj  # early in the layer: the recompute stops
        q_proj.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))  # after the last saved

    g0, _, batch, _ = _update(tmp_path, f"train.shared_prefix={shared_prefix}", spy=count_layer_calls, exact=True)
    plain = calls["n"]
    calls["n"] = 0
    g1, _, _, c = _update(tmp_path, f"train.shared_prefix={shared_prefix}", "train.gradient_checkpointing=true",
                          batch=batch, spy=count_layer_calls, exact=True)
    assert (c.learner.shared_prefix is not None) == (shared_prefix == "true")
    assert calls["n"] > plain  # the layer ran again in the backward: its activations were not kept
    assert sum(float(x.norm()) for x in g0) > 1e-3
    assert_all_exact(g1, g0)


def test_bf16_autocast_runs_the_forward_in_bf16_and_stays_close(tmp_path):
    dtypes: set = set()

    def record_dtype(c):
        c.learner.model.model.layers[0].mlp.down_proj.register_forward_hook(
            lambda _m, _i, out: dtypes.add(out.dtype))

    g0, m0, batch, _ = _update(tmp_path, spy=record_dtype)
    assert dtypes == {torch.float32}
    dtypes.clear()
    g1, m1, _, c = _update(tmp_path, "train.autocast=bf16", batch=batch, spy=record_dtype)
    assert dtypes == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in c.learner.model.parameters())  # master weights stay fp32
    assert m1["entropy"] == pytest.approx(m0["entropy"], rel=0.05)
    cos = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in g0]),
                                                torch.cat([g.flatten() for g in g1]), dim=0)
    assert cos > 0.95


@pytest.mark.parametrize("native", [True, False])
def test_auto_autocast_is_bf16_where_the_cpu_has_bf16_instructions(tmp_path, monkeypatch, native):
    from reinforge.models import precision

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: native)
    dtypes: set = set()

    def record_dtype(c):
        c.learner.model.model.layers[0].mlp.down_proj.register_forward_hook(
            lambda _m, _i, out: dtypes.add(out.dtype))

    _, _, _, c = _update(tmp_path, "train.autocast=auto", spy=record_dtype)
    assert dtypes == {torch.bfloat16 if native else torch.float32}
    assert precision.resolved_autocast(c.cfg) == ("bf16" if native else "float32")


def test_reference_offload_moves_it_for_its_pass_only(tmp_path):
    moves: list[str] = []

    def spy_moves(c):
        ref = c.learner.ref_model
        original = ref.to

        def to(*args, **kwargs):
            moves.append(str(args[0]))
            return original(*args, **kwargs)

        ref.to = to

    g0, m0, batch, _ = _update(tmp_path)
    g1, m1, _, c = _update(tmp_path, "train.offload_reference=true", batch=batch, spy=spy_moves)
    assert moves == ["cpu", "cpu"]  # to the policy's device (cpu here) for the pass, then back to the cpu
    assert next(c.learner.ref_model.parameters()).device.type == "cpu"
    _assert_same_grads(g0, g1, atol=0)
    assert m1["kl_ref"] == m0["kl_ref"]


def test_memory_switch_conflicts_are_named(tmp_path):
    with pytest.raises(ConfigError, match="train.offload_reference"):
        load_config(None, [f"output_dir={tmp_path}", "train.offload_reference=true", "model.lora.enabled=true"])
    with pytest.raises(ConfigError, match="train.autocast"):
        load_config(None, ["train.autocast=fp8"])


def test_a_training_run_with_every_memory_switch_on(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    result = train(load_config(None, [f"output_dir={tmp_path}", *BASE, "train.steps=2", "eval.every=0",
                                      "train.packing=true", "train.gradient_checkpointing=true",
                                      "train.autocast=bf16", "train.offload_reference=true"]))
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "train/loss" in m]
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(m["train/loss"])) and m["memory/peak_mb"] > 0 for m in rows)
