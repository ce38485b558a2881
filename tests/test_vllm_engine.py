"""rollout.engine=vllm and rollout.engine=auto.

The first tests run without vLLM (the clear error, weight naming, sampling translation, config
resolution, the auto rule); those that build vLLM are skipped with the reason when it is not
importable (`make install-vllm` installs it) and share one engine over tiny-base (vLLM loads in
about 15 s, its first generate warms up for about 20 s on 2 CPU cores).
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from reinforge.config import load_config
from reinforge.data.arithmetic import arithmetic_splits
from reinforge.errors import ConfigError, ReinforgeError
from reinforge.learn.logprobs import token_logprobs
from reinforge.orchestrate.components import resolve_config
from reinforge.rollout import auto_engine
from reinforge.rollout.auto_engine import VLLM_CROSSOVER_PARAMS, choose_engine, parameter_count
from reinforge.rollout.engines import context_limit, engine_spec
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.rollout.vllm_engine import full_weights, import_vllm, vllm_sampling_params


def _vllm_importable() -> tuple[bool, str]:
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed (make install-vllm)"
    try:
        import_vllm()
    except Exception as e:  # noqa: BLE001 - a broken install is a reason to skip, shown as such
        return False, f"vllm does not import: {e}"
    return True, ""


# ---------------------------------------------------------------------------------- without vLLM
def test_missing_vllm_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ReinforgeError, match="make install-vllm"):
        import_vllm()


def test_full_weights_adds_the_tied_head_and_keeps_names(tiny_model):
    params = dict(tiny_model.named_parameters())  # what the loop and merged LoRA weights hand over
    assert "lm_head.weight" not in params  # tiny-base ties its head to the embedding
    weights = full_weights(params, tied=True)
    assert set(weights) == set(params) | {"lm_head.weight"}
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    assert set(full_weights(tiny_model, tied=True)) == set(weights)  # a module: its state dict
    assert "lm_head.weight" not in full_weights(params, tied=False)


def test_sampling_params_translate_to_vllms():
    fake = types.SimpleNamespace(SamplingParams=lambda **kw: kw)
    sampled = vllm_sampling_params(fake, SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=3, n=4,
                                                        stop=("\n",), ignore_eos=True), seed=11)
    assert sampled == {"n": 4, "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 3, "stop": ["\n"],
                       "include_stop_str_in_output": True, "ignore_eos": True, "logprobs": 0, "seed": 11,
                       "detokenize": True}
    greedy = vllm_sampling_params(fake, SamplingParams(greedy=True, temperature=0.5), seed=0)
    assert greedy["temperature"] == 0.0 and greedy["stop"] is None and greedy["top_k"] == 0
    assert greedy["detokenize"] is False


def test_modules_vllms_start_up_scan_cannot_read_are_found(monkeypatch):
    from reinforge.rollout.vllm_engine import _unscannable_modules

    class Opaque:  # like llvmlite's ffi.lib: every attribute, __dict__ included, is a function wrapper
        def __getattribute__(self, name):
            return lambda: None

    bad, good = types.ModuleType("opaque_mod"), types.ModuleType("plain_mod")
    bad.lib, good.value = Opaque(), types.SimpleNamespace(kernel=1)
    monkeypatch.setitem(sys.modules, "opaque_mod", bad)
    monkeypatch.setitem(sys.modules, "plain_mod", good)
    found = _unscannable_modules()
    assert found.get("opaque_mod") is bad and "plain_mod" not in found and "sys" not in found


def test_vllm_engine_is_registered_replicable_without_importing_vllm():
    spec = engine_spec("vllm")
    assert (spec.replicable, spec.needs_server, spec.resolve) == (True, False, None)
    cfg = load_config(None, ["rollout.engine=vllm", "orchestrate.mode=async"])  # replicable: async allowed
    assert cfg.rollout.engine == "vllm"


def test_auto_rule():
    big, small = VLLM_CROSSOVER_PARAMS, VLLM_CROSSOVER_PARAMS - 1
    assert choose_engine("cpu", big, vllm_available=True) == "vllm"
    assert choose_engine("cpu", small, vllm_available=True) == "torch"
    assert choose_engine("cuda:0", small, vllm_available=True) == "vllm"
    assert choose_engine("cuda", big, vllm_available=False) == "torch"


def test_parameter_count_reads_the_config_without_weights(tiny_model):
    assert parameter_count("tiny-base") == sum(p.numel() for p in tiny_model.parameters())


def test_auto_resolves_in_the_config(monkeypatch):
    monkeypatch.setattr(auto_engine, "vllm_installed", lambda: False)
    assert resolve_config(load_config(None, ["rollout.engine=auto"])).rollout.engine == "torch"
    monkeypatch.setattr(auto_engine, "vllm_installed", lambda: True)
    assert resolve_config(load_config(None, ["rollout.engine=auto"])).rollout.engine == "torch"  # tiny-base is below the crossover
    assert 134_500_000 < VLLM_CROSSOVER_PARAMS  # the torch engine was measured faster at 134.5M on a CPU
    assert resolve_config(load_config(None, ["rollout.engine=auto", "model.device=cuda"])).rollout.engine == "vllm"
    with pytest.raises(ConfigError, match=r"rollout.engine=auto: cannot read the size of model.path='/nonexistent'"):
        load_config(None, ["rollout.engine=auto", "model.path=/nonexistent"])


def test_context_limit_prefers_the_engines_declaration(tiny_model):
    assert context_limit(types.SimpleNamespace(max_positions=32, model=tiny_model)) == 32
    assert context_limit(types.SimpleNamespace(model=tiny_model)) == tiny_model.config.max_position_embeddings
    assert context_limit(object()) is None


def test_eval_engine_defaults_to_torch_and_takes_a_name(tiny_model):
    from reinforge.eval.cli_eval import build_eval_engine
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    assert isinstance(build_eval_engine("tiny-base", 0), TorchRolloutEngine)
    assert isinstance(build_eval_engine("tiny-base", 0, engine="torch"), TorchRolloutEngine)
    with pytest.raises(ConfigError, match="unknown rollout engine 'nope'"):
        build_eval_engine("tiny-base", 0, engine="nope")


# ---------------------------------------------------------------------------------- with vLLM
VLLM_OK, VLLM_WHY = _vllm_importable()
needs_vllm = pytest.mark.skipif(not VLLM_OK, reason=VLLM_WHY)


def _requests(tokenizer, n=12):
    tasks = list(arithmetic_splits().heldout)[:n]
    return [GenerationRequest(encode_prompt(tokenizer, t.prompt), t.id) for t in tasks]


def _learner_logprobs(model, gens, pad_id: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(learner log-probs, sampler log-probs, mask) over the completions, right-padded."""
    ids = [g.prompt_ids + g.token_ids for g in gens]
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), pad_id)
    attn, sampled, mask = torch.zeros_like(input_ids), torch.zeros(len(ids), width), torch.zeros(len(ids), width)
    for i, (g, row) in enumerate(zip(gens, ids, strict=True)):
        input_ids[i, : len(row)], attn[i, : len(row)] = torch.tensor(row), 1
        p = len(g.prompt_ids)
        sampled[i, p : len(row)], mask[i, p : len(row)] = torch.tensor(g.logprobs), 1
    with torch.no_grad():
        logp, _ = token_logprobs(model, input_ids, attn, temperature)
    return logp, sampled, mask


