"""Several LoRA adapters on one base (learn/multi_lora.py, docs/lora.md): trained together they equal
single-adapter runs; each one's optimizer, schedule, random stream and checkpoint are its own."""

import copy

import pytest
import torch
from numerics import assert_all_exact, float64_model

from reinforge.config import LoraConfig
from reinforge.learn.logprobs import token_logprobs
from reinforge.learn.lora import adapter_weights, wrap_lora
from reinforge.learn.multi_lora import AdamParams, MultiLora, Schedule
from reinforge.learn.optim import build_optimizer
from reinforge.models.loading import load_model

SPECS = {  # name: (lora, seed, adam, schedule): each adapter differs in every setting
    "u": (LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"]), 1,
          AdamParams(lr=1e-2), Schedule()),
    "v": (LoraConfig(enabled=True, r=8, alpha=16, dropout=0.1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
          2, AdamParams(lr=5e-3, betas=(0.8, 0.99), weight_decay=0.01), Schedule(warmup_steps=2, steps=3)),
    "w": (LoraConfig(enabled=True, r=2, alpha=4, target_modules=["gate_proj", "up_proj", "down_proj"]), 3,
          AdamParams(lr=2e-2, eps=1e-6, grad_clip=0.5), Schedule(lr_schedule="cosine", steps=3)),
}
STEPS = 3


def _base():
    return float64_model(load_model("tiny-base", "float64"))


def _batches(steps=STEPS, rows=6, width=8):
    """Per step: right-padded token rows of random lengths, each row's adapter (interleaved), advantages."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        lengths = torch.randint(3, width + 1, (rows,), generator=g)
        ids = torch.randint(3, 18, (rows, width), generator=g)
        mask = (torch.arange(width) < lengths[:, None]).long()
        ids = ids * mask
        names = [("u", "v", "w")[i % 3] for i in range(rows)]
        out.append((ids, mask, names, torch.randn(rows, generator=g, dtype=torch.float64)))
    return out


def _loss(mask, adv):
    """A policy-gradient loss: - sum over tokens of advantage * log p, over the adapter's token count."""
    def loss_fn(logp, rows):
        m = mask[rows, : logp.shape[1]].to(logp.dtype)
        m[:, 0] = 0
        return -(adv[rows, None] * logp * m).sum() / m.sum()
    return loss_fn


def _single_run(name, batches):
    """Adapter ``name`` trained alone, through the single-adapter pieces (``wrap_lora``, ``build_optimizer``)."""
    lora, seed, adam, schedule = SPECS[name]
    model = wrap_lora(_base(), lora, seed=seed)
    params = [p for p in model.parameters() if p.requires_grad]
    cfg = type("Cfg", (), {**adam.__dict__, **schedule.__dict__, "fused_optimizer": False})
    optimizer, scheduler = build_optimizer(params, cfg)
    torch.manual_seed(seed)  # the dropout's stream, as the adapter's own
    model.train()
    for ids, mask, names, adv in batches:
        rows = torch.tensor([i for i, n in enumerate(names) if n == name])
        width = int(mask[rows].sum(-1).max())
        logp, _ = token_logprobs(model, ids[rows, :width], mask[rows, :width])
        _loss(mask, adv)(logp, rows).backward()
        if adam.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, adam.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return adapter_weights(model)


def _tensors(weights):
    return [t for a, b, _ in weights.modules.values() for t in (a, b)]


def _multi(batches, order=("w", "u", "v")):
    multi = MultiLora(_base())
    for name, (lora, seed, adam, schedule) in SPECS.items():
        multi.create_adapter(name, lora, seed=seed, adam=adam, schedule=schedule)
    for ids, mask, names, adv in batches:
        _, losses = multi.forward_backward(ids, mask, names, _loss(mask, adv))
        assert set(losses) == {"u", "v", "w"}
        for name in order:
            multi.optim_step(name)
    return multi


@pytest.mark.numerics
def test_three_adapters_trained_together_equal_three_single_runs():
    batches = _batches()
    multi = _multi(batches)
    for name in SPECS:
        alone = _single_run(name, batches)
        together = multi.adapter_weights(name)
        assert together.modules.keys() == alone.modules.keys()
        assert_all_exact(_tensors(together), _tensors(alone))
        assert all(b.abs().max() > 0 for _, b, _ in together.modules.values())  # trained: B left zero
    # the base exists once: each adapter's A and B are the only trainable tensors
    assert sum(p.numel() for p in multi.model.parameters() if p.requires_grad) < 0.1 * sum(
        p.numel() for p in multi.model.parameters())


@pytest.mark.numerics
def test_a_saved_adapter_resumes_exactly_in_another_process_state(tmp_path):
    batches = _batches(steps=3)
    multi = _multi(batches[:2])
    multi.save_adapter("v", tmp_path / "v")
    ids, mask, names, adv = batches[2]
    multi.forward_backward(ids, mask, names, _loss(mask, adv))
    multi.optim_step("v")
    fresh = MultiLora(_base())
    fresh.create_adapter("other", SPECS["u"][0], seed=9)  # another adapter first: v's position differs
    fresh.load_adapter("v", tmp_path / "v")
    rows = [i for i, n in enumerate(names) if n == "v"]
    fresh.forward_backward(ids[rows], mask[rows], ["v"] * len(rows), _loss(mask[rows], adv[rows]))
    fresh.optim_step("v")
    assert fresh.adapters["v"].steps == 3 and fresh.adapters["v"].scheduler.last_epoch == 3
    assert_all_exact(_tensors(fresh.adapter_weights("v")), _tensors(multi.adapter_weights("v")))


def test_remove_and_recreate_an_adapter_and_per_call_adam():
    multi = MultiLora(load_model("tiny-base"))
    for name in ("x", "y"):
        multi.create_adapter(name, LoraConfig(enabled=True, r=2, alpha=4), seed=0)
    with pytest.raises(ValueError, match="exists"):
        multi.create_adapter("x")
    before = copy.deepcopy(_tensors(multi.adapter_weights("y")))
    multi.remove_adapter("x")
    assert multi.names == ["y"] and not any(".x." in n for n, _ in multi.model.named_parameters())
    with pytest.raises(KeyError, match="no adapter 'x'"):
        multi.optim_step("x")
    multi.create_adapter("x", LoraConfig(enabled=True, r=2, alpha=4), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(multi.adapter_weights("x")), before, strict=True))
    ids = torch.tensor([[1, 5, 6, 7, 2]])
    multi.forward_backward(ids, torch.ones_like(ids), ["x"], lambda logp, rows: -logp.sum())
    out = multi.optim_step("x", AdamParams(lr=0.5))
    assert out["lr"] == 0.5 and multi.adapters["x"].optimizer.param_groups[0]["lr"] == 0.5
    assert not all(torch.equal(a, b) for a, b in zip(_tensors(multi.adapter_weights("x")), before, strict=True))


