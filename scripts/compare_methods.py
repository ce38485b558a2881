"""One family of methods against its baseline at equal samples: every variant over the same seeds, steps
and batch shape, then held-out greedy accuracy with bootstrap intervals over seeds, the quantity the
family targets (mean over the last ``--window`` steps), and `reinforge compare` across the variants.

    python scripts/compare_methods.py FAMILY [--seeds 0,1,2] [--steps 100] [--jobs 2] [--out DIR]

Families (``FAMILIES``): ``length`` (the length shapers against GRPO; tokens per answer), ``adaptive_length``
(AutoThink's stage-1 and stage-3 rewards, working counted as thinking, TFPI's staged ThinkFree lengths and
AnytimeReasoner's BRPO over answers read at 4 budgets and MRT's progress bonus against GRPO on the length
task; tokens per answer), ``rec`` (REC, REP and
RED-Weight against PPO's clipped surrogate, 4 updates a batch; the tokens out of range), ``hints`` (GHPO and
Guide against GRPO; the failed groups a hint solved), ``hybrid`` (LUFFY and RL-PLUS with the task's answers
as in-group demonstrations against GRPO; the expert tokens' probability), ``remix`` (on 300 2-digit
prompts that come back: ReMix's mix of fresh and replayed rows with the ratio to their sampler, two
updates a batch, the KL-Convex term and reincarnation at step 51, and the mix alone, ``repo_mix``, against
GRPO; replayed rows a step), ``search_cost`` (MASH's pay-per-search reward against GRPO on the search task;
tool calls per episode), ``step_search`` (StepSearch's information-gain and redundancy step rewards against PPO
with the same critic on the search task; the episodes solved), ``step_shaping`` (process rewards for the written equations, raw and bounded by Clip
or Delta, against GRPO on 2-digit sums with room for working; the equations written), ``weighting`` (EGSW's entropy-guided sequence weights, with and without the entropy, MGPO's MaxEnt-guided
problem weights and GRPO-D's scheduled KL weight against GRPO; the training samples' accuracy), ``objectives`` (Lite PPO's
advantage, RPG-REINFORCE with RPG-Style Clip, CoPG and TROLL against GRPO, and RPG and TROLL against
GRPO with four updates a batch; the training samples' accuracy), ``turn_credit`` (IGPO against ``grpo_turn`` on the
guessing game), ``tree`` (TreePO's and TreeRL's tree rollouts with their advantages, TreeRL's EPTree with
GRPO's advantage, and Segment Policy Optimization's segment credit from Monte Carlo values, against GRPO;
tokens decoded a step, and those decoded for the Monte Carlo values), ``label_free``
(the label-free rewards against the gold verifier: the votes, and RLPR's and DRO's likelihood of the reference
after the reasoning; the training samples' accuracy graded against the gold answer, ``reward/accuracy``, and
held-out accuracy, which is always graded against it). A finished run in
``--out`` is read back, not trained again.
"""

from __future__ import annotations

import argparse
import math
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

COMMON = ["rollout.prompts_per_step=16", "rollout.group_size=8", "task.heldout_size=300", "eval.every=0",
          "checkpoint.every=0", "log.samples_per_step=0", "eval.final_samples=0", "log.report=false",
          "train.time_limit_s=0", "train.lr_schedule=constant"]
LENGTH_BASE = ["task.verifier=numeric_match", "rollout.max_new_tokens=12"]  # + the budget phrase: 63 of 64 positions
VOTE_TERM = "reward.terms=[{{name: r, verifier: {name}, params: {{gold_verifier: exact_match}}}}]"
OFF_POLICY = ["train.minibatches=4", "train.lr=2.5e-5", "algo.advantage=dr_grpo", "algo.loss_agg=token_mean",
              "algo.kl.coef=0", "algo.skip_equal_reward_groups=true"]  # 4 updates a batch: the clip acts
