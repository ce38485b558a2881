import copy

import torch

from reinforge.data.arithmetic import arithmetic_splits
from reinforge.learn.logprobs import token_logprobs
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.types import Batch


def _requests(tokenizer, n=12):
    tasks = list(arithmetic_splits().heldout)[:n]
    return [GenerationRequest(encode_prompt(tokenizer, t.prompt), t.id) for t in tasks]


def test_sampling_logprobs_match_learner_recompute(tiny_model, tiny_tokenizer):
    """The engine's reported log-probs equal the learner's recomputation for the same weights (fp32)."""
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, seed=0)
    for temperature in (1.0, 0.7):
        gens = engine.generate(_requests(tiny_tokenizer), SamplingParams(max_new_tokens=6, n=4, temperature=temperature))
        assert len(gens) == 48
        ids = [g.prompt_ids + g.token_ids for g in gens]
        width = max(map(len, ids))
        input_ids = torch.full((len(ids), width), tiny_tokenizer.pad_token_id)
        attn = torch.zeros_like(input_ids)
        sampled = torch.zeros(len(ids), width)
        mask = torch.zeros(len(ids), width)
        for i, (g, row) in enumerate(zip(gens, ids, strict=True)):
            input_ids[i, : len(row)] = torch.tensor(row)
            attn[i, : len(row)] = 1
            p = len(g.prompt_ids)
            sampled[i, p : len(row)] = torch.tensor(g.logprobs)
            mask[i, p : len(row)] = 1
        with torch.no_grad():
            logp, _ = token_logprobs(tiny_model, input_ids, attn, temperature)
        diff = ((logp - sampled).abs() * mask).max().item()
        assert diff < 1e-4, f"max |logp diff| {diff} at T={temperature}"
        assert mask.sum() > 48  # real completions, not empty ones


def test_greedy_matches_hf_generate(tiny_model, tiny_tokenizer):
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer)
    reqs = _requests(tiny_tokenizer, 20)
    gens = engine.generate(reqs, SamplingParams(max_new_tokens=6, greedy=True))
    for req, gen in zip(reqs, gens, strict=True):
        out = tiny_model.generate(
            torch.tensor([req.prompt_ids]), max_new_tokens=6, do_sample=False,
            pad_token_id=tiny_tokenizer.pad_token_id, eos_token_id=tiny_tokenizer.eos_token_id,
        )[0, len(req.prompt_ids):].tolist()
        assert gen.token_ids == out[: len(gen.token_ids)]
        if gen.finish_reason == "stop":
            assert gen.token_ids[-1] == tiny_tokenizer.eos_token_id
            assert gen.text == tiny_tokenizer.decode(gen.token_ids, skip_special_tokens=True)


def test_stop_strings_length_limit_and_seeding(tiny_model, tiny_tokenizer):
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, seed=1)
    reqs = _requests(tiny_tokenizer, 8)
    short = engine.generate(reqs, SamplingParams(max_new_tokens=1, n=2))
    assert all(len(g.token_ids) == 1 for g in short)
    assert all(g.finish_reason == "length" for g in short if g.token_ids[0] != tiny_tokenizer.eos_token_id)
    # a stop string ends generation right after it appears
    stop = engine.generate(reqs, SamplingParams(max_new_tokens=6, greedy=True, stop=("1",)))
    for g in stop:
        if "1" in g.text:
            assert g.text.endswith("1") and g.finish_reason == "stop"
    a = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, seed=7).generate(reqs, SamplingParams(n=3))
    b = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer, seed=7).generate(reqs, SamplingParams(n=3))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_update_weights_in_place_and_version(tiny_model, tiny_tokenizer):
    engine = TorchRolloutEngine(copy.deepcopy(tiny_model), tiny_tokenizer)
    ptrs = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(0.01)
    engine.update_weights(tiny_model, version=3)
    assert engine.version == 3
    for name, p in engine.model.named_parameters():
        assert p.data_ptr() == ptrs[name]
        torch.testing.assert_close(p, dict(tiny_model.named_parameters())[name], rtol=0, atol=0)
    gens = engine.generate(_requests(tiny_tokenizer, 2), SamplingParams(max_new_tokens=2))
    assert all(g.version == 3 for g in gens)


def test_batch_select_trims_padding():
    ids = torch.tensor([[1, 2, 3, 0], [1, 2, 0, 0]])
    attn = (ids != 0).long()
    b = Batch(ids, attn, attn.float(), torch.zeros(2, 4), torch.tensor([1, 1]), torch.tensor([0, 1]),
              rewards=torch.tensor([0.5, 1.0]), advantages=torch.ones(2, 4))
    assert b.select([1]).input_ids.tolist() == [[1, 2]]
    assert b.select([1]).group_index.tolist() == [1]
    assert b.select([1]).rewards.tolist() == [1.0] and b.select([1]).advantages.shape == (1, 2)
    assert b.select([1]).values is None
    assert b.select([0, 1]).input_ids.shape == (2, 3)
