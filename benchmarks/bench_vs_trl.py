"""End-to-end GRPO step time: reinforge vs TRL's ``GRPOTrainer``, same model, same task, one invocation.

    pip install -e '.[bench]'            # trl (and datasets, accelerate); torch is left as it is
    flock /tmp/reinforge-bench.lock python benchmarks/bench_vs_trl.py [--steps 30] [--warmup 5] \\
        [--repeats 3] [--variant 0.5M|4.2M] [--force-length 16] [--pretrain-steps 0] [--profile]

Set-up (benchmarks/trl_baseline.py): a Qwen2 LM (0.5M: hidden 128, 2 layers, 4 heads,
intermediate 512, tied embeddings, 48-token character vocabulary; or 4.2M: hidden 256, 4 layers)
built with a fixed seed and saved to a temporary directory together with its tokenizer, and the
task ``a+b=`` (a, b in [0, 19], raw-text prompts, reward 1 iff the completion up to EOS is the sum).
Both frameworks load that directory. One optimizer step = 8 prompts x 8 samples, max completion
length 8, AdamW lr 3e-4 constant, grad clip 1.0, fp32 on CPU with 2 threads, no reference model,
one update per generation batch, and the same loss: TRL's default (``loss_type="dapo"``: PPO-clip
0.2 per token, token mean over the batch; advantages (r - mean_g) / (std_g + 1e-4)) is reinforge's
``advantage={name: grpo, scale_by_std: true, adv_eps: 1.0e-4} policy_loss=ppo_clip loss_agg=token_mean``.

Every (framework, repeat) runs in a fresh subprocess (so peak RSS and import time are its own),
alternating the order of the two frameworks from repeat to repeat. Per step the child records:

- ``wall``: time between the starts of consecutive steps (everything the loop does per step,
  logging included) -- the headline figure;
- ``step``: the step body (reinforge: ``time/step_s``, rollout + reward + update + weight sync;
  TRL: ``on_step_begin`` -> ``on_step_end``, generation + reward + loss + backward + optimizer);
- a split into generation / reward / learner for both (method timers, see ``--profile`` for more).

The first ``--warmup`` steps of every repeat are not timed; reinforge's held-out evaluations (before
the first and after the last step) are outside every step. ``--force-length 16`` makes every
completion exactly 16 tokens (TRL: ``min_new_tokens``, which masks EOS; reinforge:
``rollout.ignore_eos``). ``--pretrain-steps N`` gives the random model N steps of
next-token pretraining on ``a+b=c`` first, so the reward comparison is not a comparison of zeros
(a random-init model almost never writes a correct sum).

The machine is shared: each child also measures, from /proc/stat, how much CPU other processes used
during its timed steps; a repeat where they used more than 0.25 cores is run again (``--retries``)
and any repeat still above that is named in a warning under the table.
"""

from __future__ import annotations

import time

_T_PROCESS = time.perf_counter()  # before any import: the child's import time starts here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FRAMEWORKS = ("trl", "reinforge")
CONTENDED_CORES = 0.25  # CPU used by other processes during a repeat's timed steps above which it is re-run


# ---------------------------------------------------------------------------------------- children
class StepClock:
    """Per-step wall clock and named phase timers inside one child process."""

    def __init__(self) -> None:
        self.begin: list[float] = []
        self.end: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.tokens: list[int] = []
        self.rewards: list[float] = []
        self.profiler = None
        self.torch_profiler = None
        self.torch_profile = None
        self.cpu_start = self.cpu_end = None

    def step_begin(self, spec: dict) -> None:
        if len(self.begin) == spec["warmup"]:
            self.cpu_start = _cpu_snapshot()
        self.begin.append(time.perf_counter())
        self.phases.append({})
        self.tokens.append(0)
        self.maybe_profile(len(self.begin) - 1, spec)

    def step_end(self, spec: dict) -> None:
        self.end.append(time.perf_counter())
        if len(self.end) == spec["steps"]:
            self.cpu_end = _cpu_snapshot()

    def add(self, phase: str, seconds: float) -> None:
        if self.phases:
            self.phases[-1][phase] = self.phases[-1].get(phase, 0.0) + seconds

    def timed(self, phase: str, fn, count_tokens=None):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.add(phase, time.perf_counter() - t0)
            if count_tokens is not None and self.tokens:
                self.tokens[-1] += count_tokens(out)
            return out

        return wrapper

    def maybe_profile(self, step_index: int, spec: dict) -> None:
        """Profiling child only: cProfile over steps [w, w + k), torch.profiler over [w + k, w + 2k)."""
        k, w = spec.get("profile_steps", 0), spec["warmup"]
        if not k:
            return
        if step_index == w:
            import cProfile

            self.profiler = cProfile.Profile()
            self.profiler.enable()
        elif step_index == w + k:
            self.profiler.disable()
            import torch

            self.torch_profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.torch_profiler.__enter__()
        elif step_index == w + 2 * k:
            self.torch_profiler.__exit__(None, None, None)
            self.torch_profile = self.torch_profiler.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40)

    def result(self, spec: dict, extra: dict) -> dict:
        out = {
            "begin": self.begin, "end": self.end, "phases": self.phases, "tokens": self.tokens,
            "rewards": self.rewards, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cpu": _cpu_share(self.cpu_start, self.cpu_end), **extra,
        }
        if self.profiler is not None:
            out["profile"] = _profile_table(self.profiler, spec["profile_steps"])
            out["torch_profile"] = self.torch_profile
        return out


