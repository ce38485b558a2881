"""scripts/probe_nearmiss.py: its pair accuracy, its probe and its features (the measurement itself is in
docs/rewards.md, "What a tiny model learns")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import probe_nearmiss  # noqa: E402

from reinforge.rm.data import near_miss_pairs  # noqa: E402
from reinforge.types import Task  # noqa: E402


def test_pair_accuracy_counts_a_tie_half() -> None:
    chosen, rejected = torch.tensor([2.0, 1.0, 0.0, 3.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert probe_nearmiss.pair_accuracy(chosen, rejected) == pytest.approx((1 + 0.5 + 0 + 1) / 4)


def test_the_probe_reads_a_feature_that_tells_the_sides_apart_and_not_noise() -> None:
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 400, 8, generator=g)
    signal = noise.clone()
    signal[0, :, 3] += 3.0  # correct answers carry +3 on feature 3
    assert probe_nearmiss.probe(signal[:, :200], signal[:, 200:]) > 0.95
    assert abs(probe_nearmiss.probe(noise[:, :200], noise[:, 200:]) - 0.5) < 0.1
    same = torch.ones(2, 50, 4)  # identical features on both sides: every pair a tie
    assert probe_nearmiss.probe(same, same) == 0.5


def test_features_of_tiny_base() -> None:
    from transformers import AutoModelForCausalLM

    from reinforge.models.loading import _existing_model_dir, load_tokenizer

    directory = _existing_model_dir("tiny-base")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(directory)
    tasks = [Task(id=f"t{k}", prompt=[{"role": "user", "content": f"{k}+{k + 3}="}], answer=str(2 * k + 3))
             for k in (11, 25, 40)]
    pairs = near_miss_pairs(tasks, 2)
    ll, states = probe_nearmiss.features(model, tokenizer, pairs, tokenizer.convert_tokens_to_ids("="))
    layers = model.config.num_hidden_layers + 1
    assert ll.shape == (2, 6) and bool(torch.isfinite(ll).all()) and bool((ll < 0).all())
    assert states.shape == (layers, len(probe_nearmiss.POSITIONS), 2, 6, model.config.hidden_size)
    # layer 0 at <eos> is the <eos> embedding, the same on both sides; at the last digit the digits differ
    # (each pair's two answers differ in their last digit for offsets 1 and 2, not for 10)
    assert torch.equal(states[0, 0, 0], states[0, 0, 1])
    assert not torch.equal(states[0, 1, 0], states[0, 1, 1])
