"""Policy weights in shared memory, from the learner process to rollout worker processes.

The learner owns one shared-memory tensor per parameter (``torch.Tensor.share_memory_``); handing
the ``SharedWeights`` to a process (spawn) passes the memory itself (file descriptors), not a
copy. One copy per side per update, no disk, no pickling.

Consistency without a lock (a seqlock): ``publish`` makes the sequence number odd, copies the
learner's parameters in, sets the version and makes the sequence even again; a reader copies the
tensors into its engine and keeps the copy only if the sequence was even and unchanged across it,
else it copies again. The writer never waits for a reader, so a rollout worker killed in the
middle of a copy cannot block the learner (a lock held by a dead process would, forever).
"""

from __future__ import annotations

import multiprocessing as mp
import time

import torch
from torch import Tensor, nn

from reinforge.learn.lora import merged_weights


class SharedWeights:
    def __init__(self, model: nn.Module, ctx=None) -> None:
        ctx = ctx or mp.get_context("spawn")
        with torch.no_grad():
            self.tensors: dict[str, Tensor] = {
                name: p.detach().clone().share_memory_() for name, p in merged_weights(model).items()
            }
        self._version = ctx.Value("q", 0, lock=False)
        self._sequence = ctx.Value("q", 0, lock=False)

    @property
    def version(self) -> int:
        return int(self._version.value)

    @torch.no_grad()
    def publish(self, model: nn.Module, version: int) -> None:
        """Copy ``model``'s parameters in and make them ``version`` (single writer: the learner)."""
        source = merged_weights(model)  # LoRA: adapters merged in; else the parameters themselves
        self._sequence.value += 1  # odd: a write is in progress
        for name, shared in self.tensors.items():
            shared.copy_(source[name])
        self._version.value = version
        self._sequence.value += 1

    def sync_engine(self, engine) -> bool:
        """Give ``engine`` the published weights if they are newer than its own; True when they
        were. A copy that overlapped a publish is redone. Use as the engine's ``weight_poll``."""
        while True:
            before = int(self._sequence.value)
            if before % 2:
                time.sleep(0.0005)
                continue
            version = int(self._version.value)
            if version == engine.version:
                return False
            engine.update_weights(self.tensors, version)
            if int(self._sequence.value) == before:
                return True
