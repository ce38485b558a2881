"""A fake single-turn collector for the budget-scores stage (tests/test_brpo.py, tests/test_mrt.py)."""

from __future__ import annotations

from types import SimpleNamespace

from reinforge.rollout.types import Generation
from reinforge.types import Trajectory


class _Pool:
    """Reward 1 when the text's last character is '5'."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def score(self, tasks, texts):
        self.seen += list(texts)
        return [SimpleNamespace(reward=1.0 if t.strip().endswith("5") else 0.0) for t in texts]


class _Collector:
    def __init__(self) -> None:
        from reinforge.models.loading import load_tokenizer

        self.engine = SimpleNamespace(tokenizer=load_tokenizer("tiny-base"), generate=self._generate)
        self.pool, self.calls = _Pool(), []

    def _generate(self, requests, params):  # every summary is '5' (id 9)
        self.calls.append(([list(r.prompt_ids) for r in requests], params.max_new_tokens))
        return [Generation(r.request_id, list(r.prompt_ids), [9], [0.0], "stop", 0) for r in requests]

    def continue_states(self, *args):
        raise AssertionError("not used")


def _row(generated: list[int], text: str) -> Trajectory:
    return Trajectory(token_ids=[1, 6] + generated, loss_mask=[0, 0] + [1] * len(generated),
                      logprobs=[0.0] * (2 + len(generated)), version=0, group_id=0, task_id="t", reward=0.0,
                      completion_text=text)