@pytest.fixture(scope="module")
def vllm_engine():
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.vllm_engine import VLLMRolloutEngine

    # LoRA enabled (rank 4): the adapter tests share this engine. vLLM allows one engine at a time in a process
    # (a second one's start-up breaks the first's parallel state), so the tests that build their own (train, eval,
    # serve) come after every test of this one.
    return VLLMRolloutEngine(load_model("tiny-base"), load_tokenizer("tiny-base"), seed=0, adapter_rank=4)


@needs_vllm
@pytest.mark.slow
def test_vllm_logprobs_match_the_learner(vllm_engine, tiny_model, tiny_tokenizer):
    vllm_engine.update_weights(tiny_model, 0)
    for temperature in (1.0, 0.7):
        gens = vllm_engine.generate(_requests(tiny_tokenizer), SamplingParams(max_new_tokens=6, n=4,
                                                                              temperature=temperature))
        assert len(gens) == 48 and [g.sample_index for g in gens[:4]] == [0, 1, 2, 3]
        logp, sampled, mask = _learner_logprobs(tiny_model, gens, tiny_tokenizer.pad_token_id, temperature)
        assert mask.sum() > 48
        diff = ((logp - sampled).abs() * mask).max().item()
        assert diff < 1e-4, f"max |logp diff| {diff} at T={temperature}"
    for g in gens:
        assert g.text == tiny_tokenizer.decode(g.token_ids, skip_special_tokens=True)
        assert (g.finish_reason == "stop") == (g.token_ids[-1] == tiny_tokenizer.eos_token_id)


