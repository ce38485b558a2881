"""rollout.engine=vllm and rollout.engine=auto.

The first tests run without vLLM (the clear error, weight naming, sampling translation, config
resolution, the auto rule); those that build vLLM are skipped with the reason when it is not
importable (`make install-vllm` installs it) and share one engine over tiny-base (vLLM loads in
about 15 s, its first generate warms up for about 20 s on 2 CPU cores). The picture tests share a second
engine over tiny-vlm, built after the last test of the first; they also need vLLM's LLaVA module to import
(it needs torchvision built for this torch, docs/vision.md) and are skipped with that reason otherwise.
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
from reinforge.rollout.vllm_engine import full_weights, import_vllm, model_positions, vllm_sampling_params
from reinforge.rollout.vllm_pictures import check_expanded, collapse_image_runs, image_limit, vllm_prompt


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


# ---------------------------------------------------------------------------------- pictures, without vLLM
def _picture_requests(processor, n: int) -> list[GenerationRequest]:
    """Held-out shapes prompts (``colour?`` over one 32 x 32 picture) as the collector builds them."""
    from reinforge.data.shapes import shapes_splits
    from reinforge.rollout.vision import vision_request

    return [vision_request(processor, t.prompt, t.images, t.id) for t in shapes_splits().heldout[:n]]


def test_a_picture_prompt_goes_to_vllm_with_one_placeholder_per_picture():
    """The processor's 16 image tokens (32 x 32 pixels in 8 x 8 patches) become one; vLLM's expansion (the
    image token replaced by the picture's 16 features) gives the processor's ids back; text prompts unchanged."""
    from reinforge.models.loading import load_model, load_processor

    config, processor = load_model("tiny-vlm").config, load_processor("tiny-vlm")
    req = _picture_requests(processor, 1)[0]
    token = config.image_token_index
    prompt = vllm_prompt(req, config)
    ids = prompt["prompt_token_ids"]
    assert token == 4 and req.prompt_ids.count(token) == 16 and ids.count(token) == 1
    at = ids.index(token)
    assert ids[:at] + [token] * 16 + ids[at + 1:] == req.prompt_ids
    assert prompt["multi_modal_data"] == {"image": list(req.images)} and req.images[0].mode == "RGB"
    assert vllm_prompt(GenerationRequest([1, 5, 6], "t"), config) == {"prompt_token_ids": [1, 5, 6]}
    assert image_limit(config) == {"image": 1} and model_positions(config) == 128  # the text model's context
    fake = types.SimpleNamespace(SamplingParams=lambda **kw: kw)  # the placeholder is never sampled
    assert vllm_sampling_params(fake, SamplingParams(), seed=0, banned=token)["logit_bias"] == {token: -100.0}


def test_collapsing_image_runs_by_hand():
    s, t, e = 7, 9, 8  # Qwen-VL: <|vision_start|> <|image_pad|> x n <|vision_end|> per picture
    assert collapse_image_runs([1, s, t, t, t, e, 2, s, t, t, e], t, 2) == [1, s, t, e, 2, s, t, e]
    assert collapse_image_runs([1, t, t, t, t, t, t, 2], t, 2) == [1, t, t, 2]  # two adjacent pictures of 3
    with pytest.raises(ReinforgeError, match=r"3 runs of the image token \(9\) for 2 pictures"):
        collapse_image_runs([t, 1, t, 1, t, t], t, 2)


def test_vllm_refuses_pictures_it_cannot_send(tiny_model):
    from PIL import Image

    img = Image.new("RGB", (4, 4))
    llava = types.SimpleNamespace(model_type="llava", vision_config={}, image_token_index=5)
    idefics = types.SimpleNamespace(model_type="idefics3", vision_config={}, image_token_id=5)
    req = GenerationRequest([1, 5, 5, 2], "r", {"pixel_values": torch.zeros(1, 3, 4, 4)}, images=(img,))
    with pytest.raises(ReinforgeError, match=r"does not send pictures to idefics3 models.*use rollout.engine=torch"):
        vllm_prompt(req, idefics)
    with pytest.raises(ReinforgeError, match="has 2 pictures; llava takes at most 1 a prompt"):
        vllm_prompt(GenerationRequest(req.prompt_ids, "r", images=(img, img)), llava)
    with pytest.raises(ReinforgeError, match=r"model inputs \(\['pixel_values'\]\) but no pictures"):
        vllm_prompt(GenerationRequest(req.prompt_ids, "r", req.model_inputs), llava)
    with pytest.raises(ReinforgeError, match=r"has pictures but the model \(llama\) takes none"):
        vllm_prompt(req, tiny_model.config)
    check_expanded(req, [1, 5, 5, 2])  # vLLM expanded the pictures to the processor's ids
    check_expanded(GenerationRequest([1, 2], "text"), [1, 2, 3])  # text prompts are not checked
    with pytest.raises(ReinforgeError, match="expanded request 'r'.* to 5 prompt tokens, not the 4"):
        check_expanded(req, [1, 5, 5, 5, 2])
    qwen = types.SimpleNamespace(model_type="qwen2_vl", vision_config={})
    assert image_limit(qwen) == {"image": 8} and image_limit(idefics) is None and image_limit(tiny_model.config) is None


# ---------------------------------------------------------------------------------- with vLLM
VLLM_OK, VLLM_WHY = _vllm_importable()
needs_vllm = pytest.mark.skipif(not VLLM_OK, reason=VLLM_WHY)


def _vllm_vision_importable() -> tuple[bool, str]:
    if not VLLM_OK:
        return False, VLLM_WHY
    try:
        importlib.import_module("vllm.model_executor.models.llava")
    except Exception as e:  # noqa: BLE001 - a missing dependency is a reason to skip, shown as such
        return False, f"vLLM's LLaVA module does not import ({type(e).__name__}: {e}); docs/vision.md"
    return True, ""


VISION_OK, VISION_WHY = _vllm_vision_importable()
needs_vllm_vision = pytest.mark.skipif(not VISION_OK, reason=VISION_WHY)


def _requests(tokenizer, n=12):
    tasks = list(arithmetic_splits().heldout)[:n]
    return [GenerationRequest(encode_prompt(tokenizer, t.prompt), t.id) for t in tasks]


def _learner_logprobs(model, gens, pad_id: int, temperature: float, model_inputs=None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(learner log-probs, sampler log-probs, mask) over the completions, right-padded; ``model_inputs``: the
    rows' pictures (``pixel_values`` stacked in the completions' order)."""
    ids = [g.prompt_ids + g.token_ids for g in gens]
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), pad_id)
    attn, sampled, mask = torch.zeros_like(input_ids), torch.zeros(len(ids), width), torch.zeros(len(ids), width)
    for i, (g, row) in enumerate(zip(gens, ids, strict=True)):
        input_ids[i, : len(row)], attn[i, : len(row)] = torch.tensor(row), 1
        p = len(g.prompt_ids)
        sampled[i, p : len(row)], mask[i, p : len(row)] = torch.tensor(g.logprobs), 1
    with torch.no_grad():
        logp, _ = token_logprobs(model, input_ids, attn, temperature, model_inputs=model_inputs)
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


