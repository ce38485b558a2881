"""Checkpoint restore across devices (reinforge/learn/checkpoint.py)."""

from __future__ import annotations

import torch


def test_a_rollout_generator_saved_on_another_device_is_seeded_from_its_state_with_a_warning():
    """A CUDA run resumed on the CPU: the CUDA generator's 16-byte state cannot drive the CPU generator;
    the resume seeds it from the state (the same seed each time) and says so."""
    from reinforge.learn.checkpoint import restore_rollout_generator

    cuda_state = torch.arange(16, dtype=torch.uint8)  # the shape of a CUDA (Philox) generator's state
    said, draws = [], []
    for _ in range(2):
        g = torch.Generator()
        restore_rollout_generator(g, cuda_state, "cuda", warn=said.append)
        draws.append(torch.rand(3, generator=g))
    assert torch.equal(draws[0], draws[1]) and len(said) == 2 and "cuda" in said[0]
    g, same = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    restore_rollout_generator(g, same.get_state(), "cpu", warn=said.append)
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=same)) and len(said) == 2