@needs_vllm
@pytest.mark.slow
def test_vllm_seeded_by_its_generator_and_greedy_matches_torch(vllm_engine, tiny_model, tiny_tokenizer):
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    vllm_engine.update_weights(tiny_model, 0)
    reqs = _requests(tiny_tokenizer, 8)
    vllm_engine.generator.manual_seed(5)
    a = vllm_engine.generate(reqs, SamplingParams(max_new_tokens=6, n=3))
    vllm_engine.generator.manual_seed(5)
    b = vllm_engine.generate(reqs, SamplingParams(max_new_tokens=6, n=3))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({tuple(g.token_ids) for g in a}) > 3  # the n samples of a prompt differ
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    ours = TorchRolloutEngine(tiny_model, tiny_tokenizer).generate(reqs, greedy)
    assert [g.token_ids for g in vllm_engine.generate(reqs, greedy)] == [g.token_ids for g in ours]


@needs_vllm
@pytest.mark.slow
def test_vllm_weight_sync_changes_samples_and_keeps_parity(vllm_engine, tiny_model, tiny_tokenizer):
    reqs, greedy = _requests(tiny_tokenizer, 12), SamplingParams(max_new_tokens=6, greedy=True)
    vllm_engine.update_weights(tiny_model, 0)
    before = [g.token_ids for g in vllm_engine.generate(reqs, greedy)]
    torch.manual_seed(0)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    vllm_engine.update_weights(dict(tiny_model.named_parameters()), 7)  # as the loop and LoRA merging give them
    after = vllm_engine.generate(reqs, greedy)
    assert [g.token_ids for g in after] != before and all(g.version == 7 for g in after)
    gens = vllm_engine.generate(reqs, SamplingParams(max_new_tokens=6, n=4))
    logp, sampled, mask = _learner_logprobs(tiny_model, gens, tiny_tokenizer.pad_token_id, 1.0)
    assert ((logp - sampled).abs() * mask).max().item() < 1e-4
    vllm_engine.stage_weights(tiny_model, 8)  # staged: loaded when the next generate starts
    assert vllm_engine.version == 7
    assert all(g.token_versions == [8] * len(g.token_ids) for g in vllm_engine.generate(reqs[:2], greedy))


@needs_vllm
@pytest.mark.slow
def test_vllm_refuses_what_it_cannot_do(vllm_engine, tiny_tokenizer):
    reqs = _requests(tiny_tokenizer, 1)
    with pytest.raises(ReinforgeError, match="exceeds the model's context of 64 positions"):
        vllm_engine.generate(reqs, SamplingParams(max_new_tokens=64))
    with pytest.raises(ReinforgeError, match="use rollout.engine=torch"):
        vllm_engine.generate(reqs, SamplingParams(), None, on_step=lambda *a: None)
    assert context_limit(vllm_engine) == 64


