"""A tiny random policy with broad next-token distributions and exact completion probabilities, for
distribution tests of group samplers (tests/test_group_samplers_*.py)."""

from __future__ import annotations

import torch

from reinforge.rollout.continuation import sampling_distribution
from reinforge.rollout.types import SamplingParams


def random_policy(seed: int, scale: float = 0.05):
    """A one-layer Llama over the shipped tokenizer's 18 tokens, embeddings ~ N(0, scale) (peaked, varied)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from reinforge.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-base")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, scale)
    return model.eval(), tok


@torch.no_grad()
def exact_completion_probs(model, prompt: list[int], params: SamplingParams, eos: int) -> dict[tuple[int, ...], float]:
    """P(completion) under ``params`` (temperature, top-k, top-p), by enumerating every completion of at
    most ``params.max_new_tokens`` tokens (ending at EOS or the limit)."""
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    while frontier:
        prefixes = [p for p, _ in frontier]
        ids = torch.tensor([prompt + list(p) for p in prefixes])
        probs, _ = sampling_distribution(model(input_ids=ids).logits[:, -1], params)
        nxt = []
        for (prefix, mass), row in zip(frontier, probs, strict=True):
            for tok in row.nonzero().squeeze(-1).tolist():
                seq, m = prefix + (tok,), mass * float(row[tok])
                if tok == eos or len(seq) == params.max_new_tokens:
                    out[seq] = out.get(seq, 0.0) + m
                else:
                    nxt.append((seq, m))
        frontier = nxt
    return out


def chi_square_pvalue(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float],
                      min_expected: float = 5.0) -> float:
    """Pearson's goodness-of-fit p-value of ``counts`` against ``probs`` (categories expected fewer than
    ``min_expected`` times pooled into one); a completion with probability 0 gives p = 0."""
    total = sum(counts.values())
    if any(k not in probs for k in counts):
        return 0.0
    observed, expected, pooled_o, pooled_e = [], [], 0.0, 0.0
    for k, p in probs.items():
        if total * p >= min_expected:
            observed.append(counts.get(k, 0))
            expected.append(total * p)
        else:
            pooled_o += counts.get(k, 0)
            pooled_e += total * p
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    o, e = torch.tensor(observed, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    stat = float(((o - e) ** 2 / e).sum())
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
