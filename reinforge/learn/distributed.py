"""Data-parallel training with ``torch.distributed`` (docs/distributed.md).

One process per rank. Every rank runs the rollout of its share of the step's prompts (whole
groups), builds its batch and calls ``Learner.update``; the learner's collectives make the update
equal to one process training on all the ranks' rows together:

- the loss denominators (``AggNorm``: tokens and sequences of the optimizer mini-batch) and the
  advantages' inputs are all-reduced / all-gathered, so every rank's loss is its exact share of
  the global loss, and gradients are *summed* over ranks;
- ``parallel="ddp"``: every rank holds the whole model (rank 0's weights are broadcast at the
  start); after the last micro-batch of an optimizer step the gradients are summed over ranks in
  one bucketed all-reduce (the algorithm of torch's ``DistributedDataParallel`` under gradient
  accumulation, which also communicates only in the last backward). Torch's wrapper is not used:
  its reducer only fires for forwards through the wrapper, which the shared-prefix forward and the
  LoRA reference pass do not take, and it needs every rank to run the same backwards, while ranks
  hold different numbers of rows;
- ``parallel="fsdp"``: FSDP2 (``fully_shard`` on every decoder layer and the root); parameters,
  gradients and optimizer state are sharded; gradients are reduce-scattered as sums.

Launch: ``reinforge train ... train.world_size=N`` spawns N processes (``orchestrate.run.spawn_train``), or run
under ``torchrun`` (the ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` variables). With
one process every helper here is a no-op and nothing is imported from ``torch.distributed``.
"""

from __future__ import annotations

import atexit
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn

from reinforge.errors import ConfigError, ReinforgeError

if TYPE_CHECKING:
    from reinforge.config import RunConfig

T = TypeVar("T")
BUCKET_ELEMENTS = 1 << 25  # gradients all-reduced per bucket of 32M elements (128 MB in float32)


# ---------------------------------------------------------------------------------- who am I
def _dist():
    import torch.distributed as dist

    return dist


def initialized() -> bool:
    """A process group of more than one rank is running."""
    if not torch.distributed.is_available():
        return False
    dist = _dist()
    return dist.is_initialized() and dist.get_world_size() > 1


def world() -> int:
    return _dist().get_world_size() if initialized() else 1


def rank() -> int:
    if initialized():
        return _dist().get_rank()
    return int(os.environ.get("RANK", "0"))  # after the group is gone, torchrun's rank still says who prints


def is_main() -> bool:
    """Rank 0: the one that logs, evaluates, checkpoints and writes the report."""
    return rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def shard(n: int) -> tuple[int, int]:
    """This rank's contiguous share ``[lo, hi)`` of ``n`` items (sizes differ by at most one)."""
    w, r = world(), rank()
    return r * n // w, (r + 1) * n // w


# ---------------------------------------------------------------------------------- launching
def check(cfg: RunConfig) -> None:
    """Refuse what data-parallel training does not support, naming the fields."""
    w = cfg.train.world_size
    if w == 1:
        return
    if not torch.distributed.is_available():
        raise ConfigError("train.world_size > 1 needs torch.distributed, which this torch build lacks")
    if cfg.orchestrate.mode != "sync":
        raise ConfigError("train.world_size > 1 runs with orchestrate.mode=sync only (each rank rolls out its share)")
    if cfg.rollout.prompts_per_step < w:
        raise ConfigError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} < train.world_size={w}: every "
                          "rank needs at least one prompt (whole groups are split across ranks)")
    if cfg.train.parallel == "fsdp" and cfg.model.lora.enabled:
        raise ConfigError("train.parallel=fsdp does not support model.lora.enabled=true (the adapters are small and "
                          "the base is frozen: use train.parallel=ddp)")
    backend(cfg)


def backend(cfg: RunConfig) -> str:
    cuda = str(cfg.model.device).startswith("cuda")
    name = cfg.train.dist_backend if cfg.train.dist_backend != "auto" else ("nccl" if cuda else "gloo")
    dist = _dist()
    if not (dist.is_gloo_available() if name == "gloo" else dist.is_nccl_available()):
        raise ConfigError(f"train.dist_backend={name}: this torch build has no {name} backend")
    if name == "nccl" and not cuda:
        raise ConfigError("train.dist_backend=nccl needs model.device=cuda; use gloo on CPU")
    return name


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" in os.environ


def needs_spawn(cfg: RunConfig) -> bool:
    """``train.world_size > 1`` in a process that is not one rank of a group yet (nor under torchrun)."""
    return cfg.train.world_size > 1 and not initialized() and not under_torchrun()


