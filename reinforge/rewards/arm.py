"""The autoregressive reward model of GenARM (Xu et al. 2024, "GenARM: Reward Guided Generation with
Autoregressive Reward Model for Test-time Alignment", arXiv:2410.08193): the reward of a completion is
a causal LM's log-likelihood of it,

    r(x, y) = beta * sum_{t in y} log pi_r(y_t | x, y_<t),

trained with the Bradley-Terry loss on preference pairs (``reinforge rm`` with ``model.kind:
autoregressive``; the recipe's ``rm_loss`` applies to r as defined: ``-log sigmoid(r_w - r_l)`` is the
paper's loss ``-log sigmoid(beta (log pi_r(y_w|x) - log pi_r(y_l|x)))``).

Choices, as the paper and its code (``training_trl/train_arm_llama.py``) make them:

* the sum is over the completion's tokens only: the prompt's tokens and padding are excluded; under a
  chat template the completion's tokens are everything after the longest common prefix of the rendered
  ``prompt + completion`` and the rendered ``prompt + ""`` (so the template's end-of-turn tokens, e.g.
  ``<eos>``, are part of y, as the paper's responses end in EOS);
* no length normalisation (the authors' ``length_normalization=False`` default);
* no reference model is subtracted (unlike DPO's implicit reward ``beta log pi/pi_ref``; the authors
  train with ``ref_model=None``);
* pi_r starts from a causal LM (the paper: the base/SFT model; here ``model.path``), every weight
  trained (the paper uses LoRA on 7B models); beta is a constant (``model.beta``; the authors'
  HH-RLHF script: 0.05), saved with the model in ``reinforge_rm.json`` so the scorer computes the same r.

The paper's test-time use, decoding from ``pi_base(y_t|.) pi_r(y_t|.)^(1/beta)``, is not built here;
the model is a reward model (the ``reward_model`` reward term, best-of-n reranking).

The score is one forward of the causal LM over right-padded rows and a masked sum (no per-token Python).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from reinforge.errors import ConfigError
from reinforge.models.precision import at_least_float32
from reinforge.rewards.rm_inputs import RM_CONFIG, reward_text_ids, trained_with

KIND = "autoregressive"  # the value of reinforge_rm.json's "kind" for this model


def completion_logprob_sum(logits: Tensor, input_ids: Tensor, completion_mask: Tensor) -> Tensor:
    """``[B]``: ``sum_t log softmax(logits[t-1])[ids[t]]`` over the positions t >= 1 where
    ``completion_mask`` is 1 (the completion's tokens; position 0 has no prediction)."""
    pred = at_least_float32(logits[:, :-1])
    target = input_ids[:, 1:]
    logp = pred.gather(-1, target[..., None]).squeeze(-1) - torch.logsumexp(pred, dim=-1)
    return (logp * completion_mask[:, 1:].to(logp.dtype)).sum(-1)


class AutoregressiveRewardModel(torch.nn.Module):
    """A causal LM as a reward model: ``forward(input_ids, attention_mask, completion_mask).logits`` is
    ``[B, 1]``, ``beta * completion_logprob_sum``. ``config`` is the LM's (pad id, context length)."""

    reads_completion = True  # its forward needs the completion mask
    heads = 1

    def __init__(self, lm: torch.nn.Module, beta: float) -> None:
        super().__init__()
        self.lm, self.beta = lm, float(beta)
        self.config = lm.config

    def forward(self, input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor) -> Any:
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits
        mask = completion_mask * attention_mask
        return SimpleNamespace(logits=(self.beta * completion_logprob_sum(logits, input_ids, mask))[:, None])

    def save_pretrained(self, directory: Path | str, **kwargs: Any) -> None:
        self.lm.save_pretrained(directory, **kwargs)


def reads_completion(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes a ``completion_mask`` (an autoregressive reward model)."""
    return bool(getattr(model, "reads_completion", False))


def forward_scores(model: torch.nn.Module, ids: Tensor, mask: Tensor, completion: Tensor) -> Tensor:
    """``model``'s ``[B, heads]`` scores: a classifier reads ``(ids, mask)``, an autoregressive reward
    model also the completion mask."""
    if reads_completion(model):
        return model(input_ids=ids, attention_mask=mask, completion_mask=completion).logits
    return model(input_ids=ids, attention_mask=mask).logits


def completion_start(full: list[int], prompt_only: list[int]) -> int:
    """Where the completion's tokens begin in ``full``: the length of its common prefix with the ids of
    the prompt rendered with an empty completion (a token merged across the boundary counts as completion)."""
    return len(os.path.commonprefix([full, prompt_only]))


def ids_and_start(tokenizer: Any, prompt: str | list[dict[str, str]], *completions: str) -> list[tuple[list[int], int]]:
    """For each completion, ``reward_text_ids(prompt, completion)`` and where the completion begins in them
    (``completion_start``; the prompt rendered with an empty completion once for all of them)."""
    prompt_only = reward_text_ids(tokenizer, prompt, "")
    out = []
    for completion in completions:
        ids = reward_text_ids(tokenizer, prompt, completion)
        out.append((ids, completion_start(ids, prompt_only)))
    return out


def keep_last(ids: list[int], start: int, max_length: int) -> tuple[list[int], int]:
    """The last ``max_length`` ids and the completion's start in them (0 if it began before the cut)."""
    kept = ids[-max_length:]
    return kept, max(0, start - (len(ids) - len(kept)))


def completion_mask(lengths: list[int], starts: list[int], width: int) -> Tensor:
    """``[B, width]``: 1 at positions ``starts[b] <= t < lengths[b]`` (rows right-padded)."""
    pos = torch.arange(width)[None, :]
    return ((pos >= torch.tensor(starts)[:, None]) & (pos < torch.tensor(lengths)[:, None])).long()


def is_autoregressive(path: str | Path) -> bool:
    return trained_with(path).get("kind") == KIND


def load_autoregressive(path: str | Path, dtype: torch.dtype) -> AutoregressiveRewardModel:
    """The model ``reinforge rm`` saved with ``model.kind: autoregressive``: a causal LM directory and
    beta from its ``reinforge_rm.json``."""
    from transformers import AutoModelForCausalLM

    beta = trained_with(path).get("beta")
    if not isinstance(beta, int | float):
        raise ConfigError(f"{Path(path) / RM_CONFIG}: an autoregressive reward model needs its beta")
    return AutoregressiveRewardModel(AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype), float(beta))
