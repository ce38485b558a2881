"""`reinforge train | sft | rm | prm | eval | compare | report | serve | service | export | algos | doctor`: one entry point. Heavy modules are imported inside commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="reinforge: reinforcement-learning post-training for language models.",
)


def _fail(message: str) -> None:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


def _run_guarded(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    from reinforge.errors import ReinforgeError

    try:
        return fn(*args, **kwargs)
    except ReinforgeError as e:
        _fail(str(e))


@app.command(context_settings={"allow_extra_args": False})
def train(
    args: Annotated[
        list[str] | None,
        typer.Argument(help="[RECIPE] [key.path=value ...]: a recipe file or shipped name (default: 'default'), "
                       "then dotted overrides, e.g. algo.policy_loss.clip_high=0.28 train.steps=50"),
    ] = None,
    resume: Annotated[Path | None, typer.Option(help="continue the run in this run directory")] = None,
) -> None:
    """Train a policy with RL. With no arguments: the default CPU recipe (GRPO, tiny model, arithmetic).

    Data-parallel: train.world_size=N (N processes on this machine), or under
    `torchrun --nproc_per_node N -m reinforge.cli train ...` (docs/distributed.md)."""
    args = args or []
    overrides = [a for a in args if "=" in a]
    recipes = [a for a in args if "=" not in a]
    if len(recipes) > 1:
        _fail(f"expected at most one recipe, got {recipes}; overrides look like key.path=value")
    if resume is not None and recipes:
        _fail("--resume continues a run with its saved config; give overrides only, not a recipe")
    if recipes and _train_classic(recipes[0], overrides):
        return

    def go() -> None:
        from rich.console import Console

        from reinforge.config import load_config
        from reinforge.learn import distributed
        from reinforge.orchestrate.run import train as run_train

        console = Console()
        cfg = None if resume is not None else load_config(recipes[0] if recipes else None, overrides)
        # train.world_size=N spawns N processes; under torchrun every rank runs this command
        result = run_train(cfg, resume=resume, overrides=overrides)
        if not distributed.is_main():
            return
        before = f"{result.heldout_before:.3f}" if result.heldout_before is not None else "n/a (resumed)"
        console.print(
            f"\n[bold]done[/] after {result.steps} steps. held-out greedy accuracy: {before} -> "
            f"[bold]{result.heldout_after:.3f}[/]\nrun directory: {result.run_dir}", highlight=False,
        )

    _run_guarded(go)


def _train_classic(recipe: str, overrides: list[str]) -> bool:
    """Run ``recipe`` if it is a classic one (a top-level ``classic:`` section: Gymnasium agents,
    docs/classic.md); False leaves it to the LLM path."""
    from reinforge.classic.config import classic_recipe_path

    path = _run_guarded(classic_recipe_path, recipe)
    if path is None:
        return False

    def go() -> None:
        from reinforge.classic.config import load_classic_config
        from reinforge.classic.run import train_classic

        result = train_classic(load_classic_config(path, overrides))
        ret = f"{result.eval_return:.1f}" if result.eval_return is not None else "n/a"
        typer.echo(f"\ndone after {result.updates} updates ({result.env_steps} environment steps, stopped by "
                   f"{result.stopped}). evaluation return: {ret}\nrun directory: {result.run_dir}")

    _run_guarded(go)
    return True


@app.command(context_settings={"allow_extra_args": False})
def sft(
    data: Annotated[str, typer.Option(help="demonstrations: a JSONL/CSV/Parquet file or datasets directory "
                                           "(chat 'messages', or 'prompt' + 'completion'), or 'task' for the "
                                           "recipe task's reference answers")],
    args: Annotated[list[str] | None, typer.Argument(help="[RECIPE] [key.path=value ...] as for train")] = None,
) -> None:
    """Supervised fine-tuning on demonstrations (assistant-only loss): `reinforge train` with the nll term
    alone and demonstrations.path=DATA, so checkpoints, metrics, evaluation and report are a run's (docs/sft.md)."""
    args = args or []
    recipe = [a for a in args if "=" not in a]
    train([*recipe, *SFT_OVERRIDES, f"demonstrations.path={data}", *[a for a in args if "=" in a]], resume=None)


def _listing():  # type: ignore[no-untyped-def]
    from reinforge.catalogue import print_listing

    return print_listing


def _recipe_and_overrides(args: list[str] | None) -> tuple[str | None, list[str]]:
    recipes = [a for a in args or [] if "=" not in a]
    if len(recipes) > 1:
        _fail(f"expected at most one recipe, got {recipes}; overrides look like key.path=value")
    return (recipes[0] if recipes else None), [a for a in args or [] if "=" in a]