def resolved_world_size(cfg: RunConfig) -> int:
    """The run's number of ranks: under torchrun the processes it started (``train.world_size`` may be
    left at 1 or name the same number), else ``train.world_size``. ``resolve_config`` records it in
    the run's resolved config, so the saved config says how the run was trained."""
    if not under_torchrun():
        return cfg.train.world_size
    env_world = int(os.environ["WORLD_SIZE"])
    if cfg.train.world_size not in (1, env_world):
        raise ConfigError(f"train.world_size={cfg.train.world_size}, but torchrun started {env_world} processes")
    return env_world


def init(cfg: RunConfig) -> bool:
    """Join the process group: torchrun's (from its environment variables), or the one a spawned
    worker set up. A no-op with one process. Sets this rank's device and torch threads. True when
    this call joined torchrun's group: the caller then ends it with ``finish()``. ``cfg`` is the
    resolved config (``orchestrate.components.resolve_config``): its world size is torchrun's."""
    joined = False
    if not initialized() and under_torchrun():
        if resolved_world_size(cfg) != cfg.train.world_size:
            raise ConfigError(f"train.world_size={cfg.train.world_size}, but torchrun started "
                              f"{os.environ['WORLD_SIZE']} processes: pass the resolved config "
                              "(orchestrate.components.resolve_config)")
        check(cfg)
        _init_group(cfg)
        atexit.register(shutdown)  # after an error; a finished run leaves through finish()
        joined = True
    if initialized() and world() != cfg.train.world_size:
        raise ConfigError(f"train.world_size={cfg.train.world_size}, but the process group has {world()} ranks")
    return joined


def _init_group(cfg: RunConfig) -> None:
    name = backend(cfg)
    if str(cfg.model.device).startswith("cuda"):  # model.device=cuda means this rank's GPU
        torch.cuda.set_device(local_rank())
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
    _dist().init_process_group(name)


def finish() -> None:
    """Leave the process group after a finished run: wait until every rank is done (rank 0 evaluates
    and checkpoints after the others' last collective), then destroy the group while the interpreter
    is fully alive. A rank that tore its connections down while another still worked, or left them to
    interpreter teardown, aborted now and then in gloo ("terminate called without an active exception")."""
    if initialized():
        _dist().barrier()
    shutdown()


def shutdown() -> None:
    """Destroy the process group without waiting for the other ranks (after an error); a no-op without one."""
    if torch.distributed.is_available() and _dist().is_initialized():
        _dist().destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn: Callable[..., Any], cfg: RunConfig, *args: Any) -> None:
    """Run ``fn(*args)`` in ``train.world_size`` new processes, each one rank of a fresh group on
    this machine. Raises ``ReinforgeError`` when a rank fails (the others are then stopped)."""
    import torch.multiprocessing as mp

    check(cfg)
    w = cfg.train.world_size
    try:
        mp.spawn(_worker, args=(w, free_port(), cfg, fn, args), nprocs=w, join=True)
    except mp.ProcessRaisedException as e:
        raise ReinforgeError(f"train.world_size={w}: a rank failed:\n{e}") from None
    except mp.ProcessExitedException as e:
        raise ReinforgeError(f"train.world_size={w}: a rank exited: {e}") from None


