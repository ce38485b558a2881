"""The learner: policy-gradient updates on a rollout batch.

For each rollout batch: ``epochs`` passes, each split into ``minibatches`` optimizer steps; each
mini-batch is cut into micro-batches by a token budget and gradients accumulate. Loss
denominators (``AggNorm``) are computed over the whole mini-batch, so the gradient does not
depend on the micro-batch split.

At the start of an update (``_prepare``), no-grad passes give what the update holds fixed: the
old log-probs of the PPO ratio (skipped when there is a single update per batch and the KL is
not in the reward: they then come from the same forward, exactly on-policy), the reference
log-probs (KL), the critic's values (PPO); then the advantages. The rollout/training mismatch
(learner pi_old vs the engine's sampling log-probs) is reported every step and, if configured,
corrected by truncated or masked importance weights on the per-token policy loss.

With ``model.lora.enabled`` the policy is the base model with LoRA adapters (train/lora.py):
the optimizer sees only the adapter parameters, and the reference log-probs of the KL term come
from the same model with its adapters disabled, so there is no second copy of the weights.

Memory (docs/memory.md): ``train.packing`` packs the sequences of a micro-batch end to end
(train/packing.py; micro-batches then hold ``micro_batch_tokens`` mostly real tokens),
``train.gradient_checkpointing`` recomputes each layer's activations in the backward,
``train.autocast: bf16`` runs the policy and reference forwards under bfloat16 autocast (log-probs,
losses, weights and optimizer state stay float32), ``train.offload_reference`` keeps the frozen
reference on the CPU between its passes.

Data-parallel (``train.world_size`` > 1, train/distributed.py, docs/distributed.md): every rank
calls ``update`` with its own rows (whole groups). The rows of all ranks, in rank order, form the
global batch: the mini-batches are cut from it exactly as one process would cut them, the
denominators of each mini-batch are all-reduced, the advantages are estimated on the gathered
rewards, the gradients are summed over ranks and the metrics reduced, so the update equals one
process's on the global batch (tests/test_distributed.py).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from reinforge.algo import ADVANTAGES, KL_ESTIMATORS, LOSS_AGG, AggNorm
from reinforge.algo.advantages import gae_advantages_and_returns, outcome_token_rewards
from reinforge.algo.context import Context
from reinforge.algo.kl_control import KLController
from reinforge.algo.objective import Objective, loss_terms, required_inputs
from reinforge.algo.value import clipped_value_loss, explained_variance
from reinforge.config import RunConfig
from reinforge.errors import ConfigError, TrainingDiverged
from reinforge.models.precision import compute_dtype
from reinforge.rollout.lean_llama import supports as shared_prefix_supported
from reinforge.train import distributed
from reinforge.train.critic import Critic
from reinforge.train.logprobs import token_logprobs
from reinforge.train.lora import is_lora_model, wrap_lora
from reinforge.train.packing import packed_micro_batches, packed_token_logprobs
from reinforge.train.shared_prefix import SharedPrefixForward, shared_prefix_logprobs
from reinforge.types import Batch


def micro_batches(lengths: Tensor, budget_tokens: int) -> Iterator[list[int]]:
    """Consecutive row groups whose padded size (rows x longest row) stays within ``budget_tokens``.

    A single row longer than the budget forms a micro-batch of its own.
    """
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths.tolist()):
        if current and (len(current) + 1) * max(longest, n) > budget_tokens:
            yield current
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        yield current


class MetricSums:
    """Masked-token sums of per-token statistics, reported as means over all tokens seen."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)

    def add_tokens(self, name: str, values: Tensor, mask: Tensor) -> None:
        self.sums[name] += float((values.detach() * mask).sum())
        self.counts[name] += float(mask.sum())

    def add_scalar(self, name: str, value: float) -> None:
        self.sums[name] += value
        self.counts[name] += 1

    def add_share(self, name: str, value: float) -> None:
        """This rank's share of a value that is the sum over ranks (a loss with global denominators)."""
        self.sums[name] += value
        self.counts[name] += 1.0 / distributed.world()

    def all_reduce(self) -> None:
        """Sums and counts over ranks, so the means weigh every token of every rank alike (the
        ``*_max`` entries: the maximum over ranks). A no-op with one process."""
        if distributed.world() == 1:
            return
        names = sorted(set().union(*distributed.all_gather_object(sorted(self.sums))))
        summed = [n for n in names if not n.endswith("_max")]
        maxed = [n for n in names if n.endswith("_max")]
        totals = distributed.all_reduce([self.sums.get(n, 0.0) for n in summed] +
                                        [self.counts.get(n, 0.0) for n in summed])
        peaks = distributed.all_reduce([self.sums.get(n, 0.0) for n in maxed], "max")
        for i, n in enumerate(summed):
            self.sums[n], self.counts[n] = totals[i], totals[len(summed) + i]
        for n, v in zip(maxed, peaks, strict=True):
            self.sums[n], self.counts[n] = v, 1.0

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / max(self.counts[k], 1.0) for k in self.sums}