def _cpu_snapshot() -> tuple[float, list[int], int] | None:
    """(wall, machine-wide /proc/stat 'cpu' counters, this process's utime + stime), in clock ticks."""
    try:
        machine = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return time.perf_counter(), machine, int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _cpu_share(start, end) -> dict:
    """Over the timed steps, in cores: CPU used by this process, by every other process, and stolen by
    the hypervisor. ``others`` > 0.1 means somebody else was computing during the measurement."""
    if not start or not end:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    wall = end[0] - start[0]
    delta = [b - a for a, b in zip(start[1], end[1], strict=False)]
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)
    steal = delta[7] if len(delta) > 7 else 0
    busy = sum(delta[:8]) - idle - steal
    own = end[2] - start[2]
    return {"self": own / tick / wall, "others": max(busy - own, 0) / tick / wall, "steal": steal / tick / wall}


def _profile_table(profiler, steps: int, top: int = 25) -> list[tuple[str, float, float, int]]:
    """(function, cumulative s per step, own s per step, calls per step), by cumulative time."""
    import pstats

    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        if Path(file).name == Path(__file__).name:  # the benchmark's own wrappers (entered before enable())
            continue
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if file != "~" else "builtin"
        rows.append((f"{name} ({where})", cumtime / steps, tottime / steps, ncalls // steps))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def reinforge_overrides(spec: dict) -> list[str]:
    """The run config of the reinforge side: TRL's defaults mapped to reinforge's keys."""
    work = Path(spec["workdir"])
    return [
        f"seed={spec['seed']}", f"output_dir={work / 'runs'}", f"name=reinforge-{spec['tag']}",
        "task.kind=jsonl", f"task.path={work / 'train.jsonl'}", f"task.heldout_path={work / 'heldout.jsonl'}",
        "task.verifier=exact_match",
        f"model.path={work / 'model'}", "model.dtype=float32", "model.device=cpu",
        "rollout.prompts_per_step=8", "rollout.group_size=8", f"rollout.max_new_tokens={spec['max_new_tokens']}",
        "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=0",
        # TRL's default GRPO loss (loss_type="dapo", beta=0, epsilon=0.2, scale_rewards="group", 1 iteration)
        "algo.advantage={name: grpo, scale_by_std: true, adv_eps: 1.0e-4}",
        "algo.policy_loss={name: ppo_clip, clip_low: 0.2, clip_high: 0.2}", "algo.loss_agg=token_mean",
        "algo.kl.coef=0.0", "algo.entropy_coef=0.0", "algo.skip_equal_reward_groups=false",
        "algo.dynamic_sampling=false",
        f"train.steps={spec['steps']}", f"train.lr={spec['lr']}", "train.lr_schedule=constant",
        "train.warmup_steps=0", "train.weight_decay=0.0", "train.grad_clip=1.0", "train.epochs=1",
        "train.minibatches=1", "train.time_limit_s=0",
        "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.samples_per_step=0",
        f"log.console_every={spec['steps']}", "log.report=false",
        *(["rollout.ignore_eos=true"] if spec["force_length"] else []),
    ]


def child_reinforge(spec: dict) -> dict:
    clock = StepClock()
    t0 = time.perf_counter()
    import torch

    from reinforge.config import load_config
    from reinforge.learn.learner import Learner
    from reinforge.orchestrate import loop, run
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    import_s = time.perf_counter() - t0
    torch.set_num_threads(spec["threads"])
    cfg = load_config(None, reinforge_overrides(spec))
    step_impl = loop.Loop.train_step

    def train_step(loop, step):
        clock.step_begin(spec)
        metrics = step_impl(loop, step)
        clock.step_end(spec)
        clock.rewards.append(metrics["reward/mean"])
        clock.tokens[-1] = int(round(metrics["response/length_mean"] * 64))
        clock.add("generate", metrics["time/generate_s"])
        clock.add("reward", metrics["time/reward_s"])
        clock.add("batch+update+sync", metrics["time/train_s"])
        clock.add("step_metric", metrics["time/step_s"])
        return metrics

    loop.Loop.train_step = train_step
    Learner.update = clock.timed("learner.update", Learner.update)
    TorchRolloutEngine.update_weights = clock.timed("weight_sync", TorchRolloutEngine.update_weights)
    learners: list = []
    learner_init = Learner.__init__

    def init(self, *a, **k):
        learner_init(self, *a, **k)
        learners.append(self)

    Learner.__init__ = init
    t_start = time.perf_counter()
    result = run.train(cfg)
    opt = learners[0].optimizer
    facts = {
        "optimizer": f"{type(opt).__name__}(fused={opt.defaults.get('fused')}, foreach={opt.defaults.get('foreach')})",
        "shared_prefix": learners[0].shared_prefix is not None, "ref_model": learners[0].ref_model is not None,
        "dtype": str(next(learners[0].model.parameters()).dtype),
    }
    metrics_file = result.run_dir / "metrics.jsonl"
    log = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    return clock.result(spec, {"facts": facts, "log": log,
        "import_s": import_s, "to_first_step_s": clock.begin[0] - _T_PROCESS, "setup_s": clock.begin[0] - t_start,
        "heldout_after": result.heldout_after, "versions": {"torch": torch.__version__},
    })


def child_trl(spec: dict) -> dict:
    clock = StepClock()
    t0 = time.perf_counter()
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import_s = time.perf_counter() - t0
    torch.set_num_threads(spec["threads"])
    import trl_baseline

    work = Path(spec["workdir"])
    rows = [json.loads(line) for line in (work / "train.jsonl").read_text().splitlines()]
    dataset = Dataset.from_list(rows)

    def exact_sum(prompts, completions, answer, **kwargs):
        return [trl_baseline.reward_exact(c, a) for c, a in zip(completions, answer, strict=True)]

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.step_begin(spec)

        def on_step_end(self, args, state, control, **kwargs):
            clock.step_end(spec)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                clock.rewards.append(float(logs["reward"]))

    config_kwargs = dict(
        output_dir=str(work / "trl-out" / spec["tag"]), seed=spec["seed"], max_steps=spec["steps"],
        per_device_train_batch_size=64, num_generations=8, gradient_accumulation_steps=1,  # 8 prompts x 8
        max_completion_length=spec["max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, beta=0.0, num_iterations=1, epsilon=0.2, scale_rewards="group", loss_type="dapo",
        use_vllm=False, report_to="none", logging_steps=1, save_strategy="no", eval_strategy="no",
        bf16=False, fp16=False, gradient_checkpointing=False, dataloader_num_workers=0, use_cpu=True,
        disable_tqdm=True, log_completions=False,
    )
    if spec["force_length"]:
        config_kwargs["generation_kwargs"] = {"min_new_tokens": spec["max_new_tokens"]}
    args = GRPOConfig(**config_kwargs)
    model_dir = str(work / "model")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(model=model, reward_funcs=exact_sum, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer._generate_single_turn = clock.timed(
        "generate", trainer._generate_single_turn, count_tokens=lambda out: sum(len(c) for c in out[0]))
    trainer._calculate_rewards = clock.timed("reward", trainer._calculate_rewards)
    trainer._generate_and_score_completions = clock.timed(
        "generate_and_score", trainer._generate_and_score_completions)
    trainer._compute_loss = clock.timed("loss_forward", trainer._compute_loss)
    trainer.accelerator.backward = clock.timed("backward", trainer.accelerator.backward)
    t_start = time.perf_counter()
    trainer.train()
    opt = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    facts = {
        "optimizer": f"{type(opt).__name__}(fused={opt.defaults.get('fused')}, foreach={opt.defaults.get('foreach')})",
        "gradient_checkpointing": bool(trainer.model.is_gradient_checkpointing), "ref_model": trainer.ref_model is not None,
        "loss_type": args.loss_type, "beta": args.beta, "steps_per_generation": args.steps_per_generation,
        "generation_batch_size": args.generation_batch_size, "dtype": str(next(trainer.model.parameters()).dtype),
    }
    return clock.result(spec, {"facts": facts, "log": trainer.state.log_history,
        "import_s": import_s, "to_first_step_s": clock.begin[0] - _T_PROCESS, "setup_s": clock.begin[0] - t_start,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
    })


def run_child(framework: str, spec: dict, log: Path) -> dict:
    spec_path = log.with_suffix(".spec.json")
    out_path = log.with_suffix(".result.json")
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               OMP_NUM_THREADS=str(spec["threads"]), PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, __file__, "--child", framework, "--spec", str(spec_path),
                               "--result", str(out_path)], stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        sys.exit(f"{framework} child failed (exit {proc.returncode}); its log:\n{log.read_text()[-4000:]}")
    result = json.loads(out_path.read_text())
    result["process_s"] = time.perf_counter() - t0
    return result


# ---------------------------------------------------------------------------------------- report
def summarise(result: dict, warmup: int) -> dict:
    begin, end = result["begin"], result["end"]
    n = len(begin)
    timed = range(warmup, n)
    wall = [begin[i + 1] - begin[i] for i in range(warmup, n - 1)]
    step = [end[i] - begin[i] for i in timed]
    phases: dict[str, list[float]] = {}
    for i in timed:
        for k, v in result["phases"][i].items():
            phases.setdefault(k, []).append(v)
    gen = phases.get("generate", [])
    tokens = [result["tokens"][i] for i in timed]
    return {
        "wall": statistics.median(wall), "step": statistics.median(step),
        "phases": {k: statistics.median(v) for k, v in phases.items()},
        "gen_tok_s": sum(tokens) / sum(gen) if gen and sum(gen) > 0 else float("nan"),
        "tokens_per_step": sum(tokens) / len(tokens),
        "reward_last10": statistics.mean(result["rewards"][-10:]),
        "reward_all": statistics.mean(result["rewards"]),
        "peak_rss_mib": result["peak_rss_mib"], "import_s": result["import_s"],
        "to_first_step_s": result["to_first_step_s"], "process_s": result["process_s"],
        "n_wall": len(wall),
    }


def _spread(values: list[float], fmt: str = "{:.4f}") -> str:
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}"


def report(runs: dict[str, list[dict]], args, built: dict, versions: dict, profiles: dict | None = None,
           load: str = "") -> str:
    out = []
    out.append(
        f"model: Qwen2 {built['variant']} ({built['parameters']:,} parameters, vocab {built['vocab']}), "
        f"pretrain steps {built['pretrain_steps']}"
        + (f" (train greedy acc {built['pretrain_train_greedy_acc']:.3f})" if built["pretrain_steps"] else "")
        + f"; 8 prompts x 8 samples, max completion {args.max_new_tokens}"
        + (f" (forced to exactly {args.force_length})" if args.force_length else "")
        + f", lr {args.lr} constant; {args.repeats} repeats x {args.steps} steps, first {args.warmup} not timed"
    )
    out.append("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items())
               + f"; torch threads {args.threads}, {os.cpu_count()} CPUs; load average {load}")
    out.append("")
    out.append("| framework | median s/step (wall) | repeat medians | median step body s | gen tok/s | "
               "tokens/step | reward, last 10 steps | peak RSS MiB | import s | start to 1st step s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    pooled: dict[str, float] = {}
    for fw in FRAMEWORKS:
        if fw not in runs:
            continue
        s = [summarise(r, args.warmup) for r in runs[fw]]
        walls = [w for r in runs[fw] for w in _wall_list(r, args.warmup)]
        steps = [x for r in runs[fw] for x in _step_list(r, args.warmup)]
        pooled[fw] = statistics.median(walls)
        rewards = [x["reward_last10"] for x in s]
        out.append(
            f"| {fw} | {statistics.median(walls):.4f} | {_spread([x['wall'] for x in s])} | "
            f"{statistics.median(steps):.4f} | {statistics.median([x['gen_tok_s'] for x in s]):,.0f} | "
            f"{statistics.mean([x['tokens_per_step'] for x in s]):.0f} | "
            f"{statistics.mean(rewards):.3f} ({', '.join(f'{r:.3f}' for r in rewards)}) | "
            f"{max(x['peak_rss_mib'] for x in s):.0f} | {statistics.median([x['import_s'] for x in s]):.2f} | "
            f"{statistics.median([x['to_first_step_s'] for x in s]):.2f} |"
        )
    if len(pooled) == 2:
        ratios = [summarise(t, args.warmup)["wall"] / summarise(r, args.warmup)["wall"]
                  for t, r in zip(runs["trl"], runs["reinforge"], strict=True)]
        out.append("")
        out.append(f"speed-up (TRL s/step / reinforge s/step, pooled medians): {pooled['trl'] / pooled['reinforge']:.2f}x"
                   f" (per repeat: {', '.join(f'{x:.2f}x' for x in ratios)})")
    out.append("")
    for fw in FRAMEWORKS:
        if fw in runs:
            facts = runs[fw][0]["facts"]
            others = [r["cpu"].get("others", float("nan")) for r in runs[fw]]
            steal = [r["cpu"].get("steal", float("nan")) for r in runs[fw]]
            own = [r["cpu"].get("self", float("nan")) for r in runs[fw]]
            out.append(f"{fw}: " + ", ".join(f"{k}={v}" for k, v in facts.items())
                       + f"; CPU in cores during the timed steps: own {_spread(own, '{:.2f}')}, "
                       f"other processes {_spread(others, '{:.2f}')}, steal {_spread(steal, '{:.2f}')}")
    out.append("")
    out.append("where a step goes (median s per step over all timed steps; phases are nested as indented):")
    for fw in FRAMEWORKS:
        if fw not in runs:
            continue
        ph: dict[str, list[float]] = {}
        for r in runs[fw]:
            for i in range(args.warmup, len(r["begin"])):
                for k, v in r["phases"][i].items():
                    ph.setdefault(k, []).append(v)
        med = {k: statistics.median(v) for k, v in ph.items()}
        if fw == "reinforge":
            rows = [("step (time/step_s)", med["step_metric"]), ("  generate (rollout engine)", med["generate"]),
                    ("  reward", med["reward"]), ("  build batch + update + weight sync", med["batch+update+sync"]),
                    ("    learner.update (fwd, bwd, AdamW)", med["learner.update"]),
                    ("    weight sync into the engine", med["weight_sync"])]
        else:
            step = statistics.median([x for r in runs[fw] for x in _step_list(r, args.warmup)])
            known = med["generate_and_score"] + med["loss_forward"] + med["backward"]
            rows = [("step (on_step_begin -> on_step_end)", step),
                    ("  generate + score (_generate_and_score_completions)", med["generate_and_score"]),
                    ("    HF generate (_generate_single_turn)", med["generate"]), ("    reward", med["reward"]),
                    ("  loss forward (_compute_loss)", med["loss_forward"]), ("  backward", med["backward"]),
                    ("  rest: clip, AdamW, scheduler, callbacks (difference)", step - known)]
        out.append(f"  {fw}:")
        for name, v in rows:
            out.append(f"    {name:<58} {v:.4f}")
    for fw, prof in (profiles or {}).items():
        out.append("")
        out.append(f"cProfile of {fw} (separate profiling run), steps {args.warmup + 1}-{args.warmup + args.profile_steps}, "
                   "s per step under the profiler, by cumulative time:")
        out.append(f"    {'cumulative':>10} {'own':>8} {'calls':>6}  function")
        for name, cum, own, calls in prof["profile"]:
            out.append(f"    {cum:10.4f} {own:8.4f} {calls:6d}  {name[:110]}")
        out.append("")
        out.append(f"torch.profiler of {fw}, the next {args.profile_steps} steps (totals over those steps), "
                   "by self CPU time:")
        out.extend("    " + line for line in prof["torch_profile"].splitlines())
    return "\n".join(out)


def _wall_list(r: dict, warmup: int) -> list[float]:
    return [r["begin"][i + 1] - r["begin"][i] for i in range(warmup, len(r["begin"]) - 1)]


def _step_list(r: dict, warmup: int) -> list[float]:
    return [r["end"][i] - r["begin"][i] for i in range(warmup, len(r["begin"]))]


def _save(path: Path | None, args, built: dict, runs: dict, profiles: dict | None = None) -> None:
    if path is not None:
        path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "built": built,
                                    "runs": runs, "profiles": profiles or {}}))