def _worker(index: int, w: int, port: int, cfg: RunConfig, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(w), LOCAL_WORLD_SIZE=str(w),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _init_group(cfg)
    try:
        fn(*args)
        finish()
    finally:
        shutdown()


# ---------------------------------------------------------------------------------- collectives
def all_reduce(values: Sequence[float], op: str = "sum") -> list[float]:
    """Element-wise sum (or max) over ranks, in float64; ``values`` as is with one process."""
    if not initialized():
        return list(values)
    dist = _dist()
    t = torch.tensor(list(values), dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.tolist()


def all_ranks(flag: bool) -> bool:
    """True when ``flag`` is true on every rank."""
    return all_reduce([0.0 if flag else 1.0], "max")[0] == 0.0


def any_rank(flag: bool) -> bool:
    return all_reduce([1.0 if flag else 0.0], "max")[0] == 1.0


def all_gather_object(obj: T) -> list[T]:
    if not initialized():
        return [obj]
    out: list[Any] = [None] * world()
    _dist().all_gather_object(out, obj)
    return out


def gather_object(obj: T) -> list[T] | None:
    """Every rank's ``obj`` on rank 0 (in rank order), None on the others."""
    if not initialized():
        return [obj]
    out: list[Any] | None = [None] * world() if is_main() else None
    _dist().gather_object(obj, out, dst=0)
    return out


def from_main(fn: Callable[[], T]) -> T:
    """``fn()`` evaluated on rank 0 and sent to every rank."""
    if not initialized():
        return fn()
    box = [fn() if is_main() else None]
    _dist().broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if _dist().get_backend() == "nccl" else torch.device("cpu")


# ---------------------------------------------------------------------------------- models
def is_fsdp(model: object) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (``model.model.layers`` for Llama, Qwen, Mistral, ...)."""
    for path in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers"):
        try:
            layers = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(layers, nn.ModuleList):
            return list(layers)
    raise ConfigError(f"train.parallel=fsdp: no decoder layers found in {type(model).__name__} "
                      "(looked for model.layers, model.decoder.layers, transformer.h, gpt_neox.layers)")


def wrap_model(model: nn.Module, parallel: str) -> nn.Module:
    """Prepare ``model`` for data-parallel training (a no-op with one process).

    ``ddp``: rank 0's parameters and buffers are broadcast, so every replica starts equal; the model
    is returned as is and its gradients are summed by ``all_reduce_grads``. ``fsdp``: FSDP2
    ``fully_shard`` on every decoder layer, then on the root (in place: the same object, its
    parameters now sharded ``DTensor``s); gradients are reduce-scattered as sums (divide factor 1),
    so the loss needs no world-size scaling. Build the optimizer after this."""
    if not initialized():
        return model
    if parallel == "ddp":
        dist = _dist()
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        return model
    if parallel != "fsdp":
        raise ConfigError(f"train.parallel: allowed values: ddp, fsdp (got {parallel!r})")
    from torch.distributed.fsdp import fully_shard

    for module in [*decoder_layers(model), model]:  # the layers first: the root keeps what is left
        fully_shard(module)
        module.set_gradient_divide_factor(1.0)  # type: ignore[operator]  # sum over ranks, not mean (per module)
        module.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]  # gloo has no PREMUL_SUM
    return model


@torch.no_grad()
def all_reduce_grads(params: Sequence[nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over ranks (a missing gradient counts as zeros), in buckets."""
    if not initialized():
        return
    dist = _dist()
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    bucket: list[Tensor] = []
    size = 0
    for g in [*grads, None]:
        if bucket and (g is None or size + g.numel() > BUCKET_ELEMENTS or g.dtype != bucket[0].dtype):
            flat = torch.cat([b.reshape(-1) for b in bucket])
            dist.all_reduce(flat)
            for b, part in zip(bucket, flat.split([b.numel() for b in bucket]), strict=True):
                b.copy_(part.view_as(b))
            bucket, size = [], 0
        if g is not None:
            bucket.append(g)
            size += g.numel()


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The whole (unsharded) weights of an FSDP2 model, on every rank (a collective: every rank
    calls it). Keys are the plain model's (``fully_shard`` keeps the names)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def load_full_state_dict(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Set an FSDP2 model's weights from a full state dict that every rank holds (each keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An FSDP2 optimizer's whole state (keyed by parameter name), on rank 0 (empty elsewhere); a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


class FullStateModel:
    """An FSDP2 policy as ``save_checkpoint`` sees it: ``save_pretrained`` writes the whole weights
    (gathered by ``full_state_dict``) like a plain model's, loadable without torch.distributed."""

    def __init__(self, model: nn.Module, state: dict[str, Tensor]) -> None:
        self.model, self.state = model, state

    def save_pretrained(self, directory, **kwargs: Any) -> None:  # type: ignore[no-untyped-def]
        self.model.save_pretrained(directory, state_dict=self.state, **kwargs)  # type: ignore[operator]


def rollout_weights(model: nn.Module) -> Mapping[str, Tensor] | nn.Module:
    """What a rollout engine copies from the policy: the full weights of an FSDP2 model (a
    collective), the model itself otherwise."""
    if torch.distributed.is_available() and initialized() and is_fsdp(model):
        return full_state_dict(model)
    return model


def seed_rollout(generator: torch.Generator, seed: int, step: int) -> None:
    """With several ranks, each rank samples step ``step`` from its own seed (a function of seed, rank
    and step only, so a resumed run samples what the uninterrupted one would have). One process
    keeps its engine's running generator (saved in checkpoints)."""
    if initialized():
        import numpy as np

        generator.manual_seed(int(np.random.SeedSequence([seed, rank(), step]).generate_state(1, np.uint64)[0] >> 1))
