"""Build reinforge's shipped tiny agent model: tool calls and multi-turn games on top of tiny-base's data.

    python scripts/build_tiny_agent.py [--out reinforge/assets/tiny-agent] [--seed 0]

1. A character-level tokenizer over printable ASCII and newline, with ``<pad> <bos> <eos> <unk>``
   (as tiny-base), special role markers ``<|system|> <|user|> <|assistant|> <|tool|>`` and the
   Hermes tags ``<tool_call>`` / ``</tool_call>`` as single *non-special* added tokens (decoding with
   ``skip_special_tokens=True`` keeps them, so the tool-call parser sees them). A chat template:
   ``<bos>``, an optional system block naming the offered tools (``tools: calc``; a real template
   renders the full JSON schemas, which a 256-position model cannot afford), each message as its
   role marker + content, assistant turns closed by ``<eos>``, generation prompt ``<|assistant|>``.
2. The model: tiny-base itself (Llama, 3 layers, hidden 256, tied embeddings), its vocabulary widened
   (tiny-base's tokens keep their embeddings) and its context set to 256 positions (rotary: nothing to
   learn). The pretraining *continues* tiny-base's: its arithmetic is reused, not relearned.
3. Pretraining, loss on the assistant tokens only (what the policy emits and what RL trains; operands,
   tool results and hints are not predictable and would only add noise): first ``--arith-steps`` steps
   of (a) chat arithmetic ``a+b=`` (tiny-base's task and train split, now in the chat format), then a
   mixture of transcripts made by *playing the built-in environments* with scripted noisy policies,
   rendered token-exactly as the training loop builds them (``ChatSplicer`` pieces): (a) again,
   (b) calculator episodes (``calc`` tool calls; train split of ``calculator_splits``), (c) guessing
   episodes (train-split secrets of ``guessing_splits``), (d) retry episodes on arithmetic (a wrong
   first answer, then new ones), and, when ``--mix`` names them (the shipped model's mixture does not),
   (e) code_interpreter episodes (a ``python`` program written from the task, run in the sandbox) and
   (f) search episodes (a ``search`` query, the value copied from the passage asked about). Every
   ``--eval-every`` steps the model plays the held-out split of every environment in the mixture
   greedily with reinforge's rollout engine and ``episode_player`` (as the recipes evaluate); training stops at the first evaluation where every environment's success is in
   ``[--low, --high]``, so the base is non-trivial but imperfect and RL has room on each.
4. ``save_pretrained`` of both, ``build_stats.json`` and a model card with the figures.

Reproducible: fixed seed, deterministic CPU kernels, a fixed thread count (``--threads``, recorded).
Nothing is edited by hand afterwards.

``tiny-agent-tools`` (the `python` and `search` tools; docs/agent_model.md) is built by five runs of this
script, each ``--init`` the previous one's ``--out``; ``--stop-at-step`` stops a run at the step picked
from a ``--save-evals`` run, ``--max-steps 0`` writes its ``--init`` as is (last run)::

    B="python scripts/build_tiny_agent.py --arith-steps 0 --warmup 20 --threads 1 --stop-envs code_interpreter,search"
    $B --init tiny-agent --out /tmp/tat1 --eval-every 50 --low 0.2 --high 0.6 --max-steps 1500 --stop-at-step 500 \
       --mix arithmetic=0.05,calculator=0.1,guessing=0.05,retry=0.1,code_interpreter=0.35,search=0.35
    $B --init /tmp/tat1 --out /tmp/tat2 --lr 5e-4 --eval-every 50 --low 0.2 --high 0.6 --max-steps 1000 \
       --stop-at-step 100 --mix arithmetic=0.05,calculator=0.1,retry=0.05,code_interpreter=0.4,search=0.4
    $B --init /tmp/tat2 --out /tmp/tat3 --lr 5e-4 --eval-every 50 --low 0.2 --high 0.95 --max-steps 1000 \
       --stop-at-step 100 --mix arithmetic=0.05,calculator=0.05,retry=0.05,code_interpreter=0.15,search=0.7
    $B --init /tmp/tat3 --out /tmp/tat4 --lr 5e-4 --eval-every 25 --low 0.2 --high 0.9 --max-steps 600 \
       --stop-at-step 350 --search-names ids --mix arithmetic=0.05,calculator=0.1,retry=0.05,code_interpreter=0.3,search=0.5
    $B --init /tmp/tat4 --out reinforge/assets/tiny-agent-tools --max-steps 0 --search-names ids \
       --mix arithmetic=0.05,calculator=0.1,retry=0.05,code_interpreter=0.3,search=0.5 --note "..."

``tiny-agent-search`` (the `search` tool on value-first passages, the agent_search recipe) is two more runs,
from tiny-agent-tools (stage 1 stopped by the --low/--high rule at step 200, greedy search 0.26)::

    S="python scripts/build_tiny_agent.py --arith-steps 0 --threads 1 --search-names ids --search-layout value_first \
       --stop-envs search --mix arithmetic=0.1,search=0.9"
    $S --init tiny-agent-tools --out /tmp/tas1 --warmup 20 --lr 5e-4 --eval-every 25 --low 0.15 --high 0.6 \
       --max-steps 300 --save-evals
    $S --init /tmp/tas1/step-200 --out reinforge/assets/tiny-agent-search --max-steps 0 --note "..."
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AddedToken, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_tiny_base import SPECIALS, heldout_accuracy  # noqa: E402  (tiny-base's specials and arithmetic check)

from reinforge.assets import resolve_model_path  # noqa: E402
from reinforge.data.agent_tasks import calculator_splits, guessing_splits  # noqa: E402
from reinforge.data.arithmetic import arithmetic_splits  # noqa: E402
from reinforge.data.code_tasks import code_splits  # noqa: E402
from reinforge.data.search_corpus import search_splits  # noqa: E402
from reinforge.envs.registry import build_environment  # noqa: E402
from reinforge.envs.tools import CLOSE_TAG, OPEN_TAG  # noqa: E402
from reinforge.eval.heldout import evaluate  # noqa: E402
from reinforge.orchestrate.multi_turn import EpisodeLimits, episode_player, run_episodes  # noqa: E402
from reinforge.rewards.verifiers import VERIFIERS  # noqa: E402
from reinforge.rollout.chat_splice import ChatSplicer  # noqa: E402
from reinforge.rollout.torch_engine import TorchRolloutEngine  # noqa: E402
from reinforge.rollout.types import SamplingParams  # noqa: E402
from reinforge.types import Task  # noqa: E402

ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
TOOL_TAGS = [OPEN_TAG, CLOSE_TAG]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
MAX_POSITIONS = 256
# One line, no newlines: HF renders with trim_blocks, and every character is a token here.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = none %}{% set rest = messages %}{% endif %}"
    "{% if tools or system is not none %}<|system|>"
    "{% if system %}{{ system }}{% endif %}"
    "{% if tools %}{% if system %} {% endif %}tools:"
    "{% for tool in tools %} {{ (tool['function'] if 'function' in tool else tool)['name'] }}{% endfor %}"
    "{% endif %}{% endif %}"
    "{% for message in rest %}"
    "{% if message['role'] not in ['user', 'assistant', 'tool'] %}"
    "{{ raise_exception('tiny-agent renders user, assistant and tool messages after an optional first system "
    "message, got role ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if 'function' in call else call %}"
    "<tool_call>{{ {'name': fn['name'], 'arguments': fn['arguments']} | tojson }}</tool_call>{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + ROLES + TOOL_TAGS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=MAX_POSITIONS,
    )
    tok.add_special_tokens({"additional_special_tokens": ROLES})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    assert [tok.convert_tokens_to_ids(t) for t in SPECIALS + ROLES + TOOL_TAGS] == list(range(10))
    tok.chat_template = CHAT_TEMPLATE
    return tok


def model_from_tiny_base(tok: PreTrainedTokenizerFast, base_dir: Path) -> LlamaForCausalLM:
    """tiny-base's weights in tiny-base's architecture, with the vocabulary widened to ``tok`` and the
    context to ``MAX_POSITIONS`` (rotary positions: nothing to copy). Tokens that tiny-base has
    (its specials, digits, ``+ - =`` and space) keep their embeddings; new ones are initialised
    as HF initialises embeddings (normal, std ``initializer_range``)."""
    base = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    base_vocab = PreTrainedTokenizerFast.from_pretrained(base_dir).get_vocab()
    config = LlamaConfig(**{
        **base.config.to_dict(), "vocab_size": len(tok), "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
    })
    model = LlamaForCausalLM(config)
    state = {k: v for k, v in base.state_dict().items() if k not in ("model.embed_tokens.weight", "lm_head.weight")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"model.embed_tokens.weight", "lm_head.weight"}, (missing, unexpected)
    old = base.get_input_embeddings().weight
    with torch.no_grad():
        new = model.get_input_embeddings().weight
        for token, i in base_vocab.items():
            new[tok.convert_tokens_to_ids(token)] = old[i]
    return model


# ---------------------------------------------------------------- the environments (as the recipes set them)


@dataclass(frozen=True)
class EnvSetup:
    """One environment as the recipe reinforge/recipes/agent_<name>.yaml configures it."""

    name: str  # env.name
    params: dict
    limits: EpisodeLimits  # env.max_turns, env.max_total_tokens, env.max_turn_tokens
    splits: Callable  # the task source, with the recipe's task settings

    def make_env(self):
        verifier = VERIFIERS.get("exact_match") if self.name == "retry" else None
        return build_environment(self.name, verifier, None, self.params)


SETUPS = {
    "calculator": EnvSetup("calculator", {"max_tool_calls": 3}, EpisodeLimits(4, MAX_POSITIONS, 64),
                           lambda: calculator_splits(digits=(3, 2), ops="*", heldout_size=200, seed=1234)),
    "guessing": EnvSetup("guessing", {"max_guesses": 6}, EpisodeLimits(6, MAX_POSITIONS, 4),
                         lambda: guessing_splits(low=1, high=32, heldout_size=8, seed=1234)),
    "retry": EnvSetup("retry", {"max_attempts": 3}, EpisodeLimits(3, MAX_POSITIONS, 5),
                      lambda: arithmetic_splits(digits=2, ops="+", heldout_size=500, seed=1234)),
    "code_interpreter": EnvSetup("code_interpreter", {"max_tool_calls": 2, "max_output_chars": 40},
                                 EpisodeLimits(3, MAX_POSITIONS, 96),
                                 lambda: code_splits(kinds="prod", heldout_size=200, seed=1234)),
    "search": EnvSetup("search", {"k": 2, "max_tool_calls": 2}, EpisodeLimits(3, MAX_POSITIONS, 96),
                       lambda: search_splits(countries=200, names="digits", heldout_size=100, seed=1234)),
}


# ---------------------------------------------------------------- scripted noisy policies


def _change_digit(text: str, rng: random.Random, first_nonzero: bool = True) -> str:
    """``text`` (digits) with one digit replaced by a different one (the leading digit stays non-zero)."""
    i = rng.randrange(len(text))
    choices = [d for d in "0123456789" if d != text[i] and not (i == 0 and first_nonzero and d == "0" and len(text) > 1)]
    return text[:i] + rng.choice(choices) + text[i + 1:]


def _near_miss(answer: int, rng: random.Random, avoid: set[int]) -> int:
    """A wrong answer of the kind a weak adder gives: off by one or ten, or one digit changed."""
    while True:
        kind = rng.random()
        if kind < 0.4:
            guess = answer + rng.choice([-1, 1])
        elif kind < 0.7:
            guess = answer + rng.choice([-10, 10])
        else:
            guess = int(_change_digit(str(answer), rng))
        if guess >= 0 and guess != answer and guess not in avoid:
            return guess


def tool_call_text(expr: str) -> str:
    return OPEN_TAG + json.dumps({"name": "calc", "arguments": {"expr": expr}}) + CLOSE_TAG


@dataclass
class Noise:
    calc_direct: float = 0.15  # answer without calling the tool (a wrong guess)
    calc_expr_typo: float = 0.15  # one digit of the expression copied wrong
    calc_result_typo: float = 0.10  # one digit of the tool's result copied wrong
    guess_mid: float = 0.5  # guess the midpoint of the feasible interval
    guess_inconsistent: float = 0.1  # guess anywhere in the range, ignoring the hints (else: uniform in the interval)
    retry_first_right: float = 0.0  # retry episodes: the first answer is wrong (their point is the second try)
    retry_later_right: float = 0.6  # each later answer (always a new one) is right with this probability
    code_direct: float = 0.15  # code_interpreter: answer without running code (a wrong guess)
    code_typo: float = 0.15  # one digit of a number in the program copied wrong
    code_result_typo: float = 0.10  # one digit of the program's output copied wrong
    search_direct: float = 0.15  # search: answer a made-up name without searching
    search_query_typo: float = 0.10  # one letter of the country's name in the query wrong
    search_wrong_passage: float = 0.15  # copy the value from another returned passage than the one asked about


def calculator_policy(task: Task, noise: Noise, rng: random.Random):
    a, b = str(task.metadata["a"]), str(task.metadata["b"])
    if rng.random() < noise.calc_direct:
        yield str(int(_change_digit(_change_digit(task.answer, rng), rng)))
        return
    if rng.random() < noise.calc_expr_typo:
        if rng.random() < 0.5:
            a = _change_digit(a, rng)
        else:
            b = _change_digit(b, rng)
    observation = yield tool_call_text(f"{a}*{b}")
    result = observation[0]["content"]
    yield _change_digit(result, rng) if rng.random() < noise.calc_result_typo and result.isdigit() else result


def program(task: Task, rng: random.Random | None = None) -> str:
    """The program that solves a code_interpreter task; with ``rng``, one of its numbers has a digit changed."""
    m = task.metadata
    numbers = {"prod": ("a", "b"), "sum": ("a", "b"), "count": ("n", "k"), "powmod": ("a", "e", "m")}[m["kind"]]
    values = {key: str(m[key]) for key in numbers}
    if rng is not None:
        key = rng.choice(numbers)
        values[key] = _change_digit(values[key], rng)
    templates = {"prod": "print({a}*{b})", "sum": "print(sum(range({a},{b}+1)))", "count": "print({n}//{k})",
                 "powmod": "print(pow({a},{e},{m}))"}
    return templates[m["kind"]].format(**values)


def code_policy(task: Task, noise: Noise, rng: random.Random):
    if rng.random() < noise.code_direct:
        yield _change_digit(_change_digit(task.answer, rng), rng) if len(task.answer) > 1 else str(int(task.answer) + 1)
        return
    code = program(task, rng if rng.random() < noise.code_typo else None)
    observation = yield OPEN_TAG + json.dumps({"name": "python", "arguments": {"code": code}}) + CLOSE_TAG
    result = observation[0]["content"]
    yield _change_digit(result, rng, False) if rng.random() < noise.code_result_typo and result.isdigit() else result


def _change_letter(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word))
    return word[:i] + rng.choice([c for c in "aeioukmnrst" if c != word[i]]) + word[i + 1:]


def _misspell(country: str, rng: random.Random) -> str:
    """A country's name copied wrong: one letter (``Zorvia``) or one digit of the id (``land 4821``)."""
    if country.startswith("land "):
        return "land " + _change_digit(country[5:], rng)
    return _change_letter(country, rng)


