"""Sequence packing for the training forward: no compute on padding.

A padded batch of N rows costs N x (longest row) tokens; most of it is padding when lengths vary
(long-tail responses). Packing lays several sequences end to end in one row of at most
``budget_tokens`` tokens (first-fit decreasing), with

- position ids restarting at 0 for every sequence, and
- a block-diagonal causal attention mask (a 4D additive mask: token q sees token k only when both
  belong to the same sequence and k <= q),

so every sequence is computed exactly as it would be alone. The log-probs come back in the
unpacked [N, L] layout of ``token_logprobs``, so the losses and their denominators are unchanged.
The 4D mask is dense (rows x T x T); for long packed rows a varlen attention kernel (flash
attention's) is the better tool, which the CPU path here does not have.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from reinforge.learn.lm_head import chunked_token_logprobs
from reinforge.models.precision import at_least_float32, compute_dtype


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


def group_micro_batches(lengths: Tensor, group_index: Tensor, budget_tokens: int) -> list[list[int]]:
    """Like ``micro_batches``, but every group's rows stay in one micro-batch (for a loss computed per
    group, e.g. DPO's per pair): groups in order of their first row, added while rows x longest row
    stays within ``budget_tokens``; a group over the budget forms a micro-batch of its own."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_index.tolist()):
        members.setdefault(g, []).append(i)
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for rows in members.values():
        n = max(int(lengths[i]) for i in rows)
        if current and (len(current) + len(rows)) * max(longest, n) > budget_tokens:
            out.append(sorted(current))
            current, longest = [], 0
        current += rows
        longest = max(longest, n)
    if current:
        out.append(sorted(current))
    return out


def group_order(group_index: Tensor, generator: torch.Generator | None) -> Tensor:
    """Row indices with the groups in a random order (``generator``; None: as they come) and each
    group's rows together: the mini-batches of a part that needs whole groups."""
    groups, inverse = torch.unique(group_index, return_inverse=True)
    perm = torch.randperm(len(groups), generator=generator) if generator is not None else torch.arange(len(groups))
    rank = torch.empty_like(perm)
    rank[perm] = torch.arange(len(groups))
    return torch.sort(rank[inverse] * len(group_index) + torch.arange(len(group_index))).indices


def plan_packing(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Rows of sequence indices, each row's total length <= ``budget_tokens`` (first-fit
    decreasing; a sequence longer than the budget gets a row of its own). Deterministic."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = lengths[i]
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(budget_tokens - n)
    return rows


def packed_micro_batches(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Dynamic micro-batches for packed training: the sequences are packed first-fit decreasing
    into rows as wide as the longest one (W), and consecutive rows form a micro-batch of at most
    ``budget_tokens`` // W rows (at least one). A micro-batch thus holds up to ``budget_tokens``
    tokens of which almost all are real, where padded micro-batches hold rows x longest row."""
    if not lengths:
        return []
    width = max(max(lengths), 1)
    rows = plan_packing(lengths, width)
    per_micro = max(1, budget_tokens // width)
    return [sorted(i for row in rows[k:k + per_micro] for i in row) for k in range(0, len(rows), per_micro)]


def packed_token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    budget_tokens: int,
    temperature: float = 1.0,
    entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """``token_logprobs`` of right-padded rows (real tokens first, as ``Batch`` lays them out),
    computed on packed rows; same [N, L] outputs (column 0 and padding are 0). ``chunk_tokens`` > 0:
    the LM head over that many of the packed tokens at a time (learn/lm_head.py)."""
    n, width = input_ids.shape
    ids, positions, allowed, src, dst = _pack(input_ids, attention_mask, budget_tokens)
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=ids.device).masked_fill(~allowed, torch.finfo(dtype).min)
    inputs = dict(input_ids=ids, attention_mask=mask[:, None], position_ids=positions, use_cache=False)
    if chunk_tokens > 0:
        hidden = model.get_decoder()(**inputs).last_hidden_state
        out_dtype = compute_dtype(hidden.dtype)
    else:
        logits = at_least_float32(model(**inputs).logits)
        if temperature != 1.0:
            logits = logits / temperature
        out_dtype = logits.dtype
    out_logp = torch.zeros((n, width), dtype=out_dtype, device=ids.device)
    out_ent = torch.zeros_like(out_logp) if entropy else None
    if src is None or dst is None:
        return out_logp, out_ent
    (sr, sc), target = src, ids[src[0], src[1] + 1]
    if chunk_tokens > 0:
        logp, ent = chunked_token_logprobs(hidden[sr, sc], model.get_output_embeddings(), target, temperature,
                                           chunk_tokens, entropy, entropy_grad)
    else:
        picked = torch.log_softmax(logits[sr, sc], dim=-1)  # [tokens, vocab]
        logp, ent = picked.gather(-1, target[:, None]).squeeze(-1), None
        if entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = -(picked.exp() * picked).sum(-1)
    out_logp = out_logp.index_put(dst, logp)
    if ent is not None:
        out_ent = out_ent.index_put(dst, ent)  # type: ignore[union-attr]
    return out_logp, out_ent


def _pack(input_ids: Tensor, attention_mask: Tensor, budget_tokens: int
          ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor] | None, tuple[Tensor, Tensor] | None]:
    """The packed rows of ``plan_packing``: (ids, position ids restarting per sequence, the boolean
    block-diagonal causal mask [rows, W, W], where each sequence's tokens t >= 1 are predicted from in
    the packed rows (row, column of t - 1) and where they go in the unpacked layout (row, t); the last
    two None when no sequence has two tokens)."""
    lengths = attention_mask.sum(-1).tolist()
    rows = plan_packing(lengths, budget_tokens)
    packed_width = max(sum(lengths[i] for i in row) for row in rows)
    device = input_ids.device
    ids = torch.zeros((len(rows), packed_width), dtype=input_ids.dtype, device=device)
    positions = torch.zeros_like(ids)
    segment = torch.full((len(rows), packed_width), -1, dtype=torch.long, device=device)
    src_row, src_col, dst_row, dst_col = [], [], [], []
    for r, row in enumerate(rows):
        offset = 0
        for i in row:
            k = lengths[i]
            ids[r, offset:offset + k] = input_ids[i, :k]
            positions[r, offset:offset + k] = torch.arange(k, device=device)
            segment[r, offset:offset + k] = i
            if k > 1:
                src_row.append(torch.full((k - 1,), r))
                src_col.append(torch.arange(offset, offset + k - 1))  # logits at t-1 predict token t
                dst_row.append(torch.full((k - 1,), i))
                dst_col.append(torch.arange(1, k))
            offset += k
    same = segment[:, :, None] == segment[:, None, :]
    causal = torch.ones(packed_width, packed_width, dtype=torch.bool, device=device).tril()
    allowed = same & causal & (segment[:, :, None] >= 0)
    allowed |= torch.eye(packed_width, dtype=torch.bool, device=device)  # padding rows attend to themselves
    if not src_row:
        return ids, positions, allowed, None, None
    src = (torch.cat(src_row).to(device), torch.cat(src_col).to(device))
    return ids, positions, allowed, src, (torch.cat(dst_row).to(device), torch.cat(dst_col).to(device))