DEMOS = ["demonstrations.path=task", "demonstrations.mix=true", "demonstrations.placement=in_group"]  # LUFFY's
STEPS = "reward.step_verifier={name: arithmetic_steps, coef: 0.1}"  # +0.1 a true equation, -0.1 a false one
REMIX_REPLAY = "rollout.replay={name: recent, capacity: 8, replays: 4, min_to_replay: 8, groups: split, until_step: 51}"
FAMILIES: dict[str, dict[str, Any]] = {
    "length": {
        "base": LENGTH_BASE, "metric": ("tokens per answer", "response/length_mean"),
        "variants": {
            "grpo": [],
            "kimi_length": ["algo.reward_shapers=[{name: kimi_length}]"],
            "conciser_length": ["algo.reward_shapers=[{name: conciser_length}]"],
            "hbpo_budget": ["algo.reward_shapers=[{name: hbpo_budget}]", "rollout.group_sampler={name: hbpo_budgets}"],
        },
    },
    "adaptive_length": {
        "base": LENGTH_BASE, "metric": ("tokens per answer", "response/length_mean"),
        "variants": {
            "grpo": [],
            # the tiny tokenizer has no think tags: a response "thinks" when it writes working ("=")
            "autothink_s1": ["algo.reward_shapers=[{name: autothink, stage: 1, think_marker: '='}]"],
            "autothink_s3": ["algo.reward_shapers=[{name: autothink, stage: 3, think_marker: '='}]"],
            # ThinkFree's suffix is empty here (no think tags): its staged lengths 4 -> 8 -> 12 tokens
            "thinkfree": ["rollout.group_sampler={name: thinkfree, suffix: '', stage_lengths: [0.34, 0.67, 1.0], "
                          "stage_steps: [33, 67]}"],
            # cuts after 3, 6, 9, 12 tokens, the answer read off each cut (the last number so far), uniform prior
            "brpo": ["algo.advantage={name: brpo, budgets: [0.25, 0.5, 0.75, 1.0]}"],
            # MRT's progress bonus over episodes cut at 0 (the prompt alone), 3, 6, 9, 12 tokens, alpha 1
            "mrt": ["algo.advantage={name: mrt, budgets: [0.0, 0.25, 0.5, 0.75, 1.0]}"],
        },
    },
    "label_free": {
        "base": [], "metric": ("training samples correct (gold)", "reward/accuracy"),
        "variants": {
            "gold": [],
            "majority_vote": [VOTE_TERM.format(name="majority_vote")],
            "restrain_vote": [VOTE_TERM.format(name="restrain_vote")],
            "rlpr": [VOTE_TERM.format(name="rlpr")],  # the policy's probability of the reference after the reasoning
            "dro": [VOTE_TERM.format(name="dro_r3")],  # DRO's R3: reference tokens weighted by their spread
        },
    },
    "rec": {
        "base": OFF_POLICY, "metric": ("tokens out of range", "train/clip_frac"),
        "variants": {
            "ppo_clip": ["algo.policy_loss=ppo_clip"],
            "reinforce": ["algo.policy_loss={name: rec, clip_mode: none}"],
            "rec_oneside_nois": ["algo.policy_loss={name: rec, clip_mode: one_side}"],
            "rec_ring_nois": ["algo.policy_loss={name: rec, clip_mode: ring}"],
            "rep_opmd": ["algo.policy_loss={name: rec, clip_mode: none, regularizer: k2, regularizer_coef: 0.1}"],
            "rep_asymre": ["algo.policy_loss={name: rec, clip_mode: none, regularizer: forward_kl, "
                           "regularizer_coef: 0.1}"],
            "red_weight": ["algo.policy_loss={name: rec, clip_mode: none, weight: advantage}"],
            "red_drop": ["algo.advantage=red_drop", "algo.policy_loss={name: rec, clip_mode: none}"],
        },
    },
    "hints": {
        "base": [], "metric": ("failed groups a hint solved", "hints/solved_groups"),
        "variants": {
            "grpo": [],
            "ghpo": ["rollout.hints={name: ghpo, placement: response}"],
            "guide": ["rollout.hints={name: guide, placement: response}", "algo.policy_loss={name: guide}"],
        },
    },
    "hybrid": {
        "base": [], "metric": ("expert tokens' probability", "train/guided/prob"),
        "variants": {
            "grpo": [],
            "luffy": ["algo.policy_loss={name: luffy, gamma: 0.1}", *DEMOS],
            "rl_plus": ["algo.policy_loss=rl_plus", *DEMOS],
        },
    },
    "remix": {
        "base": ["task.kind=jsonl", "task.columns.id=id", "task.heldout_size=100"], "prompts": "d2",
        "metric": ("replayed rows a step", "replay/samples"),
        "variants": {
            "grpo": [],
            "repo_mix": ["algo.policy_loss=repo", REMIX_REPLAY],
            "remix": ["algo.policy_loss=repo", REMIX_REPLAY, "train.minibatches=2",
                      "algo.loss_terms=[{name: kl_convex, coef: 0.01, base_weight: 0.5}]"],
        },
    },
    "weighting": {
        "base": [], "metric": ("training samples correct", "reward/accuracy"),
        "variants": {
            "grpo": [],
            "egsw": ["algo.advantage=egsw"],
            "egsw_no_entropy": ["algo.advantage={name: egsw, egsw_alpha: 0.0}"],
            "mgpo": ["algo.advantage=mgpo"],
            "grpo_d": ["algo.loss_terms=[{name: kl_dynamic, beta_start: 0.0, beta_end: 0.04, horizon: 100}]"],
        },
    },
    "step_shaping": {
        "base": [*LENGTH_BASE, "rollout.max_new_tokens=24"], "metric": ("steps written (128 completions)", "reward/steps"),
        "variants": {
            "grpo": [],
            "steps": [STEPS],
            "clip": [STEPS, "reward.step_shaping={name: clip, eta: 1.0}"],
            "delta": [STEPS, "reward.step_shaping=delta"],
        },
    },
    "search_cost": {
        "recipe": "agent_search", "prompts_per_step": 8, "base": ["task.heldout_size=100"],  # the recipe's
        "metric": ("tool calls per episode", "episode/tool_calls_mean"),
        "variants": {
            "grpo": [],
            "search_cost": ["algo.reward_shapers=[{name: search_cost, penalty: exp, decay: 0.5}]"],
        },
    },
    "step_search": {
        "recipe": "agent_search", "prompts_per_step": 8, "base": ["task.heldout_size=100"],  # the recipe's
        "metric": ("episodes solved (training)", "reward/accuracy"),
        "also": [("tool calls per episode", "episode/tool_calls_mean")],
        "variants": {
            "ppo": ["algo.advantage=gae"],
            "stepsearch": ["algo.advantage=stepsearch"],
        },
    },
    "tree": {
        "base": [], "metric": ("tokens decoded a step", "rollout/tokens_generated"),
        "also": [("tokens decoded a step for MC values", "rollout/state_values/tokens_generated")],
        "variants": {
            "grpo": [],
            "treepo": ["rollout.group_sampler={name: treepo}", "algo.advantage=treepo"],
            "eptree_grpo": ["rollout.group_sampler={name: eptree, forks: 3}"],
            "treerl": ["rollout.group_sampler={name: eptree, forks: 3}", "algo.advantage=treerl"],
            "segment_po": ["algo.advantage={name: segment_po, cut_interval: 1}", "algo.skip_equal_reward_groups=false"],
        },
    },
    "objectives": {
        "base": [], "metric": ("training samples correct", "reward/accuracy"),
        "variants": {
            "grpo": [],
            "lite_ppo": ["algo.advantage=lite_ppo"],  # + token_mean, the default aggregation
            "rpg": ["algo.advantage=dr_grpo", "algo.policy_loss={name: rpg, kl: ufkl, beta: 1e-4}"],
            "copg": ["algo.policy_loss={name: copg, beta: 0.1, normalise: true}", "algo.loss_agg=seq_mean_token_sum"],
            "troll": ["algo.policy_loss=troll"],
            # four updates a batch: the ratio moves, so the clip, RPG-Style Clip and TROLL's projection act
            "grpo_4mb": ["train.minibatches=4"],
            "rpg_4mb": ["train.minibatches=4", "algo.advantage=dr_grpo", "algo.policy_loss={name: rpg, kl: ufkl, beta: 1e-4}"],
            "troll_4mb": ["train.minibatches=4", "algo.policy_loss=troll"],
        },
    },
    "turn_credit": {
        "recipe": "agent_guessing", "base": ["task.heldout_size=192", "eval.final_samples=0"],
        "metric": ("episodes solved (training)", "reward/accuracy"),
        "variants": {
            "grpo_turn": ["algo.advantage=grpo_turn"],
            "igpo": ["algo.advantage=igpo"],
        },
    },
}


