"""One policy per role (``env.role_adapters``, learn/role_adapters.py, docs/multi_agent.md): each role's LoRA
adapter gets gradient from its own turns only, the collector samples each turn with its role's adapter, one
per-role step equals separate single-role updates, and a checkpoint restores every adapter and optimizer."""

from __future__ import annotations

import copy
import random
import re

import pytest
import torch
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

from reinforge.config import load_config
from reinforge.envs.nim import NimEnv
from reinforge.errors import ConfigError
from reinforge.learn.learner import Learner
from reinforge.learn.role_adapters import RoleAdapters, role_batch
from reinforge.orchestrate.episodes import build_batch
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams
from reinforge.types import Task

ROLES = ["first", "second"]
LORA = ["model.lora.enabled=true", "model.lora.sync=adapter", "env.role_adapters=[first,second]"]


class RandomMoves(TorchRolloutEngine):
    """A "model" that takes 1 or 2 at random (its own seeded stream), recording each request."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moves, self.requests = random.Random(0), []

    def generate(self, requests, params, generator=None, on_step=None):
        out = []
        for r in requests:
            self.requests.append(r)
            for _ in range(params.n):
                text = str(self.moves.choice([1, 2]))
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
                out.append(Generation(r.request_id, r.prompt_ids, ids, [-0.7] * len(ids), "stop", self.version, text))
        return out


@pytest.fixture(scope="module")
def tok():
    return ascii_chat_tokenizer()


def _cfg(*overrides):
    return load_config("multi_agent_nim", [*LORA, "train.lr=1e-2", "model.lora.r=2", "algo.kl.coef=0.05",
                                           "train.minibatches=2", "train.epochs=2", *overrides])


def _episodes(tok, train_roles=None, role_adapters=()):
    """Self-play games on piles 3-6, 6 per pile, with random legal moves (the same games on every call)."""
    engine = RandomMoves(tiny_random_llama(tok), tok, "cpu", seed=0)
    tasks = [Task(id=f"nim-{p}", prompt=f"nim {p}", answer=str(p)) for p in (3, 4, 5, 6)]
    trajs = run_episodes(tasks, engine, NimEnv, SamplingParams(max_new_tokens=2, n=6),
                         EpisodeLimits(max_turns=8, max_total_tokens=512, max_turn_tokens=2), seed=0,
                         train_roles=train_roles, role_adapters=role_adapters)
    return trajs, engine


def _batch(tok, cfg, train_roles=None):
    trajs, _ = _episodes(tok, train_roles)
    batch, _ = build_batch(trajs, cfg.algo, tok.pad_token_id)
    return batch


def _role_learner(tok, cfg):
    return RoleAdapters(tiny_random_llama(tok), ROLES, cfg.train, cfg.algo, cfg.rollout, cfg.model.lora, seed=3)


def _adapter(model, name):
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def _params(learner):
    return [p for group in learner.optimizer.param_groups for p in group["params"]]


# ---- (a) each adapter learns from its own role's tokens only -------------------------------------------


def test_the_role_mask_keeps_exactly_the_roles_turns(tok):
    cfg = _cfg()
    trajs, _ = _episodes(tok)
    batch, _ = build_batch(trajs, cfg.algo, tok.pad_token_id)
    for role in ROLES:
        mask = role_batch(batch, role).loss_mask
        for i, t in enumerate(trajs):
            want = torch.zeros(mask.shape[1])
            for (a, b), r in zip(t.turn_spans, t.metadata["turn_roles"], strict=True):
                want[a:b] = float(r == role)
            assert torch.equal(mask[i], want)
    assert torch.equal(role_batch(batch, "first").loss_mask + role_batch(batch, "second").loss_mask, batch.loss_mask)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_each_adapter_gets_gradient_from_its_own_role_only(tok):
    """At every optimizer step of role r (two epochs of two mini-batches each), r's adapter has a gradient
    and the other adapter none; the other adapter's weights do not move during r's update."""
    cfg = _cfg()
    learner, batch = _role_learner(tok, cfg), _batch(tok, cfg)
    params = {role: _params(learner.learners[role]) for role in ROLES}
    seen = []  # per optimizer step: (role, its grad norm, the other adapter's grads)

    for role in ROLES:
        other, opt = ROLES[1 - ROLES.index(role)], learner.learners[role].optimizer
        step = opt.step

        def recording_step(*args, role=role, other=other, step=step, **kwargs):
            own = torch.cat([p.grad.flatten() for p in params[role]])
            seen.append((role, float(own.norm()), [p.grad for p in params[other]]))
            return step(*args, **kwargs)

        opt.step = recording_step
    before = {role: _adapter(learner.model, role) for role in ROLES}
    learner.update(batch)
    assert [r for r, _, _ in seen] == ["first"] * 4 + ["second"] * 4
    for _, norm, others in seen:
        assert norm > 0 and all(g is None or not g.any() for g in others)
    for role in ROLES:
        after = _adapter(learner.model, role)
        assert all(not torch.equal(before[role][k], after[k]) for k in after if "lora_B" in k)  # it trained
    # the optimizers hold disjoint parameters: each its own adapter's A and B
    ids = [{id(p) for p in params[r]} for r in ROLES]
    assert len(ids[0]) == len(ids[1]) > 0 and not ids[0] & ids[1]
    names = {id(p): n for n, p in learner.model.named_parameters()}
    assert all(".first." in names[i] for i in ids[0]) and all(".second." in names[i] for i in ids[1])


# ---- (b) the collector samples each role's turn with its adapter ---------------------------------------


def _role(tok, request):
    """The role the prompt asks to move: its last role name ("nim 5: first, take 1 or 2 ... left 4: second")."""
    return re.findall(r"\b(first|second)\b", tok.decode(request.prompt_ids))[-1]


def test_each_turn_is_requested_with_its_roles_adapter(tok):
    trajs, engine = _episodes(tok, role_adapters=ROLES)
    assert len(engine.requests) == sum(len(t.turn_spans) for t in trajs) - 4 * 5  # the first turn: one request per group of 6
    for r in engine.requests:
        assert r.adapter == _role(tok, r)
    _, engine = _episodes(tok, role_adapters=["second"])  # a role without an adapter: the base (None)
    assert {(_role(tok, r), r.adapter) for r in engine.requests} == {
        ("first", None), ("second", "second")}


def test_the_engine_samples_each_request_with_the_adapter_it_names(tok):
    """Two role adapters far from zero in one engine: a request's greedy tokens are its adapter's, alone
    or in a batch that mixes the two roles."""
    cfg = _cfg()
    learner = _role_learner(tok, cfg)
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 1.0)
    engine = TorchRolloutEngine(tiny_random_llama(tok), tok, "cpu", seed=0)
    from reinforge.learn.lora import adapter_weights

    for role in ROLES:
        engine.update_adapter(role, adapter_weights(learner.model, role))
    prompt = tok("nim 5: first, take 1 or 2", add_special_tokens=False)["input_ids"]
    greedy = SamplingParams(max_new_tokens=6, greedy=True)

    def tokens(requests):
        return [g.token_ids for g in engine.generate(requests, greedy)]

    alone = {role: tokens([GenerationRequest(prompt, role, adapter=role)])[0] for role in ROLES}
    base = tokens([GenerationRequest(prompt, "base")])[0]
    assert alone["first"] != alone["second"] and base not in alone.values()  # the adapters matter
    mixed = tokens([GenerationRequest(prompt, r, adapter=r) for r in ("second", "first", "second")])
    assert mixed == [alone["second"], alone["first"], alone["second"]]


def test_a_role_without_trained_tokens_is_not_updated(tok):
    cfg = _cfg()
    learner, batch = _role_learner(tok, cfg), _batch(tok, cfg)
    batch.loss_mask = role_batch(batch, "first").loss_mask  # second's turns are observations this step
    before = _adapter(learner.model, "second")
    metrics = learner.update(batch)
    after = _adapter(learner.model, "second")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert learner.learners["second"].optimizer.state_dict()["state"] == {} and learner.learners["second"].step == 0
    assert "role/first/loss" in metrics and not any(k.startswith("role/second/") for k in metrics)
    assert metrics["updates"] == 4


# ---- (c) one per-role step equals separate single-role updates -----------------------------------------


def test_a_per_role_step_equals_single_role_updates(tok):
    """The per-role learner's update against, per role, a single-adapter LoRA learner (the same starting
    adapter) on the batch collected with ``env.train_roles=[role]`` (the other role's turns observations)."""
    cfg = _cfg()
    learner = _role_learner(tok, cfg)
    start = {role: _adapter(learner.model, role) for role in ROLES}
    metrics = learner.update(_batch(tok, cfg))
    for role in ROLES:
        from peft import set_peft_model_state_dict

        single = Learner(tiny_random_llama(tok), cfg.train, cfg.algo, cfg.rollout, lora=cfg.model.lora, seed=3)
        set_peft_model_state_dict(single.model, start[role])
        single_metrics = single.update(_batch(tok, cfg, train_roles=[role]))
        mine, theirs = _adapter(learner.model, role), _adapter(single.model, "default")
        assert mine.keys() == theirs.keys()
        for k in mine:
            assert not torch.equal(mine[k], start[role][k]) or "lora_B" not in k  # it trained
            torch.testing.assert_close(mine[k], theirs[k], rtol=1e-5, atol=1e-7)
        for name in ("loss", "grad_norm", "kl_ref"):
            assert metrics[f"role/{role}/{name}"] == pytest.approx(single_metrics[name], rel=1e-4, abs=1e-7)
    assert metrics["updates"] == 2 * 4  # two roles, epochs x minibatches each


# ---- (d) checkpoints -----------------------------------------------------------------------------------


def test_a_saved_state_restores_every_adapter_and_optimizer_exactly(tok, tmp_path):
    cfg = _cfg()
    learner, batch = _role_learner(tok, cfg), _batch(tok, cfg)
    learner.update(copy.deepcopy(batch))
    torch.save(learner.state_dict(), tmp_path / "trainer.pt")
    restored = _role_learner(tok, cfg)
    restored.load_state_dict(torch.load(tmp_path / "trainer.pt", weights_only=False))
    for role in ROLES:
        a, b = _adapter(learner.model, role), _adapter(restored.model, role)
        assert all(torch.equal(a[k], b[k]) for k in a)
        sa, sb = learner.learners[role].optimizer.state_dict(), restored.learners[role].optimizer.state_dict()
        assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) > 0
        for i in sa["state"]:
            assert all(torch.equal(sa["state"][i][k], sb["state"][i][k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    learner.update(copy.deepcopy(batch))  # and the next step is the same
    restored.update(copy.deepcopy(batch))
    for role in ROLES:
        a, b = _adapter(learner.model, role), _adapter(restored.model, role)
        assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match="the checkpoint holds adapters for"):
        RoleAdapters(tiny_random_llama(tok), ["first"], cfg.train, cfg.algo, cfg.rollout, cfg.model.lora).load_state_dict(
            learner.state_dict())


@pytest.mark.slow
def test_a_resumed_per_role_run_equals_the_straight_one(tmp_path, monkeypatch):
    """multi_agent_nim with an adapter per role, killed after its step-2 checkpoint and resumed: the same
    metrics as the run straight through, and the same adapters at the end."""
    from resume_fixtures import straight_and_resumed, untimed
    from safetensors.torch import load_file

    def cfg(name):
        return load_config("multi_agent_nim", [f"output_dir={tmp_path}", f"name={name}", *LORA, "train.lr=1e-3",
                                               "train.steps=3", "checkpoint.every=1", "checkpoint.keep=3",
                                               "rollout.prompts_per_step=2", "rollout.group_size=4",
                                               "task.heldout_size=4", "eval.final_samples=0", "log.report=false",
                                               "train.time_limit_s=0"])

    straight, resumed = straight_and_resumed(monkeypatch, cfg)
    records = [untimed(straight), untimed(resumed)]
    assert records[0] == records[1] and "train/role/second/grad_norm" in records[0][-1]
    ckpt = [run.run_dir / "checkpoints/step_3" for run in (straight, resumed)]
    wa, wb = (load_file(c / "adapter_model.safetensors") for c in ckpt)  # the first role's, peft's files
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = (torch.load(c / "trainer.pt", weights_only=False)["roles"] for c in ckpt)
    for role in ROLES:
        assert all(torch.equal(sa[role]["adapter"][k], sb[role]["adapter"][k]) for k in sa[role]["adapter"])


# ---- configuration ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "message"), [
    (["env.role_adapters=[first,second]"], "needs model.lora.enabled=true and model.lora.sync=adapter"),
    ([*LORA, "model.lora.sync=merged"], "needs model.lora.enabled=true and model.lora.sync=adapter"),
    ([*LORA, "algo.advantage=grpo"], "does not read; use at_grpo or role_ema"),
    ([*LORA[:2], "env.role_adapters=[first,first]"], "give each role once"),
    ([*LORA[:2], "env.role_adapters=[a.b]"], "without dots"),
    ([*LORA, "env.train_roles=[first]"], r"\['second'\] are not in env.train_roles"),
])
def test_bad_role_adapters_are_refused_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=f"env.role_adapters.*{message}"):
        load_config("multi_agent_nim", overrides)


def test_role_adapters_need_an_environment_with_roles():
    with pytest.raises(ConfigError, match="env.role_adapters: env single_turn has no roles"):
        load_config(None, [*LORA])
    assert load_config("multi_agent_nim", LORA).env.role_adapters == ROLES
