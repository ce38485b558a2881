"""LoRA training clients that share one copy of their base model (docs/service.md, "Clients on one base").

Each LoRA client is one named adapter of a ``learn.multi_lora.MultiLora`` over its base model: the
base's weights exist once however many clients train on it, and every client keeps its own adapter,
optimizer and checkpoints. A client behaves exactly as it would on a copy of its own
(``OwnCopyTrainer``, whose passes, optimizer step, checkpoints and sampler weights it reuses): before
each pass and each weight snapshot it makes its adapter the model's active one. The service runs
training jobs one at a time on one thread, so no two clients' passes interleave on the shared model.
A client that trains every weight (no ``lora_config``) cannot share and gets its own copy.
"""

from __future__ import annotations

import itertools
import threading

from reinforge.service.schema import LoraConfig
from reinforge.service.trainer import LORA_ALPHA, OwnCopyTrainer, TrainingState, lora_targets


class SharedBaseTrainer(OwnCopyTrainer):
    """A LoRA training client as adapter ``name`` of a shared ``MultiLora`` (``TrainingState``)."""

    def __init__(self, multi, name: str, base_model: str, lora: LoraConfig,  # type: ignore[no-untyped-def]
                 lock: threading.RLock) -> None:
        from reinforge.config import LoraConfig as RLora

        base = multi.model.get_base_model() if multi.model is not None else multi.base
        self.base_model, self.lora, self.device = base_model, lora, multi.device
        self.vocab_size = int(base.config.vocab_size)
        cfg = RLora(enabled=True, r=lora.rank, alpha=LORA_ALPHA, target_modules=lora_targets(base, lora))
        with lock:
            multi.create_adapter(name, cfg, seed=lora.seed or 0)
        self.multi, self.adapter_name, self._shared = multi, name, lock
        self.model = multi.model
        self.params = list(multi.adapters[name].params)
        self.optimizer = self._new_optimizer()
        self._grads = None
        self._lock = threading.Lock()
        self.steps = 0

    def _activate(self) -> None:
        """The shared model acts with this client's adapter alone, in eval mode (no dropout)."""
        with self._shared:
            self.model.set_adapter(self.adapter_name)
            self.model.eval()


class SharedBases:
    """A service's ``make_state`` that puts every LoRA client of a base model on one shared copy of it
    (one ``MultiLora`` a base); clients that train every weight get their own copy."""

    def __init__(self) -> None:
        self.bases: dict[str, object] = {}
        self._names = itertools.count()
        self._lock = threading.RLock()

    def __call__(self, base_model: str, path: str, lora: LoraConfig | None, device: str = "cpu",
                 dtype: str = "float32") -> TrainingState:
        if lora is None:
            return OwnCopyTrainer(base_model, path, None, device, dtype)
        key = f"{path}|{device}|{dtype}"
        if key not in self.bases:
            from reinforge.learn.multi_lora import MultiLora
            from reinforge.models.loading import load_model

            self.bases[key] = MultiLora(load_model(path, dtype, device), base_path=path)
        return SharedBaseTrainer(self.bases[key], f"client{next(self._names)}", base_model, lora, self._lock)

    def base_copies(self) -> int:
        """How many copies of a base model the LoRA clients hold between them (one per base served)."""
        return len(self.bases)

