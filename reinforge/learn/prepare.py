"""The start of an update: what it holds fixed, and the advantages (``Learner.prepare``,
``Learner.estimate_advantages``; the loop calls them, ``Learner.update`` does when it was not).

No-grad passes give the old log-probs of the PPO ratio (skipped with a single update per batch and
no KL in the reward: they then come from the same forward, exactly on-policy; with one epoch of several
mini-batches, the first mini-batch's come from its own forward too, the policy not yet stepped, and the
pass covers the other mini-batches' rows only), the reference
log-probs, the critic's values and, for a part that declares ``teacher_logp_vocab`` (GKD's), a
teacher's full next-token log-distributions on the loss mask's positions ([N, L, V],
``batch.teacher_logprobs``); with the KL in the reward, r_t gains -beta * KL_t
(``batch.token_rewards``, added to the token rewards the batch came with, e.g. process rewards). The
run's advantage estimator (``ADVANTAGES``) then runs on the global batch (all ranks' rows), and a
critic's returns are GAE's. An estimator that declares it needs ``entropy``, ``old_logp`` or
``ref_logp`` gets them from these passes (pi_old's pass then runs even with a single update, and
keeps the per-token entropy of the same forward), and one that declares ``sampling_logp`` (V-trace's
behaviour policy) the rollout engine's log-probs from the batch. A stateful estimator's controller
(``Learner.advantage_controller``, e.g. SPO's tracker) is its ``cfg``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from reinforge.algo import ADVANTAGES
from reinforge.algo.advantage_estimators import egae_token_rewards
from reinforge.algo.context import PART_INPUTS, Context
from reinforge.algo.returns import gae_advantages_and_returns
from reinforge.algo.troll import OLD_TOPK_SLOTS, PAD_LOGP, old_support
from reinforge.errors import ConfigError
from reinforge.learn.batch_context import context_tensors
from reinforge.learn.metric_sums import MetricSums, add_mismatch
from reinforge.learn.packing import group_order
from reinforge.types import Batch, declares_stage

# What the two stages write into the batch record (docs/architecture.md's step table; a test records them).
PREPARE_WRITES = ("old_logprobs", "ref_logprobs", "values", "teacher_logprobs", "token_rewards", "old_vocab_mean",
                  "old_topk_index", "old_topk_logp")
ADVANTAGE_WRITES = ("advantages", "returns")
OLD_VOCAB_MEAN = "old_vocab_mean"  # the need (registry.NEEDS) served by pi_old's pass
OLD_TOPK = "old_topk"  # likewise: pi_old's sparse support and its log-probs (algo/troll.py)


class PreparesBatches:
    """The ``Learner``'s no-grad passes and advantage estimation (a mixin over its model, reference,
    critic, KL controller and data-parallel strategy)."""

    @declares_stage("prepare", reads=("input_ids", "attention_mask", "loss_mask", "token_rewards", "sampling_logprobs"),
                    writes=PREPARE_WRITES)
    def prepare(self, batch: Batch | None) -> None:
        """The no-grad passes at the start of an update (pi_old when several optimizer steps or the KL
        in the reward need it, pi_ref, critic values) and the per-token rewards; with several ranks
        every rank calls it at once (None: no rows here, it still joins the collectives)."""
        t = self.train_cfg
        n = len(batch) if batch is not None else 0
        offset, total = self.parallel.layout(n)
        estimator_needs = ADVANTAGES.needs(self.algo.advantage)
        n_updates = t.epochs * min(t.minibatches, total)
        old_before_update = self.algo.kl.placement == "reward" or "old_logp" in estimator_needs
        needs_old = n_updates > 1 or old_before_update
        pass_only = "entropy" in estimator_needs or bool({OLD_VOCAB_MEAN, OLD_TOPK} & set(self.needs))
        from_rollout = needs_old and t.old_logprobs == "rollout"
        run_pass = pass_only or (needs_old and not from_rollout)
        # pi_old from the sampler and no pass: the first mini-batch's forward (the policy not yet stepped)
        # measures the rollout/training mismatch instead
        self._compare_sampler = from_rollout and not run_pass
        # pi_old only for the ratio, one epoch: the first mini-batch takes it from its own forward, the pass
        # runs over the other mini-batches' rows only
        defer_first = run_pass and not pass_only and not old_before_update and t.epochs == 1
        self._first_minibatch = self._minibatch_rows(batch, total, n_updates) if defer_first else None
        old_rows = self._rows_after_first(n, offset) if defer_first else None
        self._prepared = (batch, MetricSums(), offset)
        self._passes(batch, self._prepared[1], run_pass, offset, old_rows)
        if batch is not None and from_rollout:
            self._old_from_rollout(batch)
        if batch is not None and self.uses_kl and self.algo.kl.placement == "reward":
            self._kl_in_reward(batch, self._prepared[1])

    @declares_stage("advantages", reads=("the fields its estimator names",), writes=ADVANTAGE_WRITES)
    def estimate_advantages(self, batch: Batch | None) -> None:
        """``batch.advantages`` (and, with a critic, ``batch.returns``) from the prepared batch."""
        if self._prepared is None or self._prepared[0] is not batch:
            raise RuntimeError("Learner.estimate_advantages: call prepare(batch) first")
        self._fill_advantages(batch, self._prepared[2])

    @torch.no_grad()
    def _passes(self, batch: Batch | None, stats: MetricSums, recompute_old: bool, offset: int = 0,
                old_rows: Tensor | None = None) -> None:
        """No-grad passes (pi_old, pi_ref, critic values). ``batch`` is None on a rank without rows (it
        still joins the collectives); ``offset``: its first row's index in the global batch; ``old_rows``:
        the rows pi_old's pass covers (None: all; the others are left 0 for their own forward)."""
        algo = self.algo
        self._old_entropy = None  # pi_old's per-token entropy, for an estimator that declares it needs ``entropy``
        if batch is None:
            if recompute_old:
                self.parallel.equal_forwards(0, self.parallel.most_forwards(0), grad=False)
            return
        n, width = batch.input_ids.shape
        dtype = self._loss_dtype
        old = torch.zeros(n, width, dtype=dtype) if recompute_old else None
        ref = torch.zeros(n, width, dtype=dtype) if self.uses_kl else None
        values = torch.zeros(n, width, dtype=dtype) if self.critic is not None else None
        teacher: Tensor | None = None  # [n, width, V], allocated at the first micro-batch
        ent = torch.zeros(n, width, dtype=dtype) if "entropy" in ADVANTAGES.needs(algo.advantage) else None
        vocab_mean = torch.zeros(n, width, dtype=dtype) if OLD_VOCAB_MEAN in self.needs else None
        topk = ((torch.zeros(n, width, OLD_TOPK_SLOTS, dtype=torch.long),
                 torch.full((n, width, OLD_TOPK_SLOTS), PAD_LOGP, dtype=dtype)) if OLD_TOPK in self.needs else None)
        others = ref is not None or values is not None or self.teacher is not None  # passes over every row
        micros = self._micro_batches(batch) if others or (old is not None and old_rows is None) else []
        other_micros = micros if others else []
        old_micros = micros if old_rows is None else self._micro_batches_of(batch, old_rows)
        if old is not None:
            self.parallel.equal_forwards(len(old_micros), self.parallel.most_forwards(len(old_micros)), grad=False)
            for rows in old_micros:
                mb = batch.select(rows).to(self._device)  # the batch stays where it was built, its passes run here
                cols = mb.input_ids.shape[1]
                logp, h = self._old_pass(mb, ent is not None, (vocab_mean, topk), rows, cols)
                old[rows, :cols] = logp.cpu()
                if ent is not None:
                    ent[rows, :cols] = (h * mb.loss_mask).cpu()
                add_mismatch(stats, logp, mb)
        with self._reference_on_device(ref is not None):
            for rows in other_micros:
                mb = batch.select(rows).to(self._device)
                cols = mb.input_ids.shape[1]
                if ref is not None:
                    ref[rows, :cols] = self._reference_logprobs(mb).cpu()
                if values is not None:
                    values[rows, :cols] = (self.critic.model(mb.input_ids, mb.attention_mask) * mb.loss_mask).cpu()
                if self.teacher is not None:
                    dist = self._vocab_logprobs(self.teacher, mb)[2].cpu()
                    teacher = dist.new_zeros(n, width, dist.shape[-1]) if teacher is None else teacher
                    teacher[rows, :cols] = dist
        batch.old_logprobs, batch.ref_logprobs, batch.values = old, ref, values
        batch.teacher_logprobs, batch.old_vocab_mean = teacher, vocab_mean
        batch.old_topk_index, batch.old_topk_logp = topk if topk is not None else (None, None)
        self._old_entropy = ent

    def _minibatch_rows(self, batch: Batch | None, total: int, n_updates: int) -> list[Tensor]:
        """One epoch's mini-batches (global row indices): a random order when there are several
        updates; with a part that needs whole groups, or ``train.minibatch_by=groups``, groups are shuffled
        and never split."""
        t = self.train_cfg
        if not self.group_minibatches:
            order = torch.randperm(total, generator=self.shuffle) if n_updates > 1 else torch.arange(total)
            return list(torch.tensor_split(order, min(t.minibatches, total)))
        assert batch is not None  # one process (checked at construction)
        groups = batch.group_index
        order = group_order(groups, self.shuffle if n_updates > 1 else None)
        ordered = groups[order]
        starts = torch.nonzero(torch.cat([torch.tensor([True]), ordered[1:] != ordered[:-1]])).flatten()
        cuts = [int(starts[int(k[0])]) for k in torch.tensor_split(torch.arange(len(starts)), t.minibatches) if len(k)]
        return list(torch.tensor_split(order, cuts[1:]))

    def _rows_after_first(self, n: int, offset: int) -> Tensor:
        """This rank's rows (local indices) outside the first mini-batch of ``self._first_minibatch``."""
        assert self._first_minibatch is not None
        first = self._first_minibatch[0]
        keep = torch.ones(n, dtype=torch.bool)
        keep[first[(first >= offset) & (first < offset + n)] - offset] = False
        return torch.nonzero(keep).flatten()

    def _micro_batches_of(self, batch: Batch, rows: Tensor) -> list[Tensor]:
        """``_micro_batches`` of ``rows`` only (indices into ``batch``)."""
        return [rows[torch.as_tensor(m, dtype=torch.long)] for m in self._micro_batches(batch.select(rows))] \
            if len(rows) else []

    def _kl_in_reward(self, batch: Batch, stats: MetricSums) -> None:
        """r_t gains -beta * KL_t(pi_old || pi_ref) (``batch.token_rewards``, before advantages)."""
        kl = self.kl_estimator(batch.old_logprobs, batch.ref_logprobs) * batch.loss_mask
        given = batch.token_rewards  # e.g. a step verifier's process rewards: the KL penalty adds to them
        batch.token_rewards = -self.kl_ctl.value * kl + (given.to(kl.dtype) if given is not None else 0.0)
        stats.add_tokens("kl_ref", kl, batch.loss_mask)

    def _old_from_rollout(self, batch: Batch) -> None:
        """``train.old_logprobs=rollout``: pi_old = the sampler's log-probs on the loss mask (PPO's
        behaviour policy as sampled; the engine's log-probs are under softmax(logits / T) before top-k/top-p,
        as the learner's); the KL in the reward is then taken against them too."""
        if batch.demo is not None and bool(batch.demo.any()):
            raise ConfigError("train.old_logprobs=rollout: the batch holds demonstration rows, which no sampler "
                              "gave log-probs for; use train.old_logprobs=recompute")
        batch.old_logprobs = (batch.sampling_logprobs * batch.loss_mask).to(self._loss_dtype)

    def _old_pass(self, mb: Batch, entropy: bool, records: tuple[Tensor | None, tuple[Tensor, Tensor] | None],
                  rows: Tensor, cols: int) -> tuple[Tensor, Tensor | None]:
        """pi_old's log-probs (and entropies) of ``mb``. ``records`` = (vocab_mean, topk): with ``vocab_mean``,
        also its mean log-probability over the vocabulary at each position into ``vocab_mean[rows, :cols]``;
        with ``topk`` (index, log-probs), its sparse support at each position (``algo.troll.old_support``)
        into ``topk[k][rows, :cols]`` (the full rows of this micro-batch only)."""
        vocab_mean, topk = records
        if vocab_mean is None and topk is None:
            return self._logprobs(self.model, mb, entropy=entropy)
        logp, h, dist = self._vocab_logprobs(self.model, mb, entropy=entropy)
        if vocab_mean is not None:
            vocab_mean[rows, :cols] = dist.mean(-1).cpu()
        if topk is not None:
            index, values = old_support(dist, mb.input_ids[:, : dist.shape[1]])
            topk[0][rows, :cols, : index.shape[-1]] = index.cpu()
            topk[1][rows, :cols, : index.shape[-1]] = values.to(topk[1].dtype).cpu()
        return logp, h

    def _fill_advantages(self, batch: Batch | None, offset: int) -> None:
        if batch is None:
            self._advantages(None, None, None, offset)
            return
        algo, values, token_rewards = self.algo, batch.values, batch.token_rewards
        batch.advantages = self._advantages(batch, values, token_rewards, offset)
        if values is not None:
            # a row whose generation continues (T-PPO) bootstraps at its end (EGAE); the critic gives it no target
            token_level = egae_token_rewards(batch.rewards, batch.loss_mask, values, algo.discount.gamma,
                                             batch.continues, token_rewards)
            _, batch.returns = gae_advantages_and_returns(token_level, values, batch.loss_mask, *algo.discount)
            batch.returns = batch.returns.to(self._loss_dtype)

    def _advantages(self, batch: Batch | None, values: Tensor | None, token_rewards: Tensor | None,
                    offset: int) -> Tensor | None:
        """The advantages of ``batch``'s rows. With several ranks the estimator runs on all ranks' rows
        (gathered in rank order), so batch-level statistics (REINFORCE++'s normalisation, whitened
        GAE) are those of the global batch; each rank keeps its rows."""
        reads = set(ADVANTAGES.entry(self.algo.advantage).params) & (PART_INPUTS - {"cfg"})
        inputs = None if batch is None else context_tensors(
            batch, reads | {"mask", "group_index", "demo"}, values=values, token_rewards=token_rewards,
            entropy=self._old_entropy)
        inputs = self.parallel.gather_rows(inputs)
        if batch is None:
            return None
        assert inputs is not None
        return self.parallel.my_rows(self._estimate(inputs), offset, batch)

    def _estimate(self, inputs: dict[str, Tensor | None]) -> Tensor:
        """The run's estimator over the rows it applies to: every sampled row and every demonstration
        that is a member of a sampled group; a demonstration in a group of its own (group id < 0: SFT,
        mixed-in supervision) is left out, so batch statistics are the rollouts', and gets 0."""
        demo = inputs.pop("demo")
        ctl = self.advantage_controller  # a stateful estimator's state, handed to it as its cfg
        settings = ctl if ctl is not None else self.algo.advantage.settings
        if demo is None:
            return ADVANTAGES.call(self.algo.advantage, Context.of(inputs), settings).to(self._loss_dtype)
        mask = inputs["mask"]
        assert mask is not None
        keep = ~(demo & (inputs["group_index"] < 0))
        adv = torch.zeros(mask.shape, dtype=self._loss_dtype)
        if keep.any():
            sub = {k: v[keep] if v is not None else None for k, v in inputs.items()}
            adv[keep] = ADVANTAGES.call(self.algo.advantage, Context.of(sub), settings).to(self._loss_dtype)
        return adv

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

    def _reference_logprobs(self, mb: Batch) -> Tensor:
        """log pi_ref: the frozen reference model, or for LoRA the policy with its adapters disabled."""
        if self.lora:
            with self.model.disable_adapter():
                return self._logprobs(self.model, mb)[0]
        assert self.ref_model is not None
        return self._logprobs(self.ref_model, mb)[0]

    def _frozen_teacher(self, teacher: nn.Module | None) -> nn.Module | None:
        """The teacher of a part that declares ``teacher_logp_vocab`` (None when no part reads it); it
        must share the policy's vocabulary (the same tokenizer: only the size can be checked)."""
        if "teacher_logp_vocab" not in self.needs:
            return None
        if teacher is None:
            raise ConfigError("algo: a loss term reads a teacher's distributions (teacher_logp_vocab, e.g. gkd): "
                              "set algo.teacher.path (a model directory, a shipped alias or a run directory)")
        sizes = [getattr(getattr(m, "config", None), "vocab_size", None) for m in (self.model, teacher)]
        if None not in sizes and sizes[0] != sizes[1]:
            raise ConfigError(f"algo.teacher.path: the teacher's vocabulary has {sizes[1]} tokens, the policy's "
                              f"{sizes[0]}; distillation needs the same tokenizer")
        return teacher.eval().requires_grad_(False)

    def _vocab_logprobs(self, model: nn.Module, mb: Batch, entropy: bool = False
                        ) -> tuple[Tensor, Tensor | None, Tensor]:
        """(log-probs, entropies, full rows [N, L, V] on the loss mask's positions) of ``mb`` under ``model``
        (learn/forwards.py ``vocab_logprobs``), under autocast when configured."""
        with self._autocast():
            return self.forward.vocab_logprobs(model, mb, self.temperature, entropy)