def test_forward_gives_each_row_its_adapter():
    multi = MultiLora(float64_model(load_model("tiny-base", "float64")))
    for name, seed in (("x", 0), ("y", 1)):
        multi.create_adapter(name, LoraConfig(enabled=True, r=2, alpha=4), seed=seed)
        with torch.no_grad():
            for _, b, _ in multi.adapter_weights(name).modules.values():
                b.normal_(0, 0.1, generator=torch.Generator().manual_seed(seed))
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 0, 0], [1, 4, 4, 4, 2]])
    mask = (ids > 0).long()
    mixed = multi.forward(ids, mask, ["x", "y", "x"])
    for name, rows in (("x", [0, 2]), ("y", [1])):
        alone = multi.forward(ids[rows], mask[rows], [name] * len(rows))
        assert_all_exact([mixed[rows]], [alone])
    assert not torch.allclose(multi.forward(ids, mask, ["y"] * 3)[0], mixed[0])


def test_adapters_trained_together_are_served_by_one_engine(tiny_tokenizer):
    """The service's path: adapters trained in one MultiLora, pushed as A and B to one engine, sampled
    in one mixed batch, each row as with that adapter's merged weights."""
    from reinforge.learn.lora import merged_weights
    from reinforge.rollout.torch_engine import TorchRolloutEngine
    from reinforge.rollout.types import GenerationRequest, SamplingParams

    base = load_model("tiny-base")
    multi = MultiLora(copy.deepcopy(base))
    for name, seed in (("x", 0), ("y", 1)):
        multi.create_adapter(name, LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "up_proj"]),
                             seed=seed, adam=AdamParams(lr=0.05))
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 10, 2], [1, 4, 4, 4, 2], [1, 11, 12, 13, 2]])
    for _ in range(2):
        multi.forward_backward(ids, torch.ones_like(ids), ["x", "y", "x", "y"], lambda logp, rows: -logp.sum())
        multi.optim_step("x")
        multi.optim_step("y")
    engine = TorchRolloutEngine(copy.deepcopy(base), tiny_tokenizer)
    for name in ("x", "y"):
        assert all(b.abs().max() > 0 for _, b, _ in multi.adapter_weights(name).modules.values())  # trained
        engine.update_adapter(name, multi.adapter_weights(name))
    prompts, names = [[1, 5, 6], [1, 8], [1, 4, 12]], ["x", "y", "y"]
    params = SamplingParams(max_new_tokens=8, greedy=True)
    requests = [GenerationRequest(p, str(i), adapter=n) for i, (p, n) in enumerate(zip(prompts, names, strict=True))]
    mixed = engine.generate(requests, params)
    for name in ("x", "y"):
        multi.model.set_adapter(name)
        merged = TorchRolloutEngine(copy.deepcopy(base), tiny_tokenizer)
        merged.update_weights(merged_weights(multi.model), 1)
        want = merged.generate([GenerationRequest(p, str(i)) for i, p in enumerate(prompts)], params)
        for i in [i for i, n in enumerate(names) if n == name]:
            assert mixed[i].token_ids == want[i].token_ids
            assert torch.allclose(torch.tensor(mixed[i].logprobs), torch.tensor(want[i].logprobs), atol=1e-4)
