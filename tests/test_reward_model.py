"""Classifier reward models: tiny random Llama / GPT-2 sequence classifiers built here, with the shipped tokenizer."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from numerics import exact_approx, float64_model

from reinforge.errors import ConfigError
from reinforge.rewards.reward_model import RewardModelScorer, RewardModelVerifier, RunningMeanStd
from reinforge.types import Task

PROMPTS = ["12+34=", "5+5=", "1+2=", "70+8=", "9+90=", "3+33="]
COMPLETIONS = ["46", "10", "3+0=3", "78", "99 99 99", "36"]


def tasks() -> list[Task]:
    return [Task(f"t{i}", p, "0") for i, p in enumerate(PROMPTS)]


def build(kind: str, tok, pad_token_id: int | None = 0, num_labels: int = 1, exact: bool = False) -> torch.nn.Module:
    """A random reward model; ``exact``: in float64, for comparing two paths (tests/numerics.py)."""
    from transformers import (
        GPT2Config,
        GPT2ForSequenceClassification,
        LlamaConfig,
        LlamaForSequenceClassification,
    )

    torch.manual_seed(0)
    if kind == "llama":  # initializer_range 0.5: scores of order 1, so a 1e-5 tolerance means something
        config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                             initializer_range=0.5, pad_token_id=pad_token_id, num_labels=num_labels)
        model = LlamaForSequenceClassification(config).eval()
    else:
        config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                            initializer_range=0.5, pad_token_id=pad_token_id, num_labels=num_labels)
        model = GPT2ForSequenceClassification(config).eval()
    return float64_model(model) if exact else model


def one_by_one(model, ids_list: list[list[int]]) -> list[float]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([ids])).logits[0, 0].item() for ids in ids_list]


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_batched_scores_equal_one_by_one(kind, tiny_tokenizer):
    model = build(kind, tiny_tokenizer, exact=True)
    scorer = RewardModelScorer(model, tiny_tokenizer, batch_size=4)
    batched = scorer.score(tasks(), COMPLETIONS)
    expected = one_by_one(model, [scorer.encode(t, c) for t, c in zip(tasks(), COMPLETIONS, strict=True)])
    assert np.ptp(expected) > 0.1  # the scores differ, so a mix-up of rows would show
    assert batched == [exact_approx(e) for e in expected]
    assert tiny_tokenizer.padding_side == "left"  # the shared tokenizer is not modified


@pytest.mark.numerics
def test_left_padding_would_change_absolute_position_models(tiny_tokenizer):
    # Why we right-pad: GPT-2's learned positions shift under left padding (the tokenizer's side).
    model = build("gpt2", tiny_tokenizer, exact=True)
    short, long = tiny_tokenizer("1+2=3")["input_ids"], tiny_tokenizer("12+34=46")["input_ids"]
    padded = torch.tensor([[0] * (len(long) - len(short)) + short, long])
    mask = (padded != 0).long()
    with torch.no_grad():
        left = model(input_ids=padded, attention_mask=mask).logits[0, 0].item()
    alone = one_by_one(model, [short])[0]
    assert abs(left - alone) > 1e-3
    scorer = RewardModelScorer(model, tiny_tokenizer)
    assert scorer.score([Task("a", "1+2=", "3"), Task("b", "12+34=", "0")], ["3", "46"])[0] == exact_approx(alone)


def test_encoding_chat_template_raw_text_and_messages_without_template(tiny_tokenizer):
    scorer = RewardModelScorer(build("llama", tiny_tokenizer), tiny_tokenizer)
    tok = tiny_tokenizer
    chat = Task("c", [{"role": "user", "content": "1+2="}], "3")
    assert scorer.encode(chat, "3") == [tok.bos_token_id, *tok("1+2=3", add_special_tokens=False)["input_ids"],
                                        tok.eos_token_id]
    assert scorer.encode(Task("r", "1+2=", "3"), "3") == tok("1+2=3")["input_ids"]
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    no_template = RewardModelScorer(build("llama", plain), plain)
    two = Task("m", [{"role": "user", "content": "1+"}, {"role": "user", "content": "2="}], "3")
    assert no_template.encode(two, "3") == plain("1+\n2=3")["input_ids"]


@pytest.mark.numerics
def test_long_sequences_keep_their_end(tiny_tokenizer, caplog):
    model = build("llama", tiny_tokenizer, exact=True)
    scorer = RewardModelScorer(model, tiny_tokenizer, max_length=4)
    task = Task("t", "12+34=", "46")
    with caplog.at_level(logging.WARNING, logger="reinforge.rewards.reward_model"):
        got = scorer.score([task, task], ["46", "4"])
    ids = tiny_tokenizer("12+34=46")["input_ids"]
    assert got[0] == exact_approx(one_by_one(model, [ids[-4:]])[0])
    assert scorer.truncated == 2 and len([r for r in caplog.records if "max_length" in r.getMessage()]) == 1


def test_several_heads_are_aggregated_and_missing_pad_id_is_filled(tiny_tokenizer):
    two = build("llama", tiny_tokenizer, num_labels=2)
    mean = RewardModelScorer(two, tiny_tokenizer).score(tasks(), COMPLETIONS)
    low = RewardModelScorer(two, tiny_tokenizer, aggregate="min").score(tasks(), COMPLETIONS)
    encoder = RewardModelScorer(two, tiny_tokenizer)
    with torch.inference_mode():  # one pair at a time: no padding
        heads = [two(input_ids=torch.tensor([encoder.encode(t, c)])).logits[0]
                 for t, c in zip(tasks(), COMPLETIONS, strict=True)]
    assert mean == pytest.approx([float(h.mean()) for h in heads], abs=1e-5)
    assert low == pytest.approx([float(h.min()) for h in heads], abs=1e-5)
    model = build("llama", tiny_tokenizer, pad_token_id=None)
    scorer = RewardModelScorer(model, tiny_tokenizer)
    assert model.config.pad_token_id == tiny_tokenizer.pad_token_id == scorer.pad_id
    assert len(scorer.score(tasks(), COMPLETIONS)) == len(PROMPTS)  # batch > 1 needs a pad id
    with pytest.raises(ConfigError, match="normalise"):
        RewardModelScorer(model, tiny_tokenizer, normalise="batch")
    with pytest.raises(ConfigError, match="no config.json"):
        RewardModelScorer("/nonexistent/rm", tiny_tokenizer)


def test_loads_from_a_directory(tiny_tokenizer, tmp_path):
    model = build("llama", tiny_tokenizer)
    model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    loaded = RewardModelScorer(str(tmp_path), batch_size=2)  # the tokenizer comes from the same directory
    expected = RewardModelScorer(model, tiny_tokenizer, batch_size=2).score(tasks(), COMPLETIONS)
    assert loaded.score(tasks(), COMPLETIONS) == pytest.approx(expected, abs=1e-5)  # the same computation


# --- normalisation ------------------------------------------------------------------------------


def test_running_mean_std_on_hand_values():
    norm = RunningMeanStd()
    norm.update([1.0, 2.0, 3.0])
    assert (norm.count, norm.mean, norm.var) == (3, pytest.approx(2.0), pytest.approx(2 / 3))
    norm.update([4.0, 5.0])
    assert (norm.count, norm.mean, norm.var) == (5, pytest.approx(3.0), pytest.approx(2.0))
    norm.update([])
    assert norm.count == 5
    restored = RunningMeanStd()
    restored.load_state_dict(norm.state_dict())
    assert restored.state_dict() == norm.state_dict()


def test_running_mean_std_matches_numpy_over_uneven_batches():
    values = np.random.default_rng(0).normal(3.0, 2.0, size=103)
    norm = RunningMeanStd()
    for chunk in np.split(values, [1, 8, 50, 51]):
        norm.update(chunk.tolist())
    assert norm.mean == pytest.approx(values.mean(), rel=1e-12) and norm.var == pytest.approx(values.var(), rel=1e-12)


def test_running_normalisation_uses_every_score_seen(tiny_tokenizer):
    model = build("llama", tiny_tokenizer)
    raw = RewardModelScorer(model, tiny_tokenizer).score(tasks(), COMPLETIONS)
    scorer = RewardModelScorer(model, tiny_tokenizer, normalise="running", eps=0.0)
    first = scorer.score(tasks()[:4], COMPLETIONS[:4])
    assert first == pytest.approx(((np.array(raw[:4]) - np.mean(raw[:4])) / np.std(raw[:4])).tolist(), abs=1e-6)
    second = scorer.score(tasks()[4:], COMPLETIONS[4:])
    assert second == pytest.approx(((np.array(raw[4:]) - np.mean(raw)) / np.std(raw)).tolist(), abs=1e-6)
    resumed = RewardModelScorer(model, tiny_tokenizer, normalise="running")
    resumed.load_state_dict(scorer.state_dict())
    assert resumed.norm.count == 6 and resumed.norm.mean == pytest.approx(np.mean(raw))


def test_verifier_wrapper_thresholds_the_score(tiny_tokenizer):
    scorer = RewardModelScorer(build("llama", tiny_tokenizer), tiny_tokenizer)
    raw = scorer.score(tasks(), COMPLETIONS)
    threshold = float(np.median(raw))
    verifier = RewardModelVerifier(scorer, threshold=threshold)
    results = [verifier(t, c) for t, c in zip(tasks(), COMPLETIONS, strict=True)]
    assert [r.reward for r in results] == pytest.approx(raw, abs=1e-5)
    assert [r.correct for r in results] == [s > threshold for s in raw]
    assert 0 < sum(r.correct for r in results) < len(raw)
