"""Multi-turn episodes: chat-template splicing, token-exact trajectories, loss masks, limits."""

from __future__ import annotations

import json

import pytest
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

from reinforge.envs.base import StepResult
from reinforge.errors import ReinforgeError
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes
from reinforge.rollout.chat_splice import ChatSplicer, ChatTemplateError
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import SamplingParams
from reinforge.types import Batch, Task

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "d", "parameters": {}}}]


@pytest.fixture(scope="module")
def tok():
    return ascii_chat_tokenizer()


class RecordingEngine(TorchRolloutEngine):
    """The torch engine, remembering every call and every generation it returned."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, int]] = []
        self.generated: list = []

    def generate(self, requests, params, generator=None, on_step=None):
        gens = super().generate(requests, params, generator, on_step)
        self.calls.append((len(requests), params.n))
        self.generated += gens
        return gens


@pytest.fixture(scope="module")
def engine(tok):
    return RecordingEngine(tiny_random_llama(tok), tok, "cpu", seed=0)


class TurnsEnv:
    """Done after ``turns`` model turns; each earlier turn gets reward 0.25 and a user reply."""

    def __init__(self, turns: int = 3, tools: bool = False) -> None:
        self.turns, self.seen = turns, []
        self.tools = type("Box", (), {"schemas": TOOLS})() if tools else None

    def reset(self, task: Task, seed: int):
        self.seen = []
        return [{"role": "user", "content": f"go {task.prompt}"}]

    def step(self, assistant):
        self.seen.append(assistant["content"])
        if len(self.seen) == self.turns:
            return StepResult([], 1.0, True, {"correct": True})
        return StepResult([{"role": "tool" if self.tools else "user", "content": f"again {len(self.seen)}"}],
                          0.25, False, {"correct": False})


def _tasks(n=2):
    return [Task(id=f"t{i}", prompt=str(i), answer="") for i in range(n)]


# ---- ChatSplicer -------------------------------------------------------------------------------


def test_splicer_pieces_follow_the_template(tok):
    s = ChatSplicer(tok, TOOLS)
    assert tok.decode(s.prompt_ids([{"role": "user", "content": "hi"}])) == (
        "<|im_start|>system\ntools: calc<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    eos, newline = tok.eos_token_id, tok.convert_tokens_to_ids("\n")
    assert s.turn_suffix_ids == [eos, newline]
    assert s.close_turn_ids([7, eos]) == [newline]  # the model closed its turn: only the rest of the suffix
    assert s.close_turn_ids([7, 8]) == [eos, newline]  # cut by length: the whole suffix
    assert tok.decode(s.observation_ids([{"role": "tool", "content": "42"}, {"role": "user", "content": "ok"}])) == (
        "<|im_start|>tool\n42<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")


def test_splicer_equals_the_full_rendering_of_the_conversation(tok):
    """Splicing piece by piece gives the same ids as rendering the whole conversation at once."""
    s = ChatSplicer(tok)
    first = [{"role": "user", "content": "2+2?"}]
    answer = tok("4", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    obs = [{"role": "user", "content": "sure?"}]
    spliced = s.prompt_ids(first) + answer + s.close_turn_ids(answer) + s.observation_ids(obs)
    full = tok.apply_chat_template([*first, {"role": "assistant", "content": "4"}, *obs], tokenize=False,
                                   add_generation_prompt=True)
    assert spliced == tok(full, add_special_tokens=False)["input_ids"]


def test_splicer_rejects_templates_that_rewrite_history(tok):
    rewriting = ("{% for m in messages %}{% if loop.last or m['role'] != 'assistant' %}{{ m['content'] }}"
                 "{% endif %}{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    with pytest.raises(ChatTemplateError, match="not a prefix|append-only"):
        s = ChatSplicer(ascii_chat_tokenizer(rewriting))
        s.observation_ids([{"role": "user", "content": "x"}])


# ---- episodes ----------------------------------------------------------------------------------


def test_trajectories_are_token_exact_with_model_tokens_only_in_the_loss(tok, engine):
    engine.calls.clear()
    engine.generated.clear()
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=3)
    trajs = run_episodes(_tasks(2), engine, lambda: TurnsEnv(3, tools=True), params,
                         EpisodeLimits(max_turns=5, max_total_tokens=256, max_turn_tokens=6), seed=1)
    assert len(trajs) == 6 and [t.group_id for t in trajs] == [0, 0, 0, 1, 1, 1]
    assert engine.calls[0] == (2, 3), "the first turn prefills each group's shared prompt once (n = G)"
    assert all(call == (6, 1) for call in engine.calls[1:])
    splicer = ChatSplicer(tok, TOOLS)
    gens = iter(engine.generated)
    turn_gens = [[next(gens) for _ in range(6)] for _ in range(3)]  # turn-major, as generated
    for i, t in enumerate(trajs):
        ids = splicer.prompt_ids([{"role": "user", "content": f"go {t.task_id[1:]}"}])
        expect_mask = [0] * len(ids)
        for turn in range(3):
            g = turn_gens[turn][i]
            assert t.turn_spans[turn] == (len(ids), len(ids) + len(g.token_ids))
            assert t.logprobs[slice(*t.turn_spans[turn])] == g.logprobs
            ids += g.token_ids
            expect_mask += [1] * len(g.token_ids)
            if turn < 2:
                ctx = splicer.close_turn_ids(g.token_ids) + splicer.observation_ids(
                    [{"role": "tool", "content": f"again {turn + 1}"}])
                ids += ctx
                expect_mask += [0] * len(ctx)
        assert t.token_ids == ids and t.loss_mask == expect_mask
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if not m)
        assert all(v == (engine.version if m else -1) for v, m in zip(t.token_versions, t.loss_mask, strict=True))
        assert t.turn_rewards == [0.25, 0.25, 1.0] and t.reward == 1.5
        assert t.metadata["turns"] == 3 and t.metadata["correct"] and t.finish_reason == "stop"
    batch = Batch.from_trajectories(trajs, tok.pad_token_id)
    for i, t in enumerate(trajs):  # the learner sees exactly the rollout's ids and mask
        n = len(t.token_ids)
        assert batch.input_ids[i, :n].tolist() == t.token_ids
        assert batch.loss_mask[i, :n].tolist() == [float(m) for m in t.loss_mask]


def test_turn_and_token_limits_truncate(tok, engine):
    params = SamplingParams(max_new_tokens=50, n=2)
    trajs = run_episodes(_tasks(1), engine, lambda: TurnsEnv(10), params,
                         EpisodeLimits(max_turns=2, max_total_tokens=256, max_turn_tokens=4), seed=0)
    for t in trajs:
        assert t.metadata["turns"] == 2 and t.metadata["truncated"] == "max_turns" and t.finish_reason == "length"
        assert all(b - a <= 4 for a, b in t.turn_spans)
        assert t.truncated
    trajs = run_episodes(_tasks(1), engine, lambda: TurnsEnv(10), params,
                         EpisodeLimits(max_turns=10, max_total_tokens=60, max_turn_tokens=8), seed=0)
    for t in trajs:
        assert t.metadata["truncated"] == "max_total_tokens" and len(t.token_ids) <= 60


def test_environment_errors_name_the_task_and_turn(tok, engine):
    class Broken(TurnsEnv):
        def step(self, assistant):
            raise KeyError("oops")

    with pytest.raises(ReinforgeError, match=r"Broken raised KeyError.*task 't0', turn 1"):
        run_episodes(_tasks(1), engine, Broken, SamplingParams(max_new_tokens=3, n=1), EpisodeLimits(), seed=0)


def test_single_turn_environment_is_the_one_step_case(tok, engine):
    trajs = run_episodes(_tasks(2), engine, lambda: TurnsEnv(1), SamplingParams(max_new_tokens=5, n=2),
                         EpisodeLimits(), seed=0)
    for t in trajs:
        assert len(t.turn_spans) == 1 and t.turn_spans[0][1] == len(t.token_ids) and t.reward == 1.0


def test_each_turn_records_the_state_it_acted_from(tok, engine):
    """GiGPO's anchor states: the observation's text without ``state_key()``, the environment's key with it."""

    class Keyed(TurnsEnv):
        def state_key(self):
            return f"seen={len(self.seen)}"

    params = SamplingParams(max_new_tokens=3, n=2)
    limits = EpisodeLimits(max_turns=5, max_total_tokens=256, max_turn_tokens=3)
    trajs = run_episodes(_tasks(1), engine, lambda: TurnsEnv(3), params, limits, seed=0)
    first = json.dumps([{"role": "user", "content": "go 0"}], sort_keys=True)
    again = [json.dumps([{"role": "user", "content": f"again {k}"}], sort_keys=True) for k in (1, 2)]
    assert all(t.turn_states == [first, *again] for t in trajs)
    trajs = run_episodes(_tasks(1), engine, lambda: Keyed(3), params, limits, seed=0)
    assert all(t.turn_states == ["seen=0", "seen=1", "seen=2"] for t in trajs)
