"""Write the task mixture of the curriculum result in docs/strategies.md: ``a+b=`` problems from three
sources of increasing difficulty (1-, 2- and 3-digit operands), one JSON object per line with a
``source`` column (``d1``, ``d2``, ``d3``) that the ``dump`` task sampler buckets by.

    python scripts/make_digit_mixture.py OUT.jsonl [--per-source 1:100,2:400,3:400] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def mixture(sizes: dict[int, int], seed: int) -> list[dict]:
    """``sizes[d]`` distinct problems with d-digit operands (a, b uniform in [0, 10^d)), each source's seeded."""
    rows = []
    for digits, n in sorted(sizes.items()):
        grid = 10 ** (2 * digits)
        if n > grid:
            raise ValueError(f"{digits}-digit: only {grid} distinct problems, asked for {n}")
        for index in np.random.default_rng([seed, digits]).choice(grid, size=n, replace=False):
            a, b = divmod(int(index), 10**digits)
            rows.append({"id": f"d{digits}-{a}+{b}", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                         "answer": str(a + b), "source": f"d{digits}"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-source", default="1:100,2:400,3:400", help="digits:count,... (default 1:100,2:400,3:400)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = {int(d): int(n) for d, n in (part.split(":") for part in args.per_source.split(","))}
    rows = mixture(sizes, args.seed)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} problems to {args.out}")


if __name__ == "__main__":
    main()