def batch_shape(family: str) -> list[str]:
    """A family's prompts per step where it is not COMMON's 16 (``prompts_per_step``: its recipe's own)."""
    n = FAMILIES[family].get("prompts_per_step")
    return [f"rollout.prompts_per_step={n}"] if n is not None else []


def prompt_file(family: str, out: Path) -> list[str]:
    """The overrides of a family that trains on its own prompt file (``prompts``: ``d2``, the 400 2-digit
    problems of scripts/make_digit_mixture.py, so that a prompt comes back about 5 times in 100 steps of
    16 prompts and replay has something to replay), writing the file into ``out`` first; none otherwise."""
    if FAMILIES[family].get("prompts") != "d2":
        return []
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_digit_mixture import mixture

    path = out / "d2.jsonl"
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in mixture({2: 400}, seed=0)))
    return [f"task.path={path}"]


def run_one(family: str, variant: str, seed: int, steps: int, out: Path, threads: int) -> dict[str, Any]:
    """Train one run (unless ``out/<variant>-s<seed>`` holds a finished one) and read it back."""
    import torch

    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    spec = FAMILIES[family]
    run_dir = out / f"{variant}-s{seed}"
    if not (run_dir / "metrics.jsonl").is_file():
        torch.set_num_threads(threads)
        cfg = load_config(spec.get("recipe"), [*COMMON, *batch_shape(family), *spec["base"], *prompt_file(family, out),
                                               *spec["variants"][variant], f"seed={seed}",
                                 f"train.steps={steps}", f"output_dir={out}", f"name={variant}-s{seed}"])
        run_dir = train(cfg).run_dir
    return {"dir": str(run_dir)}