@app.command(context_settings={"allow_extra_args": False})
def rm(
    args: Annotated[list[str] | None, typer.Argument(
        help="[RECIPE] [key.path=value ...]: a reward-model recipe file or shipped name (default: "
             "arithmetic_nearmiss), then dotted overrides, e.g. data.path=pairs.jsonl train.steps=200")] = None,
) -> None:
    """Train a reward model on preference pairs (Bradley-Terry; margins, centering, ensembles): an HF
    sequence-classification directory the reward_model reward term loads (docs/rewards.md)."""
    recipe, overrides = _recipe_and_overrides(args)

    def go() -> None:
        from reinforge.rm.config import load_rm_config
        from reinforge.rm.train import train_reward_model

        result = train_reward_model(load_rm_config(recipe or "arithmetic_nearmiss", overrides))
        typer.echo(f"\ndone after {result.steps} steps. reward model: "
                   f"{result.model_dirs[0] if len(result.model_dirs) == 1 else result.run_dir / 'ensemble.json'}\n"
                   f"run directory: {result.run_dir}")

    _run_guarded(go)


@app.command(context_settings={"allow_extra_args": False})
def prm(
    args: Annotated[list[str] | None, typer.Argument(
        help="[RECIPE] [key.path=value ...]: a process-reward-model recipe file, then dotted overrides, e.g. "
             "data.path=steps.jsonl train.steps=200")] = None,
) -> None:
    """Train a process reward model on step-labelled completions (Math-Shepherd's per-step loss): an HF
    token-classification directory the prm step verifier loads (docs/rewards.md)."""
    recipe, overrides = _recipe_and_overrides(args)

    def go() -> None:
        from reinforge.rm.config import load_prm_config
        from reinforge.rm.prm import train_process_reward_model

        result = train_process_reward_model(load_prm_config(recipe, overrides))
        typer.echo(f"\ndone after {result.steps} steps. process reward model: {result.model_dir}")

    _run_guarded(go)


# What makes a run SFT: the nll term on demonstrations only (no KL, no reference model); the policy
# loss has no sampled rows to act on.
SFT_OVERRIDES = ["algo.loss_terms=[{name: nll, coef: 1.0}]", "algo.kl.coef=0", "algo.skip_equal_reward_groups=false",
                 "demonstrations.mix=false", "train.old_logprobs=recompute"]  # demonstrations have no sampler


@app.command("eval")
def eval_cmd(
    model: Annotated[list[str], typer.Option(help="HF model directory, a run directory (latest checkpoint) or "
                                                  "'tiny-base'; repeat to compare several")],
    task: Annotated[str, typer.Option(help="task source: arithmetic, or jsonl | table with --data")] = "arithmetic",
    recipe: Annotated[str | None, typer.Option(help="take the task and reward from a recipe (any source)")] = None,
    data: Annotated[Path | None, typer.Option(help="data file of prompts and answers (task=jsonl or table)")] = None,
    samples: Annotated[int, typer.Option(help="samples per prompt for mean@n, pass@k, maj@k (0 = greedy only)")] = 16,
    ks: Annotated[str | None, typer.Option(help="comma-separated k for pass@k and maj@k (default 1,2,4,8,16 <= n)")]
        = None,
    temperature: Annotated[float, typer.Option(help="sampling temperature for the samples")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option()] = 8,
    heldout_size: Annotated[int, typer.Option(help="held-out prompts (arithmetic, or a split of --data)")] = 500,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path, typer.Option(help="write the results as JSON here")] = Path("eval.json"),
    plot: Annotated[Path | None, typer.Option(help="pass@k curves of every --model on one PNG")] = None,
    engine: Annotated[str | None, typer.Option(help="rollout engine: torch, vllm, auto (default: the recipe's, "
                                                    "else torch)")] = None,
    rerank: Annotated[Path | None, typer.Option(help="a reward model (reinforge rm) or process reward model "
                                                     "(reinforge prm) directory: best-of-k of the samples")] = None,
    rerank_steps: Annotated[str, typer.Option(help="a PRM's completion score: min or prod of its steps")] = "min",
    report: Annotated[Path | None, typer.Option(help="HTML page: metrics, greedy samples with their pictures")] = None,
) -> None:
    """Greedy accuracy, mean@n, pass@k (unbiased, Chen et al. 2021), maj@k and, with --rerank, best-of-k, with
    95% bootstrap CIs."""

    def go() -> None:
        from reinforge.errors import ConfigError
        from reinforge.eval.cli_eval import run_eval

        try:
            k_list = [int(k) for k in ks.split(",")] if ks else None
        except ValueError:
            raise ConfigError(f"--ks: expected comma-separated integers, got {ks!r}") from None
        result = run_eval(model, task, data, samples, temperature, max_new_tokens, heldout_size, seed, k_list, plot,
                          recipe=recipe, engine=engine, rerank={"path": rerank, "steps": rerank_steps} if rerank else None,
                          page=report)
        out.write_text(json.dumps(result, indent=2) + "\n")

    _run_guarded(go)