class Learner:
    """Owns the trainable policy, the optional frozen reference policy, the optional critic and the optimizers.

    With ``cfg.model.lora.enabled`` a plain ``model`` is wrapped with LoRA adapters here (in place;
    a model already wrapped by peft is taken as is); the reference policy is then the base with
    the adapters disabled, and ``ref_model`` must be None.

    In a process group of several ranks the policy is prepared by ``distributed.wrap_model``
    (``train.parallel``: ddp broadcasts rank 0's weights; fsdp shards them in place, and
    ``self.model`` is then the FSDP2 module). The reference model and the critic stay whole on
    every rank (the critic's gradients are summed over ranks).
    """

    def __init__(
        self, model: nn.Module, cfg: RunConfig, ref_model: nn.Module | None = None, critic: Critic | None = None
    ) -> None:
        if cfg.model.lora.enabled and not is_lora_model(model):
            model = wrap_lora(model, cfg.model.lora, cfg.model.path, seed=cfg.seed)
        self.lora = is_lora_model(model)
        if self.lora and ref_model is not None:
            raise ValueError("a LoRA policy's reference is its base model with the adapters disabled: pass no ref_model")
        self.world = distributed.world()
        self.fsdp = self.world > 1 and cfg.train.parallel == "fsdp"
        if self.fsdp and self.lora:
            raise ConfigError("train.parallel=fsdp does not support model.lora.enabled=true (the adapters are small "
                              "and the base is frozen: use train.parallel=ddp)")
        model = distributed.wrap_model(model, cfg.train.parallel)  # before the optimizer sees the parameters
        if critic is not None:
            distributed.wrap_model(critic.model, "ddp")
        self.model = model.train()
        self.ref_model = ref_model.eval().requires_grad_(False) if ref_model is not None else None
        t = cfg.train
        self.packing = t.packing
        self.offload_reference = t.offload_reference and self.ref_model is not None
        if self.offload_reference:
            self.ref_model.to("cpu")
        hf_model = model.get_base_model() if self.lora else model
        if t.gradient_checkpointing:
            if not getattr(hf_model, "supports_gradient_checkpointing", False):
                raise ConfigError(f"train.gradient_checkpointing: {type(hf_model).__name__} does not support it")
            hf_model.activation_checkpointing_enable({"use_reentrant": False})
        self.critic = critic
        self.cfg = cfg
        self.algo = cfg.algo
        self.objective = Objective(cfg.algo.policy_loss, cfg.algo.loss_agg, cfg.algo.mismatch.mode,
                                   cfg.algo.mismatch.cap, cfg.algo)
        self.kl_estimator = KL_ESTIMATORS.get(cfg.algo.kl.estimator)
        self.kl_ctl = KLController(cfg.algo.kl.coef, cfg.algo.kl.target, cfg.algo.kl.horizon)
        self.needs = required_inputs(cfg.algo)
        if "values" in self.needs and critic is None:
            raise ConfigError(f"algo.advantage={cfg.algo.advantage} needs a critic (a value model); it is built by "
                              "build_components")
        self.max_len_norm = cfg.algo.max_len_norm or float(cfg.rollout.max_new_tokens)
        self.temperature = cfg.rollout.temperature
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=t.lr, betas=t.betas, weight_decay=t.weight_decay,
            **({"fused": True} if t.fused_optimizer else {}),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.shuffle = torch.Generator().manual_seed(cfg.seed + 17)
        self.step = 0
        # The shared-prefix forward calls the HF modules (q_proj, mlp, ...), so on the peft-injected
        # model it runs the LoRA layers: adapters included, and disabled with them. Under FSDP2 it is
        # off: it calls the layers' submodules directly, and FSDP2 gathers a layer's sharded
        # parameters only around that layer's own forward. Packing replaces it.
        self.shared_prefix = (
            SharedPrefixForward(hf_model, checkpoint_layers=t.gradient_checkpointing)
            if t.shared_prefix and not t.packing and not self.fsdp and shared_prefix_supported(hf_model) else None
        )

    @property
    def uses_kl(self) -> bool:
        """Whether the update computes reference log-probs (a part declares ``ref_logp``)."""
        return (self.ref_model is not None or self.lora) and "ref_logp" in self.needs

    def _lr_factor(self, step: int) -> float:
        t = self.cfg.train
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        if t.lr_schedule == "cosine":
            progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
            return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return 1.0

    def state_dict(self) -> dict:
        """The learner's state for a checkpoint. Under FSDP2 a collective (every rank calls it): the
        optimizer's whole state, keyed by parameter name, on rank 0."""
        optimizer = (
            distributed.full_optimizer_state(self.model, self.optimizer) if self.fsdp else self.optimizer.state_dict()
        )
        state = {
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "shuffle": self.shuffle.get_state(),
            "step": self.step,
            "kl_ctl": self.kl_ctl.state_dict(),
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.fsdp:
            distributed.load_full_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.shuffle.set_state(state["shuffle"])
        self.step = state["step"]
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def restore_policy(self, ckpt, dtype: str = "float32", device: str = "cpu") -> None:  # type: ignore[no-untyped-def]
        """Set the policy's weights to a checkpoint's (``checkpoint.restore_policy``; under FSDP2 every
        rank reads the checkpoint and keeps its shard)."""
        if not self.fsdp:
            from reinforge.train.checkpoint import restore_policy

            restore_policy(self.model, ckpt, dtype, device)
            return
        from reinforge.train.model import load_model

        distributed.load_full_state_dict(self.model, load_model(str(ckpt), dtype, device).state_dict())

    def checkpoint_model(self) -> nn.Module | distributed.FullStateModel:
        """What ``save_checkpoint`` saves: the policy; under FSDP2 (a collective: every rank calls it)
        its whole weights, which ``save_pretrained`` writes like a plain model's."""
        if self.fsdp:
            return distributed.FullStateModel(self.model, distributed.full_state_dict(self.model))
        return self.model

    # ------------------------------------------------------------------ update
    def update(self, batch: Batch | None) -> dict[str, float]:
        """All optimizer steps for one rollout batch; returns metrics averaged over them.

        With several ranks every rank calls it at once with its own rows (None when it has none):
        the global batch is all ranks' rows in rank order, and every rank returns its metrics."""
        if batch is None and self.world == 1:
            raise ValueError("Learner.update: no batch")
        self.step += 1
        t = self.cfg.train
        stats = MetricSums()
        n, me = (len(batch) if batch is not None else 0), (distributed.rank() if self.world > 1 else 0)
        sizes = distributed.all_reduce([n if r == me else 0 for r in range(self.world)])
        offset, total = int(sum(sizes[:me])), int(sum(sizes))
        n_updates = t.epochs * min(t.minibatches, total)
        self._prepare(batch, stats, n_updates > 1 or self.algo.kl.placement == "reward", offset)
        train_policy = self.critic is None or self.step > self.algo.critic.warmup_steps
        for _ in range(t.epochs):
            order = torch.randperm(total, generator=self.shuffle) if n_updates > 1 else torch.arange(total)
            for mb_index in torch.tensor_split(order, min(t.minibatches, total)):
                mine = mb_index[(mb_index >= offset) & (mb_index < offset + n)] - offset  # all of it, one process
                self._optimizer_step(batch.select(mine) if len(mine) else None, stats, train_policy)
        if train_policy:
            self.scheduler.step()
        stats.all_reduce()
        out = stats.means()
        if self.uses_kl:
            self.kl_ctl.update(out.get("kl_ref", 0.0), n_steps=total)
            out["kl_coef"] = self.kl_ctl.value
        if self.critic is not None:
            out["critic/explained_variance"] = (
                explained_variance(batch.values, batch.returns, batch.loss_mask) if self.world == 1
                else _global_explained_variance(batch)
            )
        out["lr"] = self.scheduler.get_last_lr()[0]
        out["updates"] = float(n_updates if train_policy else 0)
        return out

    @torch.no_grad()
    def _prepare(self, batch: Batch | None, stats: MetricSums, recompute_old: bool, offset: int = 0) -> None:
        """No-grad passes at the start of the update (pi_old, pi_ref, critic values), then advantages.

        With the KL in the reward, r_t gains -beta * KL_t (per token, before advantages). ``batch`` is
        None on a rank without rows (it still joins the collectives); ``offset``: its first row's
        index in the global batch."""
        algo = self.algo
        if batch is None:
            if recompute_old:
                self._equal_forwards(0, self._most_forwards(0), grad=False)
            self._advantages(None, None, None, offset)
            return
        n, width = batch.input_ids.shape
        dtype = self._loss_dtype
        old = torch.zeros(n, width, dtype=dtype) if recompute_old else None
        ref = torch.zeros(n, width, dtype=dtype) if self.uses_kl else None
        values = torch.zeros(n, width, dtype=dtype) if self.critic is not None else None
        passes = old is not None or ref is not None or values is not None
        micros = self._micro_batches(batch) if passes else []
        if old is not None:
            self._equal_forwards(len(micros), self._most_forwards(len(micros)), grad=False)
        with self._reference_on_device(ref is not None):
            for rows in micros:
                mb = batch.select(rows)
                cols = mb.input_ids.shape[1]
                if old is not None:
                    logp, _ = self._logprobs(self.model, mb)
                    old[rows, :cols] = logp
                    _add_mismatch(stats, logp, mb)
                if ref is not None:
                    ref[rows, :cols] = self._reference_logprobs(mb)
                if values is not None:
                    values[rows, :cols] = self.critic.model(mb.input_ids, mb.attention_mask) * mb.loss_mask
        batch.old_logprobs, batch.ref_logprobs, batch.values = old, ref, values
        token_rewards = None
        if ref is not None and algo.kl.placement == "reward":
            kl = self.kl_estimator(old, ref) * batch.loss_mask
            token_rewards = -self.kl_ctl.value * kl
            stats.add_tokens("kl_ref", kl, batch.loss_mask)
        batch.advantages = self._advantages(batch, values, token_rewards, offset)
        if values is not None:
            token_level = outcome_token_rewards(batch.rewards, batch.loss_mask, token_rewards)
            _, batch.returns = gae_advantages_and_returns(token_level, values, batch.loss_mask, algo.gamma, algo.lam)
            batch.returns = batch.returns.to(dtype)

    def _advantages(self, batch: Batch | None, values: Tensor | None, token_rewards: Tensor | None,
                    offset: int) -> Tensor | None:
        """The advantages of ``batch``'s rows. With several ranks the estimator runs on all ranks' rows
        (gathered in rank order), so batch-level statistics (REINFORCE++'s normalisation, whitened
        GAE) are those of the global batch; each rank keeps its rows."""
        inputs = None if batch is None else {
            "rewards": batch.rewards, "group_index": batch.group_index, "mask": batch.loss_mask, "values": values,
            "token_rewards": token_rewards, "baseline": batch.baseline, "turn_returns": batch.turn_returns,
        }
        if self.world > 1:
            inputs = _concat_rows(distributed.all_gather_object(_to_cpu(inputs)))
        if batch is None:
            return None
        assert inputs is not None
        adv = ADVANTAGES.call(self.algo.advantage, Context(**inputs), self.algo).to(self._loss_dtype)
        if self.world > 1:
            adv = adv[offset: offset + len(batch), : batch.loss_mask.shape[1]].to(batch.loss_mask.device)
        return adv

    def _most_forwards(self, mine: int) -> int:
        """FSDP2: every rank must run the same number of policy forwards and backwards (each gathers
        the sharded weights with the other ranks): the most micro-batches any rank has."""
        return int(distributed.all_reduce([float(mine)], "max")[0]) if self.fsdp else mine

    def _equal_forwards(self, mine: int, most: int, grad: bool) -> None:
        """A rank with ``mine`` < ``most`` micro-batches runs empty ones (one token, zero loss) to make
        up the difference; the last backward of the step reduce-scatters. A no-op for DDP and one process."""
        for i in range(mine, most):
            self._sync_gradients(i == most - 1)
            ids = torch.zeros((1, 1), dtype=torch.long, device=self._device)
            with torch.set_grad_enabled(grad):
                logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
                if grad:
                    (logits.float().sum() * 0.0).backward()

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def _loss_dtype(self) -> torch.dtype:
        """Log-probs, advantages and losses: float32, or float64 for a float64 model (exact checks)."""
        return compute_dtype(next(self.model.parameters()).dtype)

    def _micro_batches(self, batch: Batch) -> list[list[int]]:
        """Row groups of one forward/backward within ``train.micro_batch_tokens``: padded (rows x
        longest row) or, with packing, packed rows of mostly real tokens."""
        lengths = batch.attention_mask.sum(-1)
        budget = self.cfg.train.micro_batch_tokens
        if self.packing:
            return packed_micro_batches(lengths.tolist(), budget)
        return list(micro_batches(lengths, budget))

    @contextlib.contextmanager
    def _reference_on_device(self, needed: bool) -> Iterator[None]:
        """With ``offload_reference``: the reference model on the policy's device for this block only."""
        if not (needed and self.offload_reference):
            yield
            return
        assert self.ref_model is not None
        self.ref_model.to(self._device)
        try:
            yield
        finally:
            self.ref_model.to("cpu")

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.train.autocast == "bf16":
            return torch.autocast(self._device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _sync_gradients(self, last: bool) -> None:
        """FSDP2 reduce-scatters the accumulated gradients in the last backward of a step only."""
        if self.fsdp:
            self.model.set_requires_gradient_sync(last)

    def _optimizer_step(self, minibatch: Batch | None, stats: MetricSums, train_policy: bool) -> None:
        """One optimizer step on this rank's rows of a global mini-batch (None: no rows here)."""
        mask = minibatch.loss_mask if minibatch is not None else None
        tokens, seqs = distributed.all_reduce([float(mask.sum()), float(mask.shape[0])] if mask is not None
                                              else [0.0, 0.0])  # AggNorm.of(mask) over the ranks' rows
        norm = AggNorm(num_tokens=max(tokens, 1.0), num_seqs=max(seqs, 1.0), max_len=self.max_len_norm)
        value_norm = AggNorm(num_tokens=norm.num_tokens, num_seqs=norm.num_seqs)
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.optimizer.zero_grad(set_to_none=True)
        total_loss = total_pg = 0.0
        micros = self._micro_batches(minibatch) if minibatch is not None else []
        most = self._most_forwards(len(micros)) if train_policy else len(micros)
        for i, micro_rows in enumerate(micros):
            micro = minibatch.select(micro_rows)  # type: ignore[union-attr]
            if self.critic is not None:
                self._critic_backward(micro, value_norm, stats)
            if not train_policy:
                continue
            self._sync_gradients(i == most - 1)
            loss, pg_loss = self._micro_loss(micro, norm, stats)
            total_loss, total_pg = total_loss + float(loss.detach()), total_pg + pg_loss
            if not torch.isfinite(loss):
                raise TrainingDiverged(
                    f"step {self.step}: the loss is {loss.item()} (non-finite). Batch statistics: "
                    f"{_batch_summary(micro)}. Hint: lower train.lr and check the rewards for NaN/inf."
                )
            loss.backward()
        if train_policy:
            self._equal_forwards(len(micros), most, grad=True)
        if self.critic is not None:
            distributed.all_reduce_grads([p for p in self.critic.model.parameters() if p.requires_grad])
            grad = torch.nn.utils.clip_grad_norm_(self.critic.model.parameters(), self.critic.cfg.grad_clip)
            stats.add_scalar("critic/grad_norm", float(grad))
            self.critic.optimizer.step()
        if not train_policy:
            return
        if not self.fsdp:  # DDP: sum the gradients over ranks (FSDP2 has reduce-scattered them)
            distributed.all_reduce_grads([p for p in self.model.parameters() if p.requires_grad])
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor, the norm over all shards
            grad_norm = grad_norm.full_tensor()
        if not torch.isfinite(grad_norm):
            raise TrainingDiverged(
                f"step {self.step}: the gradient norm is {grad_norm.item()} (non-finite). Batch statistics: "
                f"{_batch_summary(minibatch) if minibatch is not None else 'no rows on this rank'}. "
                "Hint: lower train.lr or train.grad_clip."
            )
        stats.add_scalar("grad_norm", float(grad_norm))
        stats.add_share("loss", total_loss)
        stats.add_share("pg_loss", total_pg)
        self.optimizer.step()

    def _critic_backward(self, mb: Batch, norm: AggNorm, stats: MetricSums) -> None:
        """Clipped value loss of this micro-batch (token mean over the mini-batch), backward into the critic."""
        assert self.critic is not None and mb.values is not None and mb.returns is not None
        values = self.critic.model(mb.input_ids, mb.attention_mask)
        loss_t, metrics = clipped_value_loss(values, mb.values, mb.returns, self.algo.critic.value_clip)
        loss = LOSS_AGG.get("token_mean")(loss_t, mb.loss_mask, norm)
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"step {self.step}: the value loss is {loss.item()} (non-finite)")
        loss.backward()
        stats.add_tokens("critic/value_loss", loss_t, mb.loss_mask)
        stats.add_tokens("critic/values", values, mb.loss_mask)
        for name, v in metrics.items():
            stats.add_tokens(f"critic/{name}", v, mb.loss_mask)

    def _reference_logprobs(self, mb: Batch) -> Tensor:
        """log pi_ref: the frozen reference model, or for LoRA the policy with its adapters disabled."""
        if self.lora:
            with self.model.disable_adapter():
                return self._logprobs(self.model, mb)[0]
        assert self.ref_model is not None
        return self._logprobs(self.ref_model, mb)[0]

    def _logprobs(self, model: nn.Module, mb: Batch, entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Per-token log-probs (and entropies) of ``mb`` under ``model`` (float32, also under autocast):
        packed rows with ``train.packing``; else each group's prompt computed once when the
        shared-prefix forward applies; else the model's own forward over the padded rows."""
        with self._autocast():
            if self.packing:
                width = int(mb.attention_mask.sum(-1).max())
                return packed_token_logprobs(model, mb.input_ids, mb.attention_mask, width, self.temperature, entropy,
                                             entropy_grad=True)
            if self.shared_prefix is not None:
                fwd = self.shared_prefix if model is self.model else SharedPrefixForward(model)
                out = shared_prefix_logprobs(
                    fwd, mb.input_ids, mb.attention_mask, mb.prefix_len, mb.group_index, self.temperature, entropy
                )
                if out is not None:
                    return out
            return token_logprobs(model, mb.input_ids, mb.attention_mask, self.temperature, entropy,
                                  entropy_grad=True)

    def _micro_loss(self, mb: Batch, norm: AggNorm, stats: MetricSums) -> tuple[Tensor, float]:
        """This micro-batch's share of the mini-batch loss (global denominators in ``norm``)."""
        terms = loss_terms(self.algo, self.kl_ctl.value)
        logp, entropy = self._logprobs(self.model, mb, entropy=True)
        assert entropy is not None and mb.advantages is not None
        if not self.objective.reads("entropy", terms):
            entropy = entropy.detach()
        mask = mb.loss_mask
        old_logp = mb.old_logprobs
        if old_logp is None:  # single update per batch: pi_old is exactly the current policy
            old_logp = logp.detach()
            _add_mismatch(stats, old_logp, mb)
        ctx = Context(
            mask=mask, rewards=mb.rewards, group_index=mb.group_index, lengths=mask.sum(-1), baseline=mb.baseline,
            turn_returns=mb.turn_returns, logp=logp, old_logp=old_logp, sampling_logp=mb.sampling_logprobs,
            ref_logp=mb.ref_logprobs, entropy=entropy, values=mb.values, returns=mb.returns,
            advantages=mb.advantages,
        )
        loss, pg_loss, metrics = self.objective.loss(ctx, norm, terms)
        stats.add_tokens("entropy", entropy, mask)
        for name, values in metrics.items():
            stats.add_tokens(name, values, mask)
        return loss, float(pg_loss.detach())


def _add_mismatch(stats: MetricSums, logp: Tensor, mb: Batch) -> None:
    """|log pi_learner - log pi_sampler| on generated tokens: the rollout/training mismatch."""
    diff = (logp - mb.sampling_logprobs).abs()
    stats.add_tokens("logprob_mismatch", diff, mb.loss_mask)
    masked = diff * mb.loss_mask
    stats.sums["logprob_mismatch_max"] = max(stats.sums.get("logprob_mismatch_max", 0.0), float(masked.max()))
    stats.counts["logprob_mismatch_max"] = 1.0


def _to_cpu(inputs: dict[str, Tensor | None] | None) -> dict[str, Tensor | None] | None:
    return None if inputs is None else {k: v.cpu() if v is not None else None for k, v in inputs.items()}


def _concat_rows(parts: list[dict[str, Tensor | None] | None]) -> dict[str, Tensor | None] | None:
    """Ranks' advantage inputs as one batch: rows in rank order, [N, L] tensors right-padded with
    zeros to the widest, group ids renumbered per rank (0, 1, ... in order of id) so that groups of
    different ranks never merge."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    width = max(p["mask"].shape[1] for p in parts)  # type: ignore[union-attr]
    out: dict[str, Tensor | None] = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if values[0] is None:
            out[key] = None
        elif key == "group_index":
            ids, seen = [], 0
            for v in values:
                _, inverse = torch.unique(v, return_inverse=True)
                ids.append(inverse + seen)
                seen += int(inverse.max()) + 1 if inverse.numel() else 0
            out[key] = torch.cat(ids)
        elif values[0].dim() == 2:
            out[key] = torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values])
        else:
            out[key] = torch.cat(values)
    return out


def _global_explained_variance(batch: Batch | None) -> float:
    """``explained_variance`` over every rank's masked tokens (from all-reduced moments)."""
    r = v = torch.zeros(0, dtype=torch.float64)
    if batch is not None and batch.values is not None and batch.returns is not None:
        live = batch.loss_mask != 0
        r, v = batch.returns.detach().double()[live], batch.values.detach().double()[live]
    d = r - v
    n, sr, srr, sd, sdd = distributed.all_reduce([float(r.numel()), float(r.sum()), float((r * r).sum()),
                                                  float(d.sum()), float((d * d).sum())])
    if n == 0:
        return 0.0
    var_r, var_d = srr / n - (sr / n) ** 2, sdd / n - (sd / n) ** 2
    if var_r <= 1e-12 * max(srr / n, 1e-30):
        return 0.0
    return 1.0 - var_d / var_r


def _batch_summary(mb: Batch) -> str:
    adv = mb.advantages[mb.loss_mask > 0]
    return (
        f"{len(mb)} sequences, {int(mb.loss_mask.sum())} trained tokens, "
        f"advantage min/max {adv.min().item() if adv.numel() else 0:.3g}/{adv.max().item() if adv.numel() else 0:.3g}, "
        f"sampling log-prob min {mb.sampling_logprobs.min().item():.3g}"
    )