# ---------------------------------------------------------------------------------- pictures through vLLM
@pytest.fixture(scope="module")
def vlm_engine():
    """vLLM over tiny-vlm with its processor. Built when the first picture test runs, after every test of
    ``vllm_engine`` (one engine in use at a time in a process: see ``vllm_engine``)."""
    from reinforge.models.loading import load_model, load_processor, load_tokenizer
    from reinforge.rollout.vllm_engine import VLLMRolloutEngine

    return VLLMRolloutEngine(load_model("tiny-vlm"), load_tokenizer("tiny-vlm"), seed=0,
                             processor=load_processor("tiny-vlm"))


def _pixels(gens, reqs) -> dict[str, torch.Tensor]:
    by_id = {r.request_id: r.model_inputs["pixel_values"] for r in reqs}
    return {"pixel_values": torch.cat([by_id[g.request_id] for g in gens])}


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return torch.where(mask > 0, (a - b).abs(), 0.0).max().item()


def _placeholder_banned(model, gens, pad_id: int, temperature: float, model_inputs) -> tuple[torch.Tensor, float]:
    """The completions' log-probs under softmax(z / T) without the image placeholder (the engines' distribution),
    and the largest gap to the learner's plain softmax over the completions, -log(1 - p(placeholder))."""
    token = model.config.image_token_index
    ids = [g.prompt_ids + g.token_ids for g in gens]
    x = torch.full((len(ids), max(map(len, ids))), pad_id)
    attn = torch.zeros_like(x)
    for i, row in enumerate(ids):
        x[i, : len(row)], attn[i, : len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        z = model(input_ids=x, attention_mask=attn, **model_inputs).logits.float()[:, :-1] / temperature
    banned = torch.zeros(x.shape)
    banned[:, 1:] = torch.log_softmax(z.index_fill(-1, torch.tensor([token]), float("-inf")), -1).gather(
        -1, x[:, 1:, None])[..., 0]
    gap = -torch.log1p(-torch.softmax(z, -1)[..., token])
    completion = torch.zeros(x.shape[0], x.shape[1] - 1, dtype=torch.bool)
    for i, g in enumerate(gens):
        completion[i, len(g.prompt_ids) - 1 : len(ids[i]) - 1] = True
    return banned, gap[completion].max().item()


@needs_vllm_vision
@pytest.mark.slow
def test_vllm_with_pictures_matches_the_torch_engine_and_the_learner(vlm_engine):
    """Prompts with pictures: greedy tokens equal the torch engine's; sampled log-probs equal the learner's
    forward with the same pictures; vLLM's expanded prompt is the processor's."""
    from reinforge.models.loading import load_model
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    model, processor = load_model("tiny-vlm").eval(), vlm_engine.processor
    reqs, greedy = _picture_requests(processor, 6), SamplingParams(max_new_tokens=8, greedy=True)
    ours = vlm_engine.generate(reqs, greedy)
    torch_engine = TorchRolloutEngine(load_model("tiny-vlm"), processor.tokenizer)
    assert [g.token_ids for g in ours] == [g.token_ids for g in torch_engine.generate(reqs, greedy)]
    for temperature in (1.0, 0.7):
        gens = vlm_engine.generate(reqs, SamplingParams(max_new_tokens=8, n=3, temperature=temperature))
        assert len(gens) == 18 and all(g.prompt_ids == reqs[i // 3].prompt_ids for i, g in enumerate(gens))
        pad, pixels = processor.tokenizer.pad_token_id, _pixels(gens, reqs)
        logp, sampled, mask = _learner_logprobs(model, gens, pad, temperature, pixels)
        banned, gap = _placeholder_banned(model, gens, pad, temperature, pixels)
        # the engines' distribution (the placeholder never sampled) to float precision; the learner's softmax
        # still counts the placeholder: a gap of -log(1 - p(placeholder)) (docs/vision.md), 5.3e-4 at most here
        assert mask.sum() > 18 and _max_diff(banned, sampled, mask) < 1e-4, _max_diff(banned, sampled, mask)
        assert _max_diff(logp, sampled, mask) < gap + 1e-4, (_max_diff(logp, sampled, mask), gap)
    torch.manual_seed(0)  # new weights, the vision tower's too: the same pictures' cached encoder outputs are stale
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    vlm_engine.update_weights(dict(model.named_parameters()), 1)
    gens = vlm_engine.generate(reqs, SamplingParams(max_new_tokens=8, n=3))
    _, sampled, mask = _learner_logprobs(model, gens, processor.tokenizer.pad_token_id, 1.0, _pixels(gens, reqs))
    banned, _ = _placeholder_banned(model, gens, processor.tokenizer.pad_token_id, 1.0, _pixels(gens, reqs))
    assert _max_diff(banned, sampled, mask) < 1e-4 and all(g.version == 1 for g in gens)


@needs_vllm_vision
@pytest.mark.slow
def test_vllm_gives_each_picture_of_a_batch_its_own_answer(vlm_engine):
    """Two prompts with the same tokens and different pictures in one batch: each completion equals its prompt's
    alone, and its log-probs are the learner's under its own picture, not the other's."""
    from reinforge.models.loading import load_model

    model, processor = load_model("tiny-vlm").eval(), vlm_engine.processor
    vlm_engine.update_weights(model, 0)  # tiny-vlm as shipped (an earlier test moved the weights)
    reqs = _picture_requests(processor, 12)
    a = reqs[0]
    b = next(r for r in reqs[1:] if list(r.images[0].getdata()) != list(a.images[0].getdata()))
    assert a.prompt_ids == b.prompt_ids  # the same question: only the picture differs
    params = SamplingParams(max_new_tokens=6, greedy=True)
    alone = [vlm_engine.generate([r], params)[0] for r in (a, b)]
    both = vlm_engine.generate([a, b], params)
    assert [g.token_ids for g in both] == [g.token_ids for g in alone]
    for g, h in zip(both, alone, strict=True):
        assert max(abs(x - y) for x, y in zip(g.logprobs, h.logprobs, strict=True)) < 1e-5
    pad = processor.tokenizer.pad_token_id
    _, sampled, mask = _learner_logprobs(model, both, pad, 1.0, _pixels(both, [a, b]))
    own, _ = _placeholder_banned(model, both, pad, 1.0, _pixels(both, [a, b]))
    swapped, _ = _placeholder_banned(model, both, pad, 1.0, _pixels(both[::-1], [a, b]))
    assert _max_diff(own, sampled, mask) < 1e-4
    assert _max_diff(swapped, sampled, mask) > 1e-3  # the other picture gives other log-probs


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


@needs_vllm_vision
@pytest.mark.slow
def test_grpo_on_pictures_through_vllm(tmp_path):
    """The vlm_colour recipe, shortened, with rollout.engine=vllm: the collector encodes the pictures with the
    engine's processor, vLLM samples them, the learner's log-probs agree (weights synced every step)."""
    import gc

    from reinforge.orchestrate.run import train

    gc.collect()  # an earlier test's engine, finalised during this one, would tear down vLLM's parallel state
    result = train(load_config("vlm_colour", [
        f"output_dir={tmp_path}", "rollout.engine=vllm", "train.steps=2", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "task.heldout_size=8", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0",
        "log.report=false", "train.time_limit_s=0", "algo.skip_equal_reward_groups=false"]))
    steps = [m for m in result.metrics() if "train/loss" in m]
    # the learner's softmax counts the placeholder the engines never sample: a gap of -log(1 - p(placeholder))
    # (docs/vision.md), 5.4e-4 here and up to 1.04e-3 over 128 samples of tiny-vlm at T = 1; vLLM's log-probs
    # equal the placeholder-free softmax to 6e-6 (the tests above); a stale or another picture differs by 0.1 to 5
    assert len(steps) == 2 and max(m["train/logprob_mismatch_max"] for m in steps) < 2e-3


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
