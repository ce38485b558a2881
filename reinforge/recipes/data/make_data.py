"""Writes the small data files of the shipped recipes (math.jsonl, code.jsonl) next to this script.

    python reinforge/recipes/data/make_data.py

Deterministic: running it again rewrites the same bytes (tests/test_example_recipes.py checks).
The problems are 2-digit additions from the held-out split of the built-in arithmetic task, which
tiny-base never saw in pretraining (it answers about a third of them greedily), written as chat
prompts ``"23+45="`` like its training task.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = 200  # per file


def heldout_sums() -> list[tuple[int, int]]:
    """The (a, b) of tiny-base's 500 held-out problems, in a fixed shuffled order."""
    from reinforge.data.arithmetic import arithmetic_splits

    pairs = [(t.metadata["a"], t.metadata["b"]) for t in arithmetic_splits(2, "+", 500, 1234).heldout]
    random.Random(0).shuffle(pairs)
    return pairs


def math_answer(total: int, i: int) -> str:
    """The reference answer in one of several forms that math-verify finds equal to ``total``
    (exact_match would accept only the first)."""
    forms = (str(total), f"${total}$", f"\\frac{{{2 * total}}}{{2}}", f"{total}.0", f"\\boxed{{{total}}}")
    return forms[i % len(forms)]


def math_rows(pairs: list[tuple[int, int]]) -> list[dict]:
    return [{"id": f"add-{a}-{b}", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
             "answer": math_answer(a + b, i)} for i, (a, b) in enumerate(pairs)]


def code_rows(pairs: list[tuple[int, int]]) -> list[dict]:
    # tiny-base writes digits only, so its "program" is a Python expression: the test reads the
    # completion's code back from solution.py (the sandbox's copy of it) and checks its value.
    return [{"id": f"add-code-{a}-{b}", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
             "tests": f"assert eval(open('solution.py').read()) == {a + b}"} for a, b in pairs]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    pairs = heldout_sums()
    write_jsonl(HERE / "math.jsonl", math_rows(pairs[:ROWS]))
    write_jsonl(HERE / "code.jsonl", code_rows(pairs[ROWS : 2 * ROWS]))


if __name__ == "__main__":
    main()
