"""The learner: policy-gradient updates on a rollout batch.

For each rollout batch: ``epochs`` passes, each split into ``minibatches`` optimizer steps; each
mini-batch is cut into micro-batches by a token budget and gradients accumulate. Loss denominators
(``AggNorm``) are global over the mini-batch, so the gradient does not depend on the split.

At the start of an update (learn/prepare.py), no-grad passes give what the update holds fixed: the old
log-probs of the PPO ratio (skipped with a single update per batch and no KL in the reward: they then
come from the same forward, exactly on-policy), the reference log-probs, the critic's values; then
the advantages (``ADVANTAGES``, on the global batch). Each micro-batch's loss is the objective of
algo/objective.py over a ``Context``. What the learner computes is what the run's parts declare
(``required_inputs``). The training forward (plain, shared-prefix, packed) is a part
(learn/forwards.py), every collective is in ``DataParallel`` (learn/parallel.py, docs/distributed.md),
the critic trains in learn/critic.py, LoRA adapters come from learn/lora.py (the reference is the
base with the adapters disabled), and the memory switches are described in docs/memory.md.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from reinforge.algo import KL_ESTIMATORS, AggNorm
from reinforge.algo.kl import KLController
from reinforge.algo.mixing import MIXING
from reinforge.algo.objective import (
    Objective,
    Rows,
    advantage_controller,
    loss_terms,
    required_inputs,
    term_controllers,
)
from reinforge.config import AlgoConfig, LoraConfig, RolloutConfig, RunConfig, TrainConfig
from reinforge.errors import ConfigError, TrainingDiverged
from reinforge.learn import distributed
from reinforge.learn.batch_context import batch_context
from reinforge.learn.critic import Critic, value_mask
from reinforge.learn.faults import nonfinite_inputs
from reinforge.learn.forwards import FORWARDS, select_forward
from reinforge.learn.lora import is_lora_model, wrap_lora
from reinforge.learn.metric_sums import MetricSums, add_mismatch, batch_summary, sampled_mask
from reinforge.learn.optim import build_optimizer
from reinforge.learn.packing import group_micro_batches, micro_batches, packed_micro_batches
from reinforge.learn.parallel import DataParallel
from reinforge.learn.perception import masked_fields
from reinforge.learn.prepare import PreparesBatches
from reinforge.learn.shared_prefix import SharedPrefixForward
from reinforge.models.adapters import ADAPTER_NAME
from reinforge.models.precision import autocast_bf16, compute_dtype
from reinforge.types import Batch, declares_stage


class Learner(PreparesBatches):
    """Owns the trainable policy, the optional frozen reference policy, the optional critic and the optimizers.

    With ``lora.enabled`` a plain ``model`` is wrapped with LoRA adapters here (in place;
    a model already wrapped by peft is taken as is); the reference policy is then the base with
    the adapters disabled, and ``ref_model`` must be None.

    In a process group of several ranks the policy is prepared by ``distributed.wrap_model``
    (``train.parallel``: ddp broadcasts rank 0's weights; fsdp shards them in place, and
    ``self.model`` is then the FSDP2 module). The reference model and the critic stay whole on
    every rank (the critic's gradients are summed over ranks).
    """

    checkpoint_adapter = ADAPTER_NAME  # the LoRA adapter a checkpoint's peft files hold

    def __init__(
        self, model: nn.Module, train: TrainConfig, algo: AlgoConfig, rollout: RolloutConfig, *,
        lora: LoraConfig | None = None, base_path: str | None = None, seed: int = 0,
        ref_model: nn.Module | None = None, critic: Critic | None = None, teacher: nn.Module | None = None,
    ) -> None:
        """The learner of ``model`` from its own sections: ``train`` (optimizer, micro-batches, forward,
        parallelism), ``algo`` (the objective) and from ``rollout`` the sampling temperature and
        ``max_new_tokens``; ``lora`` (with the base's ``base_path``) wraps a plain model in adapters;
        ``teacher``: the frozen model whose full distributions a part reads (``algo.teacher``, GKD's)."""
        self._setup(model, train, algo, rollout, lora, base_path, seed, ref_model, critic)
        self.teacher = self._frozen_teacher(teacher)

    @classmethod
    def for_run(cls, model: nn.Module, cfg: RunConfig, ref_model: nn.Module | None = None,
                critic: Critic | None = None, teacher: nn.Module | None = None) -> Learner:
        """A run's learner: its ``train``, ``algo``, ``rollout`` and ``model.lora`` sections."""
        return cls(model, cfg.train, cfg.algo, cfg.rollout, lora=cfg.model.lora, base_path=cfg.model.path,
                   seed=cfg.seed, ref_model=ref_model, critic=critic, teacher=teacher)

    def _setup(self, model: nn.Module, train: TrainConfig, algo: AlgoConfig, rollout: RolloutConfig,
               lora: LoraConfig | None, base_path: str | None, seed: int, ref_model: nn.Module | None,
               critic: Critic | None) -> None:
        if lora is not None and lora.enabled and not is_lora_model(model):
            model = wrap_lora(model, lora, base_path, seed=seed)
        self.lora = is_lora_model(model)
        if self.lora and ref_model is not None:
            raise ValueError("a LoRA policy's reference is its base model with the adapters disabled: pass no ref_model")
        if distributed.world() > 1 and train.parallel == "fsdp" and self.lora:
            raise ConfigError("train.parallel=fsdp does not support model.lora.enabled=true (the adapters are small "
                              "and the base is frozen: use train.parallel=ddp)")
        model = distributed.wrap_model(model, train.parallel)  # before the optimizer sees the parameters
        if critic is not None:
            distributed.wrap_model(critic.model, "ddp")
        self.model = model.train()
        self.parallel = DataParallel(model, train.parallel)
        self.ref_model = ref_model.eval().requires_grad_(False) if ref_model is not None else None
        t = self.train_cfg = train
        self.offload_reference = t.offload_reference and self.ref_model is not None
        if self.offload_reference:
            self.ref_model.to("cpu")
        hf_model = model.get_base_model() if self.lora else model
        if t.gradient_checkpointing:
            if not getattr(hf_model, "supports_gradient_checkpointing", False):
                raise ConfigError(f"train.gradient_checkpointing: {type(hf_model).__name__} does not support it")
            hf_model.activation_checkpointing_enable({"use_reentrant": False})
        self.critic = critic
        self.algo = algo
        self.objective = Objective(algo.policy_loss, algo.loss_agg, algo.mismatch.mode, algo.mismatch.cap, algo,
                                   algo.policy_loss.settings)
        self.kl_estimator = KL_ESTIMATORS.get(algo.kl.estimator)
        self.kl_ctl = KLController(algo.kl.coef, algo.kl.target, algo.kl.horizon)
        self.term_controllers = term_controllers(algo)  # stateful loss terms (EPO, AEnt): updated, checkpointed
        self.advantage_controller = advantage_controller(algo)  # a stateful estimator's (SPO's tracker): the same
        self.needs = required_inputs(algo)
        self.uses_demonstrations = "demonstrations" in self.needs
        self.whole_groups = "whole_groups" in self.needs
        if self.whole_groups and self.parallel.world > 1:
            raise ConfigError(f"algo.policy_loss={algo.policy_loss} computes its loss per group, which needs every "
                              "group on one rank; train.world_size > 1 does not keep them together yet")
        self.group_minibatches = self.whole_groups or t.minibatch_by == "groups"
        if t.minibatch_by == "groups" and self.parallel.world > 1:
            raise ConfigError("train.minibatch_by=groups: one process (train.world_size=1); the ranks' rows are cut "
                              "into mini-batches by rows")
        if "values" in self.needs and critic is None:
            raise ConfigError(f"algo.advantage={algo.advantage} needs a critic (a value model); it is built by "
                              "build_components")
        self.max_len_norm = getattr(algo.loss_agg.settings, "max_len_norm", 0) or float(rollout.max_new_tokens)
        self.temperature = rollout.temperature
        self.bf16_forwards = autocast_bf16(t.autocast, self._device)  # auto: where the device computes bf16 natively
        self.optimizer, self.scheduler = build_optimizer([p for p in model.parameters() if p.requires_grad], t)
        self.shuffle = torch.Generator().manual_seed(seed + 17)
        self.step = 0
        self._mix: tuple[float, float] = (1.0, 1.0)  # (w_rl, w_demo) of this update, algo.mixing
        self._prepared: tuple[Batch | None, MetricSums, int] | None = None  # prepare() -> update()
        self._compare_sampler = False  # the next mini-batch compares its log-probs with the sampler's (prepare)
        self._first_minibatch: list[Tensor] | None = None  # epoch 0's plan when prepare deferred its pi_old
        self.forward = FORWARDS.call(select_forward(t, hf_model, self.fsdp),
                                     SimpleNamespace(policy=model, hf_model=hf_model), t)

    @property
    def world(self) -> int:
        return self.parallel.world

    @property
    def fsdp(self) -> bool:
        return self.parallel.fsdp

    @property
    def shared_prefix(self) -> SharedPrefixForward | None:
        """The shared-prefix forward over the policy when that is the training forward, else None."""
        return getattr(self.forward, "shared", None)

    @property
    def uses_kl(self) -> bool:
        """Whether the update computes reference log-probs (a part declares ``ref_logp``)."""
        return (self.ref_model is not None or self.lora) and "ref_logp" in self.needs

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
            "term_controllers": {str(i): c.state_dict() for i, c in self.term_controllers.items()},
        }
        if self.advantage_controller is not None:
            state["advantage_controller"] = self.advantage_controller.state_dict()
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
        for i, ctl in self.term_controllers.items():
            ctl.load_state_dict(state["term_controllers"][str(i)])
        if self.advantage_controller is not None and "advantage_controller" in state:
            self.advantage_controller.load_state_dict(state["advantage_controller"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def restore_policy(self, ckpt, dtype: str = "float32", device: str = "cpu") -> None:  # type: ignore[no-untyped-def]
        """Set the policy's weights to a checkpoint's (``checkpoint.restore_policy``; under FSDP2 every
        rank reads the checkpoint and keeps its shard)."""
        if not self.fsdp:
            from reinforge.learn.checkpoint import restore_policy

            restore_policy(self.model, ckpt, dtype, device)
            return
        from reinforge.models.loading import load_model

        distributed.load_full_state_dict(self.model, load_model(str(ckpt), dtype, device).state_dict())

    def checkpoint_model(self) -> nn.Module | distributed.FullStateModel:
        """What ``save_checkpoint`` saves: the policy; under FSDP2 (a collective: every rank calls it)
        its whole weights, which ``save_pretrained`` writes like a plain model's."""
        if self.fsdp:
            return distributed.FullStateModel(self.model, distributed.full_state_dict(self.model))
        return self.model

    # ------------------------------------------------------------------ update
    @declares_stage("update", reads=("the fields its loss and terms name",), writes=("policy", "optimizer", "critic"))
    def update(self, batch: Batch | None) -> dict[str, float]:
        """All optimizer steps for one rollout batch; returns metrics averaged over them. The batch is
        prepared and its advantages estimated here unless the loop has done so.

        With several ranks every rank calls it at once with its own rows (None when it has none):
        the global batch is all ranks' rows in rank order, and every rank returns its metrics."""
        if batch is None and self.world == 1:
            raise ValueError("Learner.update: no batch")
        if self._prepared is None or self._prepared[0] is not batch:
            self.prepare(batch)
            self.estimate_advantages(batch)
        assert self._prepared is not None
        _, stats, offset = self._prepared
        self._prepared = None
        self.step += 1
        self._mix = MIXING.get(self.algo.mixing)(self.step, self.algo.mixing.settings)
        t = self.train_cfg
        n = len(batch) if batch is not None else 0
        offset, total = self.parallel.layout(n)
        n_updates = t.epochs * min(t.minibatches, total)
        train_policy = self.critic is None or self.step > self.algo.critic.warmup_steps
        first, self._first_minibatch = self._first_minibatch, None  # drawn by prepare when it deferred its pi_old
        for epoch in range(t.epochs):
            plan = first if epoch == 0 and first is not None else self._minibatch_rows(batch, total, n_updates)
            for k, mb_index in enumerate(plan):
                mine = mb_index[(mb_index >= offset) & (mb_index < offset + n)] - offset  # all of it, one process
                minibatch = batch.select(mine) if len(mine) else None
                if k == 0 and first is not None and minibatch is not None:
                    minibatch.old_logprobs = None  # pi_old from this forward: the policy is not yet stepped
                self._optimizer_step(minibatch, stats, train_policy)
                self._compare_sampler = False
        if train_policy:
            self.scheduler.step()
        stats.all_reduce()
        out = stats.means()
        if self.uses_kl:
            self.kl_ctl.update(out.get("kl_ref", 0.0), n_steps=total)
            out["kl_coef"] = self.kl_ctl.value
        controllers = [*self.term_controllers.values()]
        controllers += [self.advantage_controller] if self.advantage_controller is not None else []
        for ctl in controllers:
            out.update(ctl.update(out))
        if self.critic is not None:
            out["critic/explained_variance"] = self.parallel.explained_variance(batch)
        if self.uses_demonstrations:
            out["mixing/w_rl"], out["mixing/w_demo"] = self._mix
        out["lr"] = self.scheduler.get_last_lr()[0]
        out["updates"] = float(n_updates if train_policy else 0)
        return out

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
        budget = self.train_cfg.micro_batch_tokens
        if self.whole_groups:  # a loss computed per group sees all of it (the forward may still pack)
            return group_micro_batches(lengths, batch.group_index, budget)
        if self.train_cfg.packing:
            return packed_micro_batches(lengths.tolist(), budget)
        return list(micro_batches(lengths, budget))

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.bf16_forwards:
            return torch.autocast(self._device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _optimizer_step(self, minibatch: Batch | None, stats: MetricSums, train_policy: bool) -> None:
        """One optimizer step on this rank's rows of a global mini-batch (None: no rows here)."""
        norm, value_norm, demo_norm = self._norms(minibatch)
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.optimizer.zero_grad(set_to_none=True)
        total_loss = total_pg = 0.0
        micros = self._micro_batches(minibatch) if minibatch is not None else []
        most = self.parallel.most_forwards(len(micros)) if train_policy else len(micros)
        for i, micro_rows in enumerate(micros):
            micro = minibatch.select(micro_rows).to(self._device)  # type: ignore[union-attr]
            if self.critic is not None:
                self.critic.backward(micro, value_norm, stats, self.algo.critic.value_clip, self.step)
            if not train_policy:
                continue
            self.parallel.sync_gradients(i == most - 1)
            loss, pg_loss = self._micro_loss(micro, norm, stats, demo_norm)
            total_loss, total_pg = total_loss + float(loss.detach()), total_pg + pg_loss
            if not torch.isfinite(loss):
                raise TrainingDiverged(
                    f"step {self.step}: the loss is {loss.item()} (non-finite). Batch statistics: "
                    f"{batch_summary(micro)}; {nonfinite_inputs(micro)} Hint: lower train.lr and check the "
                    "rewards for NaN/inf."
                )
            loss.backward()
        if train_policy:
            self.parallel.equal_forwards(len(micros), most, grad=True)
        if self.critic is not None:
            distributed.all_reduce_grads([p for p in self.critic.model.parameters() if p.requires_grad])
            grad = torch.nn.utils.clip_grad_norm_(self.critic.model.parameters(), self.critic.cfg.grad_clip)
            stats.add_scalar("critic/grad_norm", float(grad))
            self.critic.optimizer.step()
        if not train_policy:
            return
        self.parallel.reduce_grads([p for p in self.model.parameters() if p.requires_grad])
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor, the norm over all shards
            grad_norm = grad_norm.full_tensor()
        if not torch.isfinite(grad_norm):
            raise TrainingDiverged(
                f"step {self.step}: the gradient norm is {grad_norm.item()} (non-finite). Batch statistics: "
                f"{batch_summary(minibatch) if minibatch is not None else 'no rows on this rank'}. "
                "Hint: lower train.lr or train.grad_clip."
            )
        stats.add_scalar("grad_norm", float(grad_norm))
        stats.add_share("loss", total_loss)
        stats.add_share("pg_loss", total_pg)
        self.optimizer.step()

    def _norms(self, minibatch: Batch | None) -> tuple[AggNorm, AggNorm, AggNorm | None]:
        """Global denominators of a mini-batch (every rank joins the collectives): the rows the policy
        loss trains on, the sampled rows (the critic's) and, when the run trains on demonstrations,
        the demonstration rows."""
        empty = (None, None)
        policy = sampled = demos = empty
        if minibatch is not None:
            mask = minibatch.loss_mask
            rows = self.objective.rows(len(minibatch), minibatch.demo, minibatch.group_index)
            policy, sampled, demos = ((Rows.mask(r, mask), r) for r in (rows.policy, rows.sampled, rows.demos))
            sampled = (Rows.mask(rows.sampled, value_mask(minibatch)), rows.sampled)  # the critic's targets
        norm = self.parallel.norm(policy[0], self.max_len_norm, rows=policy[1])
        value = self.parallel.norm(sampled[0], 1.0, rows=sampled[1])
        demo = self.parallel.norm(demos[0], self.max_len_norm, rows=demos[1]) if self.uses_demonstrations else None
        return norm, AggNorm(num_tokens=value.num_tokens, num_seqs=value.num_seqs), demo

    def _logprobs(self, model: nn.Module, mb: Batch, entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Per-token log-probs (and entropies) of ``mb`` under ``model`` by the training forward
        (learn/forwards.py: plain, shared-prefix or packed), under autocast when configured."""
        with self._autocast():
            return self.forward.logprobs(model, mb, self.temperature, entropy)

    def _micro_loss(self, mb: Batch, norm: AggNorm, stats: MetricSums, demo_norm: AggNorm | None = None
                    ) -> tuple[Tensor, float]:
        """This micro-batch's share of the mini-batch loss (global denominators in ``norm``)."""
        terms = loss_terms(self.algo, self.kl_ctl.value, self.term_controllers)
        logp_vocab = None  # full next-token rows, only for a part that reads them (GKD's)
        if self.objective.reads("logp_vocab", terms):
            logp, entropy, logp_vocab = self._vocab_logprobs(self.model, mb, entropy=True)
        else:
            logp, entropy = self._logprobs(self.model, mb, entropy=True)
        assert entropy is not None and mb.advantages is not None
        if not self.objective.reads("entropy", terms):
            entropy = entropy.detach()
        old_logp = mb.old_logprobs
        if old_logp is None or self._compare_sampler:  # the policy not yet stepped: its log-probs against the sampler's
            add_mismatch(stats, logp.detach(), mb)
        if old_logp is None:  # single update per batch: pi_old is exactly the current policy
            old_logp = logp.detach()
        masked = masked_fields(terms, mb, self.model, lambda b: self._logprobs(self.model, b, entropy=True))  # PAPO's
        ctx = batch_context(mb, logp=logp, old_logp=old_logp, entropy=entropy, logp_vocab=logp_vocab, **masked)
        loss, pg_loss, metrics, masks = self.objective.loss(ctx, norm, terms, demo_norm, self._mix)
        stats.add_tokens("entropy", entropy, sampled_mask(mb))
        for name, values in metrics.items():
            stats.add_tokens(name, values, masks[name])
        return loss, float(pg_loss.detach())