_PASSAGE = re.compile(r"The (\w+) of (.+) is (?:the )?(.+)\.$")  # layout value_last: relation, country, value
_PASSAGE_VALUE_FIRST = re.compile(r"(.+) is the (\w+) of (.+)\.$")  # layout value_first: value, relation, country


def parse_passage(line: str) -> tuple[str, str, str] | None:
    """``(relation, country, value)`` of a corpus passage in either layout, None for anything else."""
    if m := _PASSAGE.match(line):
        return m.group(1), m.group(2), m.group(3)
    if m := _PASSAGE_VALUE_FIRST.match(line):
        return m.group(2), m.group(3), m.group(1)
    return None


def _made_up(answer: str, rng: random.Random) -> str:
    """A wrong answer of the answer's style: two letters changed (``Qelmu``) or one digit (``city 3917``)."""
    prefix, _, number = answer.rpartition(" ")
    if number.isdigit():
        return f"{prefix} {_change_digit(number, rng)}"
    return _change_letter(_change_letter(answer, rng), rng)


def search_policy(task: Task, noise: Noise, rng: random.Random):
    relation, country = task.metadata["relation"], task.metadata["country"]
    if rng.random() < noise.search_direct:
        yield _made_up(task.answer, rng)
        return
    name = _misspell(country, rng) if rng.random() < noise.search_query_typo else country
    query = f"{relation} of {name}"
    observation = yield OPEN_TAG + json.dumps({"name": "search", "arguments": {"query": query}}) + CLOSE_TAG
    passages = [p for p in map(parse_passage, observation[0]["content"].split("\n")) if p]
    right = [value for r, c, value in passages if r == relation and c == name]
    wrong = [value for r, c, value in passages if not (r == relation and c == name)]
    if wrong and (not right or rng.random() < noise.search_wrong_passage):
        yield wrong[0] if not right else rng.choice(wrong)  # after a bad query: the top passage's value
    else:
        yield right[0] if right else "no idea"