def summary(run_dir: str, metric: str, window: int) -> tuple[float, float, float]:
    """Held-out accuracy after, the metric's mean over the last ``window`` steps (nan where absent), samples."""
    from reinforge.track.jsonl import read_jsonl

    records = read_jsonl(Path(run_dir) / "metrics.jsonl")
    rows = [m for m in records if "reward/mean" in m]
    heldout = [m["eval/heldout_acc"] for m in records if "eval/heldout_acc" in m]
    tail = [m[metric] for m in rows[-window:] if metric in m]
    return heldout[-1], (statistics.fmean(tail) if tail else float("nan")), sum(m["rollout/sampled"] for m in rows)


def report(family: str, runs: dict[str, list[dict]], window: int) -> str:
    from reinforge.eval.compare import compare_runs, format_table
    from reinforge.eval.runs import load_run

    label, metric = FAMILIES[family]["metric"]
    also = FAMILIES[family].get("also", [])  # further metrics of the family, a column each
    result = compare_runs({v: [load_run(r["dir"]) for r in rs] for v, rs in runs.items()})
    lines = [f"| variant | held-out greedy after, mean over seeds [95% CI] | per seed | {label} (last {window} "
             f"steps, mean over seeds) | {''.join(f'{name} | ' for name, _ in also)}samples / run |",
             "|---|---|---|---|" + "---|" * len(also) + "---|"]
    for variant, rs in runs.items():
        rows = [summary(r["dir"], metric, window) for r in rs]
        extra = [statistics.fmean(summary(r["dir"], key, window)[1] for r in rs) for _, key in also]
        lines.append(f"| {variant} | {result.groups[variant].estimates['mean']} | "
                     f"{', '.join(f'{a:.3f}' for a, _, _ in rows)} | {statistics.fmean(m for _, m, _ in rows):.3f} | "
                     f"{''.join('- | ' if math.isnan(x) else f'{x:.1f} | ' for x in extra)}"
                     f"{statistics.median(s for _, _, s in rows):.0f} |")
    return "\n".join(lines) + "\n\n" + format_table(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--variants", default="", help="comma-separated (default: the family's every variant)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each with --threads threads)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="default: runs/compare/<family>")
    args = parser.parse_args()
    known = FAMILIES[args.family]["variants"]
    variants = [v for v in args.variants.split(",") if v] or list(known)
    for v in variants:
        if v not in known:
            raise SystemExit(f"--variants: unknown {v!r} for {args.family}; known: {', '.join(known)}")
    out = Path(args.out or f"runs/compare/{args.family}")
    out.mkdir(parents=True, exist_ok=True)
    todo = [(v, int(s)) for s in args.seeds.split(",") for v in variants]  # seeds outermost, as run_presets.py
    runs: dict[str, dict[int, dict]] = {}
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_one, args.family, v, s, args.steps, out, args.threads): (v, s) for v, s in todo}
        for future in as_completed(futures):
            v, s = futures[future]
            runs.setdefault(v, {})[s] = future.result()
            print(f"done: {v} seed {s}", flush=True)
    ordered = {v: [runs[v][s] for s in sorted(runs[v])] for v in variants}
    prompts = FAMILIES[args.family].get("prompts_per_step", 16)
    print(f"\n{args.family}: {args.steps} steps x {prompts} prompts x 8 samples, seeds {args.seeds}, runs in {out}\n")
    print(report(args.family, ordered, args.window))


if __name__ == "__main__":
    main()