@app.command()
def compare(
    runs: Annotated[list[str], typer.Argument(help="run directories (or directories of runs), or NAME=dir1,dir2 groups")],
    metric: Annotated[str, typer.Option(help="metric(s) to compare, comma-separated (each one a task)")] =
        "eval/heldout_acc",
    group_by: Annotated[str | None, typer.Option(help="config key grouping runs into algorithms (default: preset)")] =
        None,
    last_k: Annotated[int, typer.Option(help="a run's score: mean of the metric's last K values")] = 1,
    out: Annotated[Path | None, typer.Option(help="write compare.json and performance_profile.png here")] = None,
    sequential: Annotated[bool, typer.Option(help="AdaStop-style sequential test between two groups")] = False,
    n_per_batch: Annotated[int, typer.Option(help="seeds per batch of the sequential test")] = 5,
    max_batches: Annotated[int | None, typer.Option(help="looks of the sequential test (default: all seeds)")] = None,
    alpha: Annotated[float, typer.Option(help="family-wise error rate")] = 0.05,
) -> None:
    """Compare runs over seeds: mean, median, IQM with stratified bootstrap CIs, probability of improvement,
    performance profiles (Agarwal et al. 2021); optionally a sequential test (AdaStop)."""

    def go() -> None:
        from reinforge.eval.compare import run_compare

        typer.echo(run_compare(runs, metric, group_by, last_k, str(out) if out else None, sequential, n_per_batch,
                               alpha, max_batches=max_batches))

    _run_guarded(go)


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="a run directory (runs/<name>)")],
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default: RUN/report.html, PNGs in RUN/report/)")]
        = None,
) -> None:
    """One self-contained HTML page of a run: plots, samples, evaluation, config (docs/tracking.md)."""

    def go() -> None:
        from reinforge.track.report import write_report

        typer.echo(f"report: {write_report(run, out)}")

    _run_guarded(go)


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="HF model directory, a run directory (latest checkpoint) or 'tiny-base'")],
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    served_name: Annotated[str | None, typer.Option(help="model name clients send (default: --model)")] = None,
    device: Annotated[str, typer.Option()] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16")] = "float32",
    max_batch_sequences: Annotated[int, typer.Option(help="rows of one engine batch")] = 256,
    seed: Annotated[int, typer.Option()] = 0,
    max_body_bytes: Annotated[int, typer.Option(help="largest request body; 413 above")] = 8 << 20,
    max_prompts: Annotated[int, typer.Option(help="prompts in one completions request; 400 above")] = 64,
    max_sequences: Annotated[int, typer.Option(help="n x prompts of one request; 400 above")] = 512,
    max_pending: Annotated[int, typer.Option(help="requests served at once; 503 above")] = 256,
    max_images: Annotated[int, typer.Option(help="pictures in one chat request; 400 above")] = 8,
    tool_parser: Annotated[str, typer.Option(help="how chat replies' tool calls are read: hermes "
                                                  "(<tool_call>{json}</tool_call>) or none (plain text)")] = "hermes",
    engine: Annotated[str, typer.Option(help="rollout engine: torch, vllm (make install-vllm; no streaming or top "
                                             "log-probs through it) or auto (as rollout.engine)")] = "torch",
    api_key: Annotated[str | None, typer.Option(envvar="REINFORGE_API_KEY", show_default=False,
                                                help="require 'Authorization: Bearer KEY' on every route but "
                                                     "/health (401 otherwise)")] = None,
    image_root: Annotated[str | None, typer.Option(help="chat image parts may name files in this directory "
                                                        "(default: data URLs only)")] = None,
) -> None:
    """An OpenAI-compatible HTTP server over the rollout engine (/v1/models, /v1/completions, /v1/chat/completions)."""

    def go() -> None:
        from rich.console import Console

        from reinforge.errors import ReinforgeError
        from reinforge.serve.launch import build_server_app

        try:
            import uvicorn
        except ImportError:
            raise ReinforgeError("reinforge serve needs the serve extra: pip install 'reinforge[serve]'") from None
        from reinforge.serve.schema import ServeLimits

        limits = ServeLimits(max_body_bytes=max_body_bytes, max_prompts=max_prompts, max_sequences=max_sequences,
                             max_pending=max_pending, max_images=max_images)
        app_ = build_server_app(model, served_name, device, dtype, max_batch_sequences, seed, limits, tool_parser,
                                engine, api_key, image_root=image_root)
        name = app_.state.server.model_name
        Console().print(f"serving [bold]{name}[/] at http://{host}:{port}/v1 (Ctrl-C stops)", highlight=False)
        uvicorn.run(app_, host=host, port=port, log_level="warning")

    _run_guarded(go)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def service(ctx: typer.Context) -> None:
    """A Tinker-compatible training service (docs/service.md); `reinforge service --help` lists its options."""
    from reinforge.service.command import run_command

    _run_guarded(run_command, list(ctx.args))