@needs_vllm
@pytest.mark.slow
def test_vllm_serves_adapters_per_request_like_the_torch_engine(vllm_engine, tiny_model, tiny_tokenizer):
    """Adapters sent as A and B alone: greedy tokens equal the torch engine's unmerged decoding of the same
    adapter, sampled log-probs equal the peft policy's; a batch mixing two adapters and the base equals
    each alone; new weights for a name replace the old LoRA id."""
    from reinforge.learn.lora import adapter_weights
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    engine, reqs = vllm_engine, _requests(tiny_tokenizer, 6)
    engine.update_weights(tiny_model, 0)  # the base again (an earlier test moved it)
    x, y = _lora_policy(tiny_model, seed=1), _lora_policy(tiny_model, seed=2, targets=("k_proj", "o_proj"))
    engine.update_adapter("x", adapter_weights(x), version=3)
    engine.update_adapter("y", adapter_weights(y))
    torch_engine = TorchRolloutEngine(tiny_model, tiny_tokenizer)
    torch_engine.update_adapter("x", adapter_weights(x))
    greedy = SamplingParams(max_new_tokens=6, greedy=True)

    def named(name, rs=reqs):
        return [GenerationRequest(r.prompt_ids, r.request_id, adapter=name) for r in rs]

    ours = engine.generate(named("x"), greedy)
    assert [g.token_ids for g in ours] == [g.token_ids for g in torch_engine.generate(named("x"), greedy)]
    assert all(g.version == 3 for g in ours)
    alone = {n: [g.token_ids for g in engine.generate(named(n), greedy)] for n in ("x", "y", None)}
    assert alone["x"] != alone[None] and alone["y"] != alone[None]
    mixed = engine.generate([GenerationRequest(r.prompt_ids, r.request_id, adapter=("x", "y", None)[i % 3])
                             for i, r in enumerate(reqs)], greedy)
    assert [g.token_ids for g in mixed] == [alone[("x", "y", None)[i % 3]][i] for i in range(len(reqs))]
    gens = engine.generate(named("x"), SamplingParams(max_new_tokens=6, n=3))
    logp, sampled, mask = _learner_logprobs(x, gens, tiny_tokenizer.pad_token_id, 1.0)
    assert ((logp - sampled).abs() * mask).max().item() < 1e-4
    first_id = engine._adapters["x"].lora_int_id
    engine.update_adapter("x", adapter_weights(y))  # new weights under the old name: a new LoRA id
    assert engine._adapters["x"].lora_int_id != first_id and first_id not in engine.llm.llm_engine.list_loras()
    assert [g.token_ids for g in engine.generate(named("x"), greedy)] == alone["y"]
    engine.remove_adapter("x")
    with pytest.raises(ReinforgeError, match=r"adapters \['x'\]"):
        engine.generate(named("x"), greedy)


def _answer_probability(model, tokenizer, n: int = 256) -> float:
    """Mean probability of the exact correct answer (then EOS) over ``n`` held-out prompts: the
    expected reward that GRPO on this task raises, computed exactly (no sampling noise)."""
    rows = []
    for t in list(arithmetic_splits().heldout)[:n]:
        answer = tokenizer(t.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((encode_prompt(tokenizer, t.prompt), answer))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((n, width), tokenizer.pad_token_id)
    attn, mask = torch.zeros_like(ids), torch.zeros(n, width)
    for i, (p, a) in enumerate(rows):
        ids[i, : len(p) + len(a)], attn[i, : len(p) + len(a)] = torch.tensor(p + a), 1
        mask[i, len(p) : len(p) + len(a)] = 1
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, attn, 1.0)
    return float((logp * mask).sum(-1).exp().mean())


@needs_vllm
@pytest.mark.slow
def test_grpo_through_vllm_learns_like_the_torch_engine(tmp_path, tiny_tokenizer):
    """The sync loop with rollout.engine=vllm: weights synced every step (the sampler's log-probs
    stay those of the learner), the evaluations run through it, and the policy gains on the task
    as much as with the torch engine at equal steps."""
    from reinforge.models.loading import load_model
    from reinforge.orchestrate.run import train

    base = _answer_probability(load_model("tiny-base"), tiny_tokenizer)
    gains = {}
    for engine in ("torch", "vllm"):
        result = train(load_config(None, [
            f"output_dir={tmp_path / engine}", "train.steps=8", "train.lr=1e-4", "train.lr_schedule=constant",
            "task.heldout_size=16", "eval.every=4", "eval.final_samples=2", "log.report=false",
            "train.time_limit_s=0", "checkpoint.every=0", f"rollout.engine={engine}"]))
        steps = [m for m in result.metrics() if "reward/mean" in m]
        assert len(steps) == 8 and 0 <= result.heldout_after <= 1
        assert max(m["train/logprob_mismatch_max"] for m in steps) < 1e-4  # synced every step
        gains[engine] = _answer_probability(load_model(str(result.run_dir)), tiny_tokenizer) - base
    # measured: base 0.258, +0.014 (torch) and +0.027 (vllm) after 8 steps
    assert gains["torch"] > 0 and gains["vllm"] > 0.3 * gains["torch"], gains


