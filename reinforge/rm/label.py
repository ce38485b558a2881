"""Step labels made by the policy itself: Math-Shepherd's Monte Carlo estimation (Wang et al. 2024,
arXiv:2312.08935), for ``reinforge prm`` with ``data.path: task``.

For each task, ``samples`` completions are drawn from the labelling policy and cut into steps where
VinePPO's stage cuts them (``orchestrate.state_values.cut_points``: lines, or every ``step_tokens``
tokens). The state after step i (the prompt and the completion up to the step's end) is continued
``rollouts`` = N times by the same policy, each continuation scored by the task's verifier:

    soft label  y_i = (1/N) sum_j correct(continuation_j)        hard label  y_i = [any continuation correct]

The last step's label is the completion's own correctness (nothing is left to continue). Rows come
out in the stepwise form ``{"prompt", "completions": [step texts], "labels"}``, the step texts joined
by nothing giving the completion as the policy wrote it (so the PRM's ``step_separator`` is ``""``
for token cuts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from reinforge.eval.heldout import build_requests
from reinforge.orchestrate.state_values import CutSettings, cut_points
from reinforge.rollout.continuation import continue_budgeted
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task


def _strip_special(ids: list[int], special: set[int]) -> list[int]:
    end = len(ids)
    while end and ids[end - 1] in special:
        end -= 1
    return ids[:end]


def label_steps(engine: Any, verifier: Any, tasks: Sequence[Task], params: SamplingParams, samples: int,
                rollouts: int, cut: CutSettings, hard: bool = False, console: Console | None = None
                ) -> list[dict[str, Any]]:
    """Stepwise rows for ``tasks`` (see the module docstring); ``params`` are the policy's sampling."""
    tok = engine.tokenizer
    special = set(tok.all_special_ids)
    requests = build_requests(tasks, tok, None)
    gens = engine.generate(requests, dataclasses.replace(params, n=samples))
    rows, states = [], []  # states: (row index, task, prompt ids, prefix ids)
    for i, gen in enumerate(gens):
        task, prompt = tasks[i // samples], requests[i // samples].prompt_ids
        ids = _strip_special(list(gen.token_ids), special)
        if not ids:
            continue
        bounds = [0, *cut_points(ids, lambda t: tok.decode(t, skip_special_tokens=True), cut), len(ids)]
        steps = [tok.decode(ids[a:b], skip_special_tokens=True) for a, b in zip(bounds, bounds[1:], strict=False)]
        if any(not s.strip() for s in steps):
            continue  # a step of only whitespace or special tokens has nothing to label
        final = float(verifier(task, tok.decode(ids, skip_special_tokens=True)).correct)
        rows.append({"prompt": task.prompt, "completions": steps, "labels": [0.0] * (len(steps) - 1) + [final],
                     "task_id": task.id})
        states += [(len(rows) - 1, k, task, prompt, ids[:b]) for k, b in enumerate(bounds[1:-1])]
    if states:
        conts, _ = continue_budgeted(engine, [s[3] for s in states], [s[4] for s in states],
                                     dataclasses.replace(params, n=rollouts))
        for j, (row, k, task, _, _) in enumerate(states):
            correct = [float(verifier(task, g.text).correct) for g in conts[j * rollouts : (j + 1) * rollouts]]
            rows[row]["labels"][k] = float(any(correct)) if hard else sum(correct) / len(correct)
    if console is not None:
        n_steps = sum(len(r["labels"]) for r in rows)
        console.print(f"labelled {n_steps} steps of {len(rows)} completions ({len(states) * rollouts} continuations)",
                      highlight=False)
    return rows
