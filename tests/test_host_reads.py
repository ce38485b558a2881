"""The torch engine's decode loop reads the device back rarely (a CPU stand-in for CUDA's sync count).

On a GPU every host read of a device tensor (``.tolist()``, ``.item()``, ``bool(t)``, ``nonzero``, a
boolean-mask index) stalls the host until the device catches up, so the next step's kernels cannot be
queued ahead. ``tests/test_cuda.py`` counts real synchronisations on a GPU; this counts the operations
that cause them on any machine (a torch function mode sees every tensor method call).
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from reinforge.models.loading import load_model, load_tokenizer
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams

HOST_READS = {"item", "tolist", "__bool__", "nonzero", "__int__", "__float__", "__index__", "numpy", "any", "all"}


class HostReads(TorchFunctionMode):
    """Counts the tensor operations that read a tensor's values back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.count: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", str(func))
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else ()
        bool_index = any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                         for a in (index if isinstance(index, tuple) else (index,)))
        if name in HOST_READS or bool_index:
            self.count[name] = self.count.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("continuous", [True, False])
def test_decode_reads_the_device_back_less_than_once_every_four_steps(continuous):
    engine = TorchRolloutEngine(load_model("tiny-base"), load_tokenizer("tiny-base"), "cpu", seed=0,
                                continuous=continuous, sync_every=8)  # the GPU default (the CPU's is 1)
    requests = [GenerationRequest([1, 5 + i, 7], str(i)) for i in range(8)]
    steps = 32
    with HostReads() as reads:
        gens = engine.generate(requests, SamplingParams(max_new_tokens=steps, n=2, ignore_eos=True))
    assert [len(g.token_ids) for g in gens] == [steps] * 16
    assert sum(reads.count.values()) < steps // 4 + 6, reads.count  # + the final collection's reads


def test_slots_that_finish_early_stop_at_eos_and_free_their_slot_for_a_waiting_request():
    """Few slots, many requests, EOS likely: every completion ends at its first EOS or at the limit, and
    every request is served although the slots are read back only every ``sync_every`` steps."""
    model, tok = load_model("tiny-base"), load_tokenizer("tiny-base")
    engine = TorchRolloutEngine(model, tok, "cpu", seed=3, max_batch_sequences=4, sync_every=5)
    eos = engine.eos_ids
    requests = [GenerationRequest([1, 5 + i], str(i)) for i in range(9)]
    gens = engine.generate(requests, SamplingParams(max_new_tokens=8, n=2, temperature=1.5))
    assert len(gens) == 18 and [g.request_id for g in gens] == [str(i) for i in range(9) for _ in range(2)]
    assert {g.finish_reason for g in gens} == {"stop", "length"}
    for g in gens:
        ends = [j for j, t in enumerate(g.token_ids) if t in eos]
        assert len(g.token_ids) == len(g.logprobs) and 1 <= len(g.token_ids) <= 8
        if g.finish_reason == "stop":
            assert ends == [len(g.token_ids) - 1]
        else:
            assert not ends and len(g.token_ids) == 8