@app.command()
def export(
    source: Annotated[Path, typer.Argument(help="a run directory (its latest checkpoint) or a checkpoint directory")],
    out: Annotated[Path, typer.Option(help="directory to write (new or empty)")],
    dtype: Annotated[str | None, typer.Option(help="LoRA merge dtype: float32 | bfloat16 | float16 "
                                                   "(default: the run's model.dtype)")] = None,
) -> None:
    """Write a trained policy as a Hugging Face model directory (a LoRA adapter merged into its base)."""

    def go() -> None:
        from reinforge.errors import ConfigError
        from reinforge.learn.checkpoint import export_model

        if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"--dtype: allowed values: float32, bfloat16, float16 (got {dtype!r})")
        written = export_model(source, out, dtype)
        auto = "AutoModelForImageTextToText" if (written / "processor_config.json").is_file() else "AutoModelForCausalLM"
        typer.echo(f"exported: {written} ({auto}.from_pretrained loads it)")

    _run_guarded(go)


@app.command()
def doctor() -> None:
    """What this machine gives reinforge: versions, CPU/GPU, and the code sandbox in use with its guarantee."""
    from reinforge.doctor import report

    typer.echo(report())


NameArg = Annotated[str | None, typer.Argument(help="one entry to show in full")]
KindOpt = Annotated[str | None, typer.Option("--kind", help="only this kind (e.g. advantage, policy_loss, preset)")]
SearchOpt = Annotated[str | None, typer.Option("--search", help="only entries whose text contains this word")]
MarkdownOpt = Annotated[bool, typer.Option("--markdown", help="a Markdown table instead of the terminal list")]


@app.command()
def algos(name: NameArg = None, kind: KindOpt = None, search: SearchOpt = None, markdown: MarkdownOpt = False,
          full: Annotated[bool, typer.Option("--full", help="every part's formula, paper and settings in wide "
                                                            "tables (the reference)")] = False) -> None:
    """The algorithm presets and parts: one line each (name, paper id, summary); NAME shows one in full."""
    if full:
        from reinforge.catalogue import print_algos_full

        print_algos_full()
        return
    from reinforge.catalogue import ALGO_KINDS, part_items, preset_items

    _run_guarded(_listing(), lambda: preset_items() + part_items(ALGO_KINDS[1:]), name, kind, search, markdown)


@app.command()
def envs(name: NameArg = None, search: SearchOpt = None, markdown: MarkdownOpt = False) -> None:
    """The environments (``env.name``) and rollout engines (``rollout.engine``); NAME shows one in full."""
    from reinforge.catalogue import part_items

    _run_guarded(_listing(), lambda: part_items(("env", "engine")), name, None, search, markdown)


@app.command()
def verifiers(name: NameArg = None, search: SearchOpt = None, markdown: MarkdownOpt = False) -> None:
    """The verifiers (``task.verifier``, reward terms) and step verifiers; NAME shows one in full."""
    from reinforge.catalogue import part_items

    _run_guarded(_listing(), lambda: part_items(("verifier", "step_verifier")), name, None, search, markdown)


@app.command()
def recipes(name: NameArg = None, search: SearchOpt = None, markdown: MarkdownOpt = False) -> None:
    """The shipped recipes (``reinforge train NAME``); NAME shows one in full."""
    from reinforge.catalogue import recipe_items

    _run_guarded(_listing(), recipe_items, name, None, search, markdown)


def main() -> None:
    app(prog_name="reinforge")


if __name__ == "__main__":
    main()