@needs_vllm
@pytest.mark.slow
def test_lora_grpo_with_adapter_sync_through_vllm(tmp_path, monkeypatch):
    """model.lora.sync=adapter with rollout.engine=vllm: after every update vLLM receives the adapter alone
    (a LoRA request), never full weights, and samples as the learner's policy (log-prob mismatch < 1e-4)."""
    from reinforge.orchestrate.run import train
    from reinforge.rollout.vllm_engine import VLLMRolloutEngine

    calls = []
    adapter, weights = VLLMRolloutEngine.update_adapter, VLLMRolloutEngine.update_weights
    monkeypatch.setattr(VLLMRolloutEngine, "update_adapter", lambda self, name, w, version=None: (
        calls.append(("adapter", w.nbytes())), adapter(self, name, w, version))[1])
    monkeypatch.setattr(VLLMRolloutEngine, "update_weights", lambda self, state, version: (
        calls.append(("full", 0)), weights(self, state, version))[1])
    result = train(load_config(None, [
        f"output_dir={tmp_path}", "model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8",
        "model.lora.sync=adapter", "rollout.engine=vllm", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "task.heldout_size=8", "train.time_limit_s=0", "train.steps=3", "train.lr=5e-3", "eval.final_samples=0",
        "eval.every=0", "log.report=false", "checkpoint.every=0", "algo.skip_equal_reward_groups=false"]))
    steps = [m for m in result.metrics() if "train/loss" in m]
    assert len(steps) == 3 and max(m["train/logprob_mismatch_max"] for m in steps) < 1e-4
    assert {kind for kind, _ in calls} == {"adapter"} and len([n for _, n in calls if n > 0]) >= 3


@needs_vllm
@pytest.mark.slow
def test_reinforge_eval_through_vllm(tmp_path):
    """`reinforge eval --engine vllm`: greedy accuracy, mean@n and pass@k through the vLLM engine."""
    from reinforge.eval.cli_eval import run_eval

    scores = {engine: run_eval(["tiny-base"], "arithmetic", None, 2, 1.0, 6, 24, 0, engine=engine)["models"]["tiny-base"]
              for engine in ("vllm", "torch")}
    assert 0 < scores["vllm"]["greedy_accuracy"] < 1 and set(scores["vllm"]["pass_at_k"]) == {"1", "2"}
    assert scores["vllm"]["greedy_accuracy"] == scores["torch"]["greedy_accuracy"]  # the same greedy tokens


@needs_vllm
@pytest.mark.slow
def test_async_rollout_workers_through_vllm(tmp_path):
    """orchestrate.mode=async with rollout.engine=vllm: each rollout worker process builds its own vLLM
    and takes the learner's weights from shared memory before each request (max_staleness 0: every
    batch is sampled by the weights the learner then trains, so the log-probs agree)."""
    from reinforge.orchestrate.run import train

    result = train(load_config(None, [
        f"output_dir={tmp_path}", "train.steps=3", "task.heldout_size=8", "eval.every=0", "eval.final_samples=0",
        "log.report=false", "train.time_limit_s=0", "checkpoint.every=0", "rollout.engine=vllm",
        "orchestrate.mode=async", "orchestrate.max_staleness=0", "orchestrate.weight_update=wait",
        "orchestrate.timeout_s=300"]))
    steps = [m for m in result.metrics() if "reward/mean" in m]
    assert [m["policy_version"] for m in steps] == [1, 2, 3]
    assert all(m["async/lag_max"] == 0 for m in steps)
    assert max(m["train/logprob_mismatch_max"] for m in steps if "train/logprob_mismatch_max" in m) < 1e-4