def _spec(work: Path, args, repeat: int, profile: bool) -> dict:
    return {"workdir": str(work), "tag": f"r{repeat}" + ("-profile" if profile else ""), "seed": repeat,
            "steps": args.steps, "warmup": args.warmup, "lr": args.lr, "max_new_tokens": args.max_new_tokens,
            "force_length": args.force_length, "profile_steps": args.profile_steps if profile else 0,
            "threads": args.threads}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of every repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variant", choices=["0.5M", "4.2M"], default="0.5M")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--force-length", type=int, default=0, help="every completion exactly this many tokens (0 = off)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--pretrain-steps", type=int, default=0, help="next-token pretraining of the random model first")
    p.add_argument("--seed", type=int, default=0, help="model init seed; repeat r runs both frameworks with seed r")
    p.add_argument("--retries", type=int, default=2,
                   help="re-run a repeat when other processes used > 0.25 cores during its timed steps")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads in both frameworks")
    p.add_argument("--frameworks", default="trl,reinforge")
    p.add_argument("--profile", action="store_true", help="one more (untimed) run per framework under cProfile and torch.profiler")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--json", type=Path, help="write all raw per-step results here")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        spec = json.loads(args.spec.read_text())
        result = (child_trl if args.child == "trl" else child_reinforge)(spec)
        args.result.write_text(json.dumps(result))
        return

    if args.force_length:
        args.max_new_tokens = args.force_length
    if args.steps < args.warmup + 12:
        p.error("--steps must leave at least 12 timed steps after --warmup")
    if args.profile and args.steps < args.warmup + 2 * args.profile_steps + 1:
        p.error("--profile needs --steps >= --warmup + 2 * --profile-steps + 1")
    frameworks = [f for f in args.frameworks.split(",") if f]
    work = Path(tempfile.mkdtemp(prefix="bench-vs-trl-"))
    import trl_baseline

    built = trl_baseline.build_workdir(work, args.variant, args.seed, args.pretrain_steps)
    print(f"work directory {work}: {json.dumps(built)}", flush=True)
    runs: dict[str, list[dict]] = {f: [] for f in frameworks}
    load_before = os.getloadavg()[0]
    reruns: list[str] = []
    for r in range(args.repeats):
        order = frameworks if r % 2 == 0 else frameworks[::-1]
        for fw in order:
            for attempt in range(args.retries + 1):
                spec = _spec(work, args, r, profile=False)
                spec["tag"] += f"-a{attempt}"  # a fresh run directory per attempt
                res = run_child(fw, spec, work / f"{fw}-r{r}-a{attempt}.log")
                others = res["cpu"].get("others", 0.0)
                if others <= CONTENDED_CORES or attempt == args.retries:
                    break
                reruns.append(f"{fw} repeat {r} (other processes used {others:.2f} cores)")
                print(f"repeat {r} {fw}: other processes used {others:.2f} cores during the timed steps; "
                      "running it again", flush=True)
            runs[fw].append(res)
            _save(args.json, args, built, runs)  # as we go: a killed invocation keeps what it measured
            s = summarise(res, args.warmup)
            print(f"repeat {r} {fw:9s}: median {s['wall']:.4f} s/step (body {s['step']:.4f}), "
                  f"{s['tokens_per_step']:.0f} tokens/step, reward last 10 {s['reward_last10']:.3f}, "
                  f"peak RSS {s['peak_rss_mib']:.0f} MiB, process {s['process_s']:.1f} s", flush=True)
    load = f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after (1 min)"
    profiles = {}
    if args.profile:
        for fw in frameworks:
            profiles[fw] = run_child(fw, _spec(work, args, 0, profile=True), work / f"{fw}-profile.log")
    versions = {}
    for fw in frameworks:
        versions.update(runs[fw][0]["versions"])
    print()
    print(report(runs, args, built, versions, profiles, load))
    if reruns:
        print("\nrepeats run again because another process was computing: " + "; ".join(reruns))
    contended = [f"{fw} repeat {i}" for fw in frameworks for i, r in enumerate(runs[fw])
                 if r["cpu"].get("others", 0.0) > CONTENDED_CORES]
    if contended:
        print(f"WARNING: other processes used > {CONTENDED_CORES} cores during: " + ", ".join(contended))
    _save(args.json, args, built, runs, profiles)
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"\nkept {work}")


if __name__ == "__main__":
    main()
