"""Where a causal LM keeps the correctness of an addition answer: the measurements behind
docs/rewards.md, "What a tiny model learns (measured)".

    python scripts/probe_nearmiss.py [--model tiny-base] [--train-pairs 6000] [--threads 1]

On the near-miss pairs of ``reinforge rm arithmetic_nearmiss`` (the reference answer over the answer
+-1, +-2, +-10; 3000 held-out pairs from the 500 held-out problems) it prints two figures for a
causal LM (a shipped name, a model directory or a run directory):

- the held-out pair accuracy of the model's own log-likelihood of the answer (the answer tokens and
  ``<eos>``, each side scored as the reward model scorer encodes it): what the LM knows;
- for every layer's hidden state at the last token (``<eos>``, where a sequence-classification reward
  model reads its score) and at the token before it (the answer's last digit), the held-out pair
  accuracy of a logistic-regression probe (standardised features, L2 1e-3, Adam 300 full-batch
  steps) trained to tell chosen from rejected answers on ``--train-pairs`` training pairs: what a
  score head on frozen features can read there.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from reinforge.models.loading import _existing_model_dir, load_tokenizer
from reinforge.rm.config import load_rm_config
from reinforge.rm.data import PreferencePair
from reinforge.rm.train import EncodedPairs, load_pairs

POSITIONS = {"<eos>": 1, "last digit": 2}  # counted back from the end of each sequence


@torch.inference_mode()
def features(model: torch.nn.Module, tokenizer, pairs: list[PreferencePair], equals: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(answer log-likelihood [2, N], hidden states [layers + 1, positions, 2, N, H]); side 0 chosen."""
    data = EncodedPairs(pairs, tokenizer, 64)
    lls, states = [], []
    for start in range(0, len(pairs), 500):
        index = np.arange(start, min(start + 500, len(pairs)))
        ids, mask, _ = data.batch(index)  # the completion mask is not needed here
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        after = torch.arange(ids.shape[1] - 1)[None] >= (ids == equals).int().argmax(1)[:, None]
        lls.append((logp * (after & (mask[:, 1:] == 1))).sum(1).view(2, -1))
        last, rows = mask.sum(1), torch.arange(len(ids))
        hidden = torch.stack(out.hidden_states)
        states.append(torch.stack([hidden[:, rows, last - back] for back in POSITIONS.values()], 1)
                      .unflatten(2, (2, len(index))))
    return torch.cat(lls, 1), torch.cat(states, 3)


def pair_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    return float(((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean())


def probe(train: torch.Tensor, held: torch.Tensor) -> float:
    """Held-out pair accuracy of a logistic regression on ``train`` [2, N, H] (side 0: correct answers)."""
    x = torch.cat([train[0], train[1]])
    y = torch.cat([torch.ones(train.shape[1]), torch.zeros(train.shape[1])])
    mean, std = x.mean(0), x.std(0) + 1e-5
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.Adam([w, b], lr=1e-2)
    for _ in range(300):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(((x - mean) / std) @ w + b, y)
        optimizer.zero_grad()
        (loss + 1e-3 * (w**2).sum()).backward()
        optimizer.step()
    with torch.no_grad():
        return pair_accuracy(((held[0] - mean) / std) @ w, ((held[1] - mean) / std) @ w)


def main() -> None:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-base")
    parser.add_argument("--train-pairs", type=int, default=6000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    directory = _existing_model_dir(args.model)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(directory)
    train_pairs, held_pairs = load_pairs(load_rm_config("arithmetic_nearmiss", []))
    pick = np.random.default_rng(0).permutation(len(train_pairs))[: args.train_pairs]
    equals = tokenizer.convert_tokens_to_ids("=")
    _, train = features(model, tokenizer, [train_pairs[i] for i in pick], equals)
    ll, held = features(model, tokenizer, held_pairs, equals)
    print(f"{args.model}: log-likelihood of the answer, held-out pair accuracy {pair_accuracy(ll[0], ll[1]):.3f} "
          f"({len(held_pairs)} pairs)")
    for layer in range(held.shape[0]):
        figures = ", ".join(f"at {name} {probe(train[layer, k], held[layer, k]):.3f}" for k, name in enumerate(POSITIONS))
        print(f"linear probe on layer {layer}'s hidden state: {figures}")


if __name__ == "__main__":
    main()