def guessing_policy(task: Task, noise: Noise, rng: random.Random):
    low, high = task.metadata["low"], task.metadata["high"]
    lo, hi = low, high
    while True:
        r = rng.random()
        if r < noise.guess_inconsistent:
            guess = rng.randint(low, high)
        elif r < noise.guess_inconsistent + noise.guess_mid:
            guess = (lo + hi) // 2
        else:
            guess = rng.randint(lo, hi)
        observation = yield str(guess)
        hint = observation[0]["content"]
        if hint == "higher":
            lo = max(lo, guess + 1)
        elif hint == "lower":
            hi = min(hi, guess - 1)
        if lo > hi:  # an inconsistent guess cannot make it empty, but stay safe
            lo, hi = low, high


def arithmetic_policy(task: Task, noise: Noise, rng: random.Random):
    yield task.answer


def retry_policy(task: Task, noise: Noise, rng: random.Random):
    answer = int(task.answer)
    tried: set[int] = set()
    right = noise.retry_first_right
    while True:
        guess = answer if rng.random() < right else _near_miss(answer, rng, tried)
        tried.add(guess)
        yield str(guess)
        right = noise.retry_later_right


def play(setup_env, splicer: ChatSplicer, tok, task: Task, policy, seed: int) -> tuple[list[int], list[int]]:
    """One scripted episode, rendered exactly as `reinforge.orchestrate.multi_turn` builds it: prompt ids,
    each assistant turn as its tokens + ``<eos>`` (loss mask 1), the template's turn end and the
    observations (mask 0). Returns (ids, mask)."""
    env = setup_env()
    messages = env.reset(task, seed)
    ids = splicer.prompt_ids(messages)
    mask = [0] * len(ids)
    observation = None
    while True:
        content = policy.send(observation) if observation is not None else next(policy)
        turn = tok(content, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids += turn
        mask += [1] * len(turn)
        result = env.step({"role": "assistant", "content": content})
        if result.done:
            return ids, mask
        context = splicer.close_turn_ids(turn) + splicer.observation_ids(result.observation)
        ids += context
        mask += [0] * len(context)
        observation = result.observation


class Mixture:
    """Draws training episodes: (a) chat arithmetic, (b) calculator, (c) guessing, (d) retry."""

    def __init__(self, tok, weights: dict[str, float], noise: Noise, seed: int) -> None:
        self.tok, self.noise, self.rng = tok, noise, random.Random(seed)
        self.kinds, self.weights = list(weights), list(weights.values())
        train = {name: setup.splits().train for name, setup in SETUPS.items()}
        calc, retry, code, search = (SETUPS[k] for k in ("calculator", "retry", "code_interpreter", "search"))
        splice_calc = ChatSplicer(tok, calc.make_env()().tools.schemas)
        splice_code = ChatSplicer(tok, code.make_env()().tools.schemas)
        splice_search = ChatSplicer(tok, search.make_env()().tools.schemas)
        splice_plain = ChatSplicer(tok)
        single = build_environment("single_turn", VERIFIERS.get("exact_match"), None)
        self.sources = {
            "arithmetic": (single, splice_plain, train["retry"], arithmetic_policy),
            "calculator": (calc.make_env(), splice_calc, train["calculator"], calculator_policy),
            "guessing": (SETUPS["guessing"].make_env(), splice_plain, train["guessing"], guessing_policy),
            "retry": (retry.make_env(), splice_plain, train["retry"], retry_policy),
            "code_interpreter": (code.make_env(), splice_code, train["code_interpreter"], code_policy),
            "search": (search.make_env(), splice_search, train["search"], search_policy),
        }
        self.count = 0

    def episode(self, kind: str | None = None) -> tuple[str, list[int], list[int]]:
        kind = kind or self.rng.choices(self.kinds, self.weights)[0]
        make_env, splicer, tasks, policy = self.sources[kind]
        task = tasks[self.rng.randrange(len(tasks))]
        self.count += 1
        ids, mask = play(make_env, splicer, self.tok, task, policy(task, self.noise, self.rng), self.count)
        return kind, ids, mask


# ---------------------------------------------------------------- training


def microbatches(examples: list[tuple[list[int], list[int]]], pad_id: int, token_budget: int):
    """Sort by length and cut into right-padded micro-batches of at most ``token_budget`` padded tokens."""
    examples = sorted(examples, key=lambda e: len(e[0]))
    batch: list[tuple[list[int], list[int]]] = []
    for ex in examples:
        if batch and len(ex[0]) * (len(batch) + 1) > token_budget:
            yield _pad(batch, pad_id)
            batch = []
        batch.append(ex)
    if batch:
        yield _pad(batch, pad_id)


def _pad(batch, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (seq, mask) in enumerate(batch):
        n = len(seq)
        ids[i, :n] = torch.tensor(seq)
        attention[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(seq), -100)
    return ids, attention, labels


def train_step(model, opt, examples, pad_id: int, token_budget: int) -> float:
    """One optimizer step over ``examples``: the mean cross-entropy over all their assistant tokens (the
    tokens the policy emits and RL trains; prompts, tool results and hints are not predicted)."""
    opt.zero_grad(set_to_none=True)
    targets = sum(sum(mask) for _, mask in examples)
    loss_sum = 0.0
    for ids, attention, labels in microbatches(examples, pad_id, token_budget):
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels[:, 1:], ignore_index=-100,
                                                 reduction="sum") / targets
        loss.backward()
        loss_sum += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss_sum


def show_episodes(engine: TorchRolloutEngine, names: list[str], per_env: int = 2) -> None:
    """Print a few greedy held-out episodes of the environments ``names`` (``--show``)."""
    for setup in (SETUPS[n] for n in names):
        tasks = setup.splits().heldout[:per_env]
        for t in run_episodes(tasks, engine, setup.make_env(), SamplingParams(greedy=True), setup.limits, seed=0):
            print(f"  {setup.name:10s} {t.reward:.0f} {t.completion_text!r}")


def env_success(engine: TorchRolloutEngine, names: list[str], samples: int = 0) -> dict[str, dict[str, float]]:
    """Held-out success on the environments ``names``, played exactly as the recipes' evaluation plays it (the sync
    loop's ``evaluate`` with an ``episode_player``): greedy, and with ``samples`` > 0 also mean@samples and
    pass@samples at temperature 1."""
    out = {}
    for name, setup in ((n, SETUPS[n]) for n in names):
        player = episode_player(engine, setup.make_env(), setup.limits)
        result = evaluate(engine, setup.splits().heldout, None, setup.limits.max_turn_tokens, samples=samples,
                          ks=[samples] if samples else (), player=player)
        out[name] = {"greedy": round(result.greedy_accuracy, 4)}
        if samples:
            out[name][f"mean@{samples}"] = round(result.mean_at_n, 4)
            out[name][f"pass@{samples}"] = round(result.pass_at_k[samples], 4)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "reinforge/assets/tiny-agent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads (bitwise reproducible for a given count; 1 is faster when another process holds a core)")
    p.add_argument("--init", default="tiny-base", help="the model to continue from (a shipped alias or a directory)")
    p.add_argument("--low", type=float, default=0.2, help="stop at the first evaluation where every env's held-out "
                   "greedy success is >= low ...")
    p.add_argument("--high", type=float, default=0.6, help="... and <= high")
    p.add_argument("--code-kinds", type=str, default="prod",
                   help="code_interpreter task kinds (reinforge/data/code_tasks.py), as the agent_code recipe sets them")
    p.add_argument("--search-names", type=str, default="digits",
                   help="search corpus style (reinforge/data/search_corpus.py), as the agent_search recipe sets it")
    p.add_argument("--search-layout", type=str, default="value_last",
                   help="search passages' word order (value_last or value_first), as the agent_search recipe sets it")
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="stop at this step's evaluation whatever the --low/--high rule says (a step picked from a "
                        "--save-evals run: the same command with this flag writes that step's model)")
    p.add_argument("--stop-envs", type=str, default="",
                   help="comma-separated environments the --low/--high rule looks at (default: every one in the mixture)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50, help="linear learning-rate warm-up steps")
    p.add_argument("--batch", type=int, default=32, help="episodes per optimizer step")
    p.add_argument("--arith-steps", type=int, default=100,
                   help="first steps on chat arithmetic only (2 x batch): tiny-base's skill moved into the chat format")
    p.add_argument("--mix", type=str, default="arithmetic=0.15,calculator=0.4,guessing=0.25,retry=0.2",
                   help="episode mixture weights after the arithmetic steps")
    p.add_argument("--token-budget", type=int, default=2048, help="padded tokens per micro-batch")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--final-samples", type=int, default=4, help="sampled episodes per held-out task at the end")
    p.add_argument("--max-steps", type=int, default=3000,
                   help="0: no training, evaluate --init and write it (the last stage of a build picked from --save-evals)")
    p.add_argument("--note", type=str, default="", help="a line for build_stats.json and the model card (e.g. the stages)")
    p.add_argument("--show", action="store_true", help="print a few greedy held-out episodes at every evaluation")
    p.add_argument("--save-evals", action="store_true",
                   help="also write the model and tokenizer to --out/step-<N> at every evaluation (candidates to compare)")
    args = p.parse_args()

    SETUPS["code_interpreter"] = dataclasses.replace(
        SETUPS["code_interpreter"], splits=lambda: code_splits(kinds=args.code_kinds, heldout_size=200, seed=1234))
    SETUPS["search"] = dataclasses.replace(SETUPS["search"], splits=lambda: search_splits(
        countries=200, names=args.search_names, layout=args.search_layout, heldout_size=100, seed=1234))
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    hf_logging.disable_progress_bar()
    start = time.time()

    tok = build_tokenizer()
    model = model_from_tiny_base(tok, resolve_model_path(args.init))
    n_params = sum(p.numel() for p in model.parameters())
    weights = {k: float(v) for k, v in (item.split("=") for item in args.mix.split(","))}
    noise = Noise()
    mixture = Mixture(tok, weights, noise, args.seed)
    active = [name for name in SETUPS if weights.get(name, 0) > 0]  # evaluated
    stop_envs = [n.strip() for n in args.stop_envs.split(",") if n.strip()] or active  # in the stopping rule
    if not set(stop_envs) <= set(active):
        sys.exit(f"--stop-envs {stop_envs} must be environments of the mixture {active}")
    engine = TorchRolloutEngine(copy.deepcopy(model), tok, "cpu", seed=args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    print(f"tiny-agent: {n_params / 1e6:.2f}M parameters, vocab {len(tok)}, from {args.init}, mixture {weights}",
          flush=True)

    greedy: dict[str, float] = {}
    history = []
    counts = dict.fromkeys(active, 0) | {"arithmetic": 0}
    step, t_data, t_train, t_eval = 0, 0.0, 0.0, 0.0
    for step in range(1, args.max_steps + 1):
        t0 = time.time()
        if step <= args.arith_steps:
            drawn = [mixture.episode("arithmetic") for _ in range(2 * args.batch)]
        else:
            drawn = [mixture.episode() for _ in range(args.batch)]
        for kind, _, _ in drawn:
            counts[kind] += 1
        t1 = time.time()
        loss = train_step(model, opt, [(ids, mask) for _, ids, mask in drawn], tok.pad_token_id, args.token_budget)
        sched.step()
        t2 = time.time()
        t_data, t_train = t_data + t1 - t0, t_train + t2 - t1
        if step % args.eval_every == 0:
            engine.update_weights(model, step)
            greedy = {name: r["greedy"] for name, r in env_success(engine, active).items()}
            t_eval += time.time() - t2
            history.append({"step": step, "loss": round(loss, 4), **greedy})
            print(f"step {step:5d}  loss {loss:.4f}  held-out greedy success {greedy}  "
                  f"[data {t_data:.0f}s, train {t_train:.0f}s, eval {t_eval:.0f}s]", flush=True)
            if args.show:
                show_episodes(engine, active)
            if args.save_evals:
                model.save_pretrained(args.out / f"step-{step}")
                tok.save_pretrained(args.out / f"step-{step}")
            if step == args.stop_at_step or all(args.low <= greedy[name] <= args.high for name in stop_envs):
                break
    else:
        if args.max_steps > 0:
            sys.exit(f"no evaluation had every env's held-out success in [{args.low}, {args.high}] in {args.max_steps} steps")
        greedy = {name: r["greedy"] for name, r in env_success(engine, active).items()}  # --max-steps 0: --init as is

    torch.manual_seed(args.seed + 1)
    engine.generator.manual_seed(args.seed + 1)
    final = env_success(engine, active, samples=args.final_samples)
    arith_tasks = list(SETUPS["retry"].splits().heldout)
    arith_greedy = heldout_accuracy(model, tok, arith_tasks)
    elapsed = time.time() - start

    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    check_saved(args.out, greedy, active)
    stats = {
        "command": "python scripts/build_tiny_agent.py " + " ".join(sys.argv[1:]),
        "seed": args.seed,
        "threads": args.threads,
        "init": args.init,
        "parameters": n_params,
        "vocab_size": len(tok),
        "max_position_embeddings": MAX_POSITIONS,
        "pretraining_steps": step,
        "arithmetic_only_steps": args.arith_steps,
        "batch_episodes": args.batch,
        "learning_rate": args.lr,
        "mixture": weights,
        "code_kinds": args.code_kinds,
        "search_names": args.search_names,
        "search_layout": args.search_layout,
        "note": args.note,
        "stopping_rule": {"low": args.low, "high": args.high, "envs": stop_envs, "eval_every": args.eval_every,
                          "stop_at_step": args.stop_at_step},
        "episodes_seen": counts,
        "noise": dataclasses.asdict(noise),
        "build_seconds": round(elapsed, 1),
        "seconds": {"data": round(t_data, 1), "train": round(t_train, 1), "eval": round(t_eval, 1)},
        "heldout_greedy_success": greedy,
        f"heldout_sampled_temperature_1_{args.final_samples}_per_task": {
            name: {k: v for k, v in r.items() if k != "greedy"} for name, r in final.items()},
        "heldout_single_turn_arithmetic_greedy": round(arith_greedy, 4),
        "environments": {name: {"env": s.name, "params": s.params, "max_turns": s.limits.max_turns,
                                "max_turn_tokens": s.limits.max_turn_tokens,
                                "heldout_tasks": len(s.splits().heldout)} for name, s in SETUPS.items() if name in active},
        "history": history,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (args.out / "build_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    (args.out / "README.md").write_text(model_card(stats, args.out.name))
    print(json.dumps({k: stats[k] for k in ("parameters", "pretraining_steps", "build_seconds",
                                            "heldout_greedy_success", "heldout_single_turn_arithmetic_greedy")},
                     indent=2))


def check_saved(out: Path, greedy: dict[str, float], names: list[str]) -> None:
    """Reload what was written, with reinforge's own loaders, and play again: the same greedy success."""
    from reinforge.models.loading import load_model, load_tokenizer

    tok, model = load_tokenizer(str(out)), load_model(str(out))
    again = {name: r["greedy"] for name, r in env_success(TorchRolloutEngine(model, tok, "cpu"), names).items()}
    if again != greedy:
        sys.exit(f"the saved model plays differently: {again} != {greedy}")


def model_card(stats: dict, name: str) -> str:
    greedy, sampled = stats["heldout_greedy_success"], next(v for k, v in stats.items() if k.startswith("heldout_sampled"))
    rows = "\n".join(
        f"| {name} | {greedy[name]} | " + " | ".join(str(v) for v in sampled[name].values()) + " |" for name in greedy)
    sampled_header = " | ".join(f"{k} (temperature 1)" for k in next(iter(sampled.values())))
    mixture = ", ".join(f"{k} {v:g}" for k, v in stats["mixture"].items())
    rule = stats["stopping_rule"]
    tools = [t for t in ("code_interpreter", "search") if t in stats["mixture"]]
    about = MODEL_CARD_SEARCH if tools == ["search"] else MODEL_CARD_TOOLS if tools else MODEL_CARD_BASE
    pretraining = (
        f"{stats['arithmetic_only_steps']} steps of chat arithmetic (tiny-base's train split), then episodes mixed as "
        f"{mixture}; loss on the assistant tokens (token mean); train splits only; stopped at the first evaluation "
        f"(every {rule['eval_every']} steps) where the held-out greedy success of {', '.join(rule['envs'])} was in "
        f"[{rule['low']}, {rule['high']}]" + (f" or at step {rule['stop_at_step']}" if rule["stop_at_step"] else "") + "."
        if stats["pretraining_steps"] else "none in this command (`--max-steps 0`: the `--init` model, evaluated and "
        "written as is; the stages that trained it are above).")
    return MODEL_CARD.format(**{**stats, "rows": rows, "sampled_header": sampled_header, "mixture": mixture,
                                "name": name, "about": about, "pretraining": pretraining})


MODEL_CARD_BASE = """reinforge's shipped agent model, written by `scripts/build_tiny_agent.py` (do not edit by hand); see
docs/agent_model.md. tiny-base (arithmetic only) continued on multi-turn transcripts of the built-in
environments, played by scripted noisy policies, so that it calls the `calc` tool in Hermes format and
plays the guessing and retry games at a non-trivial but imperfect level: RL has room on each."""
MODEL_CARD_TOOLS = """reinforge's shipped model for the `python` (code_interpreter) and `search` tools, written by
`scripts/build_tiny_agent.py` (do not edit by hand); see docs/agent_model.md. tiny-agent continued on
multi-turn transcripts of the built-in environments, played by scripted noisy policies, mostly
code_interpreter (`4821*379=` -> `print(4821*379)`) and search (`capital of land 4821?` -> query
`capital of land 4821` -> answer `city 3917`, the corpus of `names: ids`), with a little of the old
environments to keep the chat format. The recipes `agent_code` and `agent_search` use it. It writes
the program and copies its output (code_interpreter); it writes the search query but copies the
value from the passage only approximately (search success near 0): see the table."""
MODEL_CARD_SEARCH = """reinforge's shipped model for the `search` tool, written by `scripts/build_tiny_agent.py` (do not edit
by hand); see docs/agent_model.md. tiny-agent-tools continued on search episodes of the corpus of
`names: ids, layout: value_first` (`capital of land 4821?` -> query `capital of land 4821` -> passage
`city 3917 is the capital of land 4821.` -> answer `city 3917`), played by a scripted noisy policy, with
a little chat arithmetic. The recipe `agent_search` uses it. Only search is evaluated: it was not
trained to keep tiny-agent-tools' code_interpreter or calculator skills (use tiny-agent-tools there)."""

MODEL_CARD = """# {name}

{about}

{note}

- Architecture: tiny-base's Llama (3 layers, hidden 256, 4 heads, tied embeddings), {parameters} parameters,
  vocabulary {vocab_size}, context {max_position_embeddings} positions.
- Tokenizer: characters (printable ASCII and newline), `<pad> <bos> <eos> <unk>`, special role markers
  `<|system|> <|user|> <|assistant|> <|tool|>`, and `<tool_call>` `</tool_call>` as single non-special tokens.
- Chat template: `<bos>`, `<|system|>` + system text + `tools: calc` (tool names only) when there is a system
  message or tools, then `<|role|>content` per message, assistant turns closed by `<eos>`; generation
  prompt `<|assistant|>`. E.g.
  `<bos><|system|>tools: calc<|user|>482*37=<|assistant|><tool_call>{{"name": "calc", "arguments": {{"expr": "482*37"}}}}</tool_call><eos><|tool|>17834<|assistant|>17834<eos>`
- Pretraining: {pretraining}

| | |
|---|---|
| command | `{command}` |
| seed / torch threads | {seed} / {threads} |
| pretraining steps (batch {batch_episodes} episodes, lr {learning_rate}) | {pretraining_steps} |
| build time on 2 CPU cores | {build_seconds} s |
| held-out single-turn arithmetic (greedy) | {heldout_single_turn_arithmetic_greedy} |
| torch | {torch} |

Held-out success, played with reinforge's rollout engine and `episode_player` exactly as
the `agent_*` recipes evaluate it. Guessing (when in the mixture) is the build's split:
pretraining saw the 24 train secrets, and this row is the 8 held-out secrets; the `agent_guessing`
recipe evaluates on all 32 secrets (greedy 0.391, mean@16 0.30-0.32 before RL: docs/agent_model.md).

| environment | greedy | {sampled_header} |
|---|---|---|---|
{rows}
"""


if __name__ == "__main__":
    main()
