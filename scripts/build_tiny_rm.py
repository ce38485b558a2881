"""Build reinforge's shipped tiny reward model, ``tiny-rm``, from ``tiny-base``.

    python scripts/build_tiny_rm.py [--out reinforge/assets/tiny-rm] [--seed 0]

It runs ``reinforge rm arithmetic_verify`` (a reference-based Bradley-Terry reward model on
near-miss addition pairs, reinforge/recipes/rm/arithmetic_verify.yaml) and copies the trained model
directory, with a model card giving the command, the seed, the time and the held-out pair accuracy
with its 95% interval. Reproducible: fixed seed, 2 threads. Nothing is edited by hand afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from reinforge.rm.config import load_rm_config
from reinforge.rm.train import train_reward_model

CARD = """# tiny-rm

reinforge's shipped reward model, written by `scripts/build_tiny_rm.py` (do not edit by hand).

- Architecture: `LlamaForSequenceClassification`: tiny-base's transformer with a one-output score head,
  read at the last token.
- Reference-based (Cooper's VerifyRM design, Hong et al. 2025, arXiv:2508.05613): the scorer appends
  the task's reference answer to the question (`reinforge_rm.json`: reference template `{template!r}`),
  so it scores a completion against the reference; a task without a reference answer cannot be scored.
- Trained with `reinforge rm arithmetic_verify`: Bradley-Terry on pairs of the reference answer over a
  near miss (the answer +-1, +-2 or +-10), six per problem of the train split of the built-in
  addition task; the 500 held-out problems are never seen.

| | |
|---|---|
| command | `python scripts/build_tiny_rm.py {args}` |
| seed | {seed} |
| steps (batch {batch} pairs, lr {lr:g}) | {steps} |
| build time on 2 CPU cores | {seconds:.1f} s |
| held-out pair accuracy ({pairs} pairs) | {accuracy:.3f} [{low:.3f}, {high:.3f}] |
| calibration error (ECE) | {ece:.3f} |
| torch | {torch} |
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "reinforge/assets/tiny-rm"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_rm_config("arithmetic_verify", [f"seed={args.seed}", f"output_dir={tmp}", "name=tiny-rm"])
        result = train_reward_model(cfg)
        out = Path(args.out)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(result.model_dirs[0], out)
        h = result.heldout
        stats = {"seed": args.seed, "steps": result.steps, "build_seconds": round(result.seconds, 1),
                 "heldout_pairs": h.pairs, "heldout_pair_accuracy": h.accuracy, "interval_95": [h.low, h.high],
                 "ece": h.ece, "torch": torch.__version__}
        (out / "build_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        extra = " ".join(sys.argv[1:])
        (out / "README.md").write_text(CARD.format(
            template=cfg.data.reference_template, args=extra, seed=args.seed, batch=cfg.train.batch_size,
            lr=cfg.train.lr, steps=result.steps, seconds=result.seconds, pairs=h.pairs, accuracy=h.accuracy,
            low=h.low, high=h.high, ece=h.ece, torch=torch.__version__))
    print(f"wrote {out}: held-out pair accuracy {h.accuracy:.3f} [{h.low:.3f}, {h.high:.3f}]")


if __name__ == "__main__":
    main()