@needs_vllm
@pytest.mark.slow
def test_multi_turn_episodes_through_vllm(tmp_path):
    """A tool-using recipe (agent_calculator: the model calls the calculator, reads its result, answers)
    with rollout.engine=vllm: every turn is a vLLM generate, tokens of the tool's messages are masked
    out, and the sampler's log-probs match the learner's over the model's own tokens."""
    from reinforge.orchestrate.run import train

    result = train(load_config("agent_calculator", [
        f"output_dir={tmp_path}", "train.steps=2", "task.heldout_size=8", "eval.every=0", "eval.final_samples=0",
        "log.report=false", "train.time_limit_s=0", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.engine=vllm"]))
    steps = [m for m in result.metrics() if "reward/mean" in m]
    assert len(steps) == 2 and all(m["episode/turns_mean"] > 1 for m in steps)  # the tool was called
    assert max(m["train/logprob_mismatch_max"] for m in steps if "train/logprob_mismatch_max" in m) < 1e-4


@needs_vllm
@pytest.mark.slow
def test_serve_through_vllm():
    """`reinforge serve --engine vllm`: completions through vLLM (greedy: the torch engine's tokens);
    a stream request is a 400 that names the engine that streams."""
    openai = pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
    from reinforge.orchestrate.agent_episodes import BackgroundServer
    from reinforge.serve.launch import build_server_app

    texts = {}
    for engine in ("vllm", "torch"):
        app = build_server_app("tiny-base", engine=engine)
        with BackgroundServer(app, log_level="error") as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            r = client.completions.create(model="tiny-base", prompt=["12+3=", "40+41="], max_tokens=6, temperature=0,
                                          logprobs=0)
            texts[engine] = [c.text for c in r.choices]
            assert all(c.logprobs.token_logprobs for c in r.choices)
            if engine == "vllm":
                with pytest.raises(openai.BadRequestError, match="--engine torch"):
                    client.completions.create(model="tiny-base", prompt="1+1=", max_tokens=4, stream=True)
    assert texts["vllm"] == texts["torch"]


# ---------------------------------------------------------------------------------- LoRA requests
def _lora_policy(base, seed: int, targets=("q_proj", "v_proj", "up_proj"), std: float = 0.3):
    """A LoRA policy over a copy of ``base`` (r 4, alpha 8) whose B is far from 0."""
    import copy

    from reinforge.config import LoraConfig
    from reinforge.learn.lora import wrap_lora

    policy = wrap_lora(copy.deepcopy(base), LoraConfig(enabled=True, r=4, alpha=8, target_modules=list(targets)),
                       seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return policy


def test_lora_ranks_round_up_to_vllms_kernels():
    from reinforge.rollout.vllm_engine import vllm_lora_rank

    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    with pytest.raises(ReinforgeError, match="model.lora.r=513"):
        vllm_lora_rank(513)


def test_a_written_adapter_loads_in_peft_as_the_policy(tmp_path, tiny_model, tiny_tokenizer):
    """write_peft_adapter folds each layer's scale into B (alpha = r): peft reading the directory gives the
    policy's own forward, so vLLM, which reads the same files, is handed the policy."""
    from peft import PeftModel

    from reinforge.learn.lora import adapter_weights
    from reinforge.rollout.vllm_engine import write_peft_adapter

    policy = _lora_policy(tiny_model, seed=1)
    weights = adapter_weights(policy)
    written = write_peft_adapter(weights, tmp_path / "a")
    assert written == weights.nbytes()  # float32 tensors, as sent
    config = __import__("json").loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 4, ["q_proj", "up_proj", "v_proj"])
    import copy

    loaded = PeftModel.from_pretrained(copy.deepcopy(tiny_model), str(tmp_path / "a"))
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        expected, got = policy(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5) and not torch.allclose(got, tiny_model(input_ids=ids).logits,
                                                                         atol=1e-3)
    with pytest.raises(ValueError, match="no layers"):
        write_peft_adapter(type(weights)({}), tmp_path / "b")
