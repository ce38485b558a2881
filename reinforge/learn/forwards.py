"""Training forwards: how the learner computes per-token log-probs (and entropies) of a micro-batch.

Each is a registered part (``FORWARDS``) with the same arithmetic and a different cost: ``plain``
(the model's own forward over the padded rows), ``shared_prefix`` (each group's prompt computed once,
Llama/Qwen2; falls back to ``plain`` for rows whose prompts differ) and ``packed`` (sequences end to
end, no compute on padding). Each computes the LM head in chunks of positions with
``train.logprob_chunk_tokens`` > 0 (learn/lm_head.py). ``select_forward`` picks one from ``train.packing`` /
``train.shared_prefix`` and what the model and the parallel strategy support. All return float32
(float64 for a float64 model), also under autocast. The full next-token rows [N, L, V] a part may read
(``Context.logp_vocab``, GKD's) come from the plain forward in every case (``vocab_logprobs``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from reinforge.errors import ConfigError
from reinforge.learn.lm_head import check_plain_head
from reinforge.learn.logprobs import token_logprobs, vocab_logprobs
from reinforge.learn.packing import packed_token_logprobs
from reinforge.learn.shared_prefix import SharedPrefixForward, shared_prefix_logprobs
from reinforge.models.lean_llama import supports as shared_prefix_supported
from reinforge.registry import Registry, kind
from reinforge.types import Batch

FORWARDS: Registry = kind("forward", Registry("training forward"))


@FORWARDS.register("plain", formula="log pi(y_t | y_<t) from the model's forward over padded rows", paper="-")
class PlainForward:
    """The model's own forward over the micro-batch's padded rows."""

    def __init__(self, policy: nn.Module, hf_model: nn.Module, cfg: Any) -> None:
        """``policy``: the learner's model (peft-wrapped with LoRA, FSDP2-sharded with several ranks);
        ``hf_model``: the HF model inside it; ``cfg``: the run's ``train`` section."""
        self.chunk_tokens = chunk_tokens(hf_model, cfg)

    def logprobs(self, model: nn.Module, mb: Batch, temperature: float, entropy: bool) -> tuple[Tensor, Tensor | None]:
        return token_logprobs(model, mb.input_ids, mb.attention_mask, temperature, entropy, entropy_grad=True,
                              chunk_tokens=self.chunk_tokens, model_inputs=mb.model_inputs)

    def vocab_logprobs(self, model: nn.Module, mb: Batch, temperature: float, entropy: bool
                       ) -> tuple[Tensor, Tensor | None, Tensor]:
        """``logprobs`` and the full rows log pi(. | y_<t) [N, L, V] on the loss mask's positions (zeros
        elsewhere), for a part that reads ``logp_vocab`` or ``teacher_logp_vocab``. Every forward
        computes them with the model's own forward over the padded rows (this one)."""
        return vocab_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature, entropy,
                              entropy_grad=True, model_inputs=mb.model_inputs)


@FORWARDS.register("shared_prefix", formula="each group's prompt once, its completions attending to it",
                   paper="-  (exact: tests/test_shared_prefix.py)")
class SharedPrefixTrainingForward(PlainForward):
    """Each group's shared prompt computed once (Llama/Qwen2). It calls the HF modules (q_proj, mlp,
    ...), so on a peft-injected model it runs the LoRA layers, adapters included and disabled with
    them. Rows whose prompts differ fall back to the plain forward."""

    def __init__(self, policy: nn.Module, hf_model: nn.Module, cfg: Any) -> None:
        super().__init__(policy, hf_model, cfg)
        self.policy = policy
        self.shared = SharedPrefixForward(hf_model, checkpoint_layers=cfg.gradient_checkpointing,
                                          chunk_tokens=self.chunk_tokens)

    def logprobs(self, model: nn.Module, mb: Batch, temperature: float, entropy: bool) -> tuple[Tensor, Tensor | None]:
        if mb.model_inputs:  # pictures: the model's own forward places them (docs/vision.md)
            return super().logprobs(model, mb, temperature, entropy)
        fwd = (self.shared if model is self.policy  # the policy, or the reference
               else SharedPrefixForward(model, chunk_tokens=self.chunk_tokens))
        out = shared_prefix_logprobs(fwd, mb.input_ids, mb.attention_mask, mb.prefix_len, mb.group_index,
                                     temperature, entropy)
        return out if out is not None else super().logprobs(model, mb, temperature, entropy)


@FORWARDS.register("packed", formula="sequences packed end to end, attention block-diagonal per sequence",
                   paper="-  (exact: tests/test_packing.py)")
class PackedForward(PlainForward):
    """The micro-batch's sequences packed end to end: no compute on padding (docs/memory.md)."""

    def logprobs(self, model: nn.Module, mb: Batch, temperature: float, entropy: bool) -> tuple[Tensor, Tensor | None]:
        if mb.model_inputs:
            raise ConfigError("train.packing cannot carry pictures: packed rows lose the one-picture-per-row layout "
                              "the model's forward places image features by (model inputs "
                              + ", ".join(sorted(mb.model_inputs)) + "); set train.packing: false for "
                              "vision-language runs")
        width = int(mb.attention_mask.sum(-1).max())
        return packed_token_logprobs(model, mb.input_ids, mb.attention_mask, width, temperature, entropy,
                                     entropy_grad=True, chunk_tokens=self.chunk_tokens)


def chunk_tokens(hf_model: nn.Module, cfg: Any) -> int:
    """``train.logprob_chunk_tokens``: positions per chunk of the LM head (learn/lm_head.py), 0 for the
    model's own forward; a model whose logits are not ``lm_head(hidden)`` is refused."""
    n = int(cfg.logprob_chunk_tokens)
    if n > 0:
        check_plain_head(hf_model)
    return n


def select_forward(train_cfg: Any, hf_model: nn.Module, fsdp: bool) -> str:
    """``packed`` with ``train.packing``; else ``shared_prefix`` when asked for and possible (a Llama/Qwen2
    model, not sharded by FSDP2, which gathers a layer's parameters only around that layer's own
    forward, while the shared-prefix forward calls its submodules directly); else ``plain``."""
    if train_cfg.packing:
        return "packed"
    if train_cfg.shared_prefix and not fsdp and shared_prefix_supported(hf_model):
        return "shared_prefix"
    return "plain"
