"""`reinforge report RUN`: one self-contained HTML page of a run (plots, samples, eval, config).

The PNGs are written to a directory beside the page (``run_dir/report/`` for ``run_dir/report.html``)
and embedded in the page as base64 data URIs, so the single HTML file reads offline and can be mailed.
No external CSS, JS or fonts.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.errors import ReinforgeError
from reinforge.track import provenance
from reinforge.track.report_sections import (
    SAMPLES_PER_STEP,
    _config_section,
    _e,
    _eval_section,
    _fmt,
    _img,
    _number,
    _samples_section,
)


@dataclass(frozen=True)
class Family:
    """One figure: the metrics drawn on it (key, label) and how."""

    slug: str
    title: str
    keys: tuple[tuple[str, str], ...]
    kind: str = "lines"  # "lines" | "stacked" (step-time split)
    log_y: bool = False  # log scale when every value is positive
    twin: tuple[str, str] | None = None  # a second metric on a right-hand axis
    prefix: str | None = None  # also plot every other metric under this prefix


FAMILIES = (
    Family("reward", "training reward", (("reward/mean", "mean (band: ± std)"), ("reward/accuracy", "accuracy"))),
    Family("heldout", "held-out accuracy", (("eval/heldout_acc", "greedy accuracy"),), prefix="eval/"),
    Family("kl", "KL divergence", (("train/kl_ref", "KL to reference"), ("train/approx_kl_old", "approx KL to old policy"))),
    Family("entropy", "policy entropy (nats/token)", (("train/entropy", "entropy"),)),
    Family("clip", "clip fraction", (("train/clip_frac", "clipped"), ("train/dual_clip_frac", "dual-clipped"),
                                     ("train/value_clip_frac", "value clipped"))),
    Family("logprob_mismatch", "|log p learner - log p sampler|",
           (("train/logprob_mismatch", "mean"), ("train/logprob_mismatch_max", "max")), log_y=True),
    Family("response_length", "response length (tokens)", (("response/length_mean", "mean length"),),
           twin=("response/truncated_frac", "truncated fraction")),
    Family("step_time", "step time split (s)", (("time/generate_s", "generation"), ("time/reward_s", "reward"),
                                                 ("time/train_s", "training")), kind="stacked"),
    Family("throughput", "throughput (tokens/s)", (("perf/tokens_per_s", "tokens/s (whole step)"),
                                                    ("perf/gen_tokens_per_s", "tokens/s (generation)"))),
    Family("loss", "training loss", (("train/loss", "loss"),)),
)


@dataclass
class Figure:
    family: Family
    png: Path | None = None
    missing: list[str] = field(default_factory=list)
    zero: list[str] = field(default_factory=list)  # logged, but 0 at every step: the run's parts never moved it


# Why a metric stays 0 for a whole run, from its resolved config (``_why_zero``): the part that would move it is off.
ZERO_BECAUSE = {
    "train/kl_ref": ("no KL term (algo.kl.coef is 0)",
                     lambda c: _get(c, "algo.kl.coef", 0) == 0 and not _get(c, "algo.kl.measure", False)),
    "train/approx_kl_old": ("one optimizer step per batch: the policy is still pi_old", lambda c: _one_update(c)),
    "train/clip_frac": ("one optimizer step per batch: the ratio is 1, nothing is clipped", lambda c: _one_update(c)),
    "train/dual_clip_frac": ("no dual clip, or nothing reached it", lambda c: True),
    "train/value_clip_frac": ("no critic, or no value clipping", lambda c: True),
}


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write ``out`` (default ``run_dir/report.html``) and its PNGs (in ``out`` without suffix, e.g.
    ``run_dir/report/``); return the HTML path."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    out = Path(out) if out is not None else run_dir / "report.html"
    img_dir = out.with_suffix("")
    img_dir.mkdir(parents=True, exist_ok=True)
    figures = [plot_family(f, records, img_dir) for f in FAMILIES]
    passk = None
    if (run_dir / "passk.png").is_file():
        passk = img_dir / "passk.png"
        if passk.resolve() != (run_dir / "passk.png").resolve():
            shutil.copyfile(run_dir / "passk.png", passk)
    config_text = _read_text(run_dir / "config.yaml")
    page = render_page(run_dir, records, figures, passk, config_text,
                       _read_eval(run_dir / "eval.json"), _read_samples(run_dir / "samples.jsonl"))
    out.write_text(page, encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------- reading
def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ReinforgeError(f"{run_dir}: not a run directory (no metrics.jsonl in it)")
    return _read_jsonl(path)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReinforgeError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ReinforgeError(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def _read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _read_eval(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ReinforgeError(f"{path}: not valid JSON ({e.msg})") from None
    return data if isinstance(data, dict) else {"value": data}


def _read_samples(path: Path) -> list[dict[str, Any]]:
    """Rows of the first and the last step of samples.jsonl (at most SAMPLES_PER_STEP each)."""
    rows = _read_jsonl(path) if path.is_file() else []
    steps = sorted({r.get("step", 0) for r in rows})
    chosen = steps[:1] + steps[-1:] if len(steps) > 1 else steps
    return [r for s in chosen for r in [r for r in rows if r.get("step", 0) == s][:SAMPLES_PER_STEP]]


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], v) for r in records if "step" in r and (v := _number(r.get(key))) is not None]
    return [float(s) for s, _ in points], [v for _, v in points]


# ---------------------------------------------------------------------------------------- plots
def _family_keys(family: Family, records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    keys = list(family.keys)
    if family.prefix:
        named = {k for k, _ in keys}
        extra = sorted({k for r in records for k in r if k.startswith(family.prefix) and k not in named})
        keys += [(k, k.removeprefix(family.prefix)) for k in extra]
    return keys


def plot_family(family: Family, records: list[dict[str, Any]], img_dir: Path) -> Figure:
    """Draw one family's figure to ``img_dir/<slug>.png``; no figure if none of its metrics is present."""
    keys = _family_keys(family, records)
    logged = [(k, label) for k, label in keys if series(records, k)[0]]
    zero = [k for k, _ in logged if not any(series(records, k)[1])]
    present = [(k, label) for k, label in logged if k not in zero]
    fig_info = Figure(family, missing=[k for k, _ in keys if (k, _) not in logged], zero=zero)
    if not present:
        return fig_info
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if family.kind == "stacked":
        _stacked(ax, records, present)
    else:
        _lines(ax, records, present, family.log_y)
    if family.twin and (twin := series(records, family.twin[0]))[0]:
        ax2 = ax.twinx()
        ax2.plot(*twin, color="tab:red", linestyle="--", label=family.twin[1])
        ax2.set_ylabel(family.twin[1], color="tab:red")
        ax2.set_ylim(-0.02, 1.02)
    ax.set_xlabel("step")
    ax.set_title(family.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig_info.png = img_dir / f"{family.slug}.png"
    fig.savefig(fig_info.png, dpi=100)
    plt.close(fig)
    return fig_info


def _lines(ax: Any, records: list[dict[str, Any]], present: list[tuple[str, str]], log_y: bool) -> None:
    all_values = []
    for key, label in present:
        xs, ys = series(records, key)
        all_values += ys
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        if key == "reward/mean":
            _, std = series(records, "reward/std")
            if len(std) == len(ys):
                ax.fill_between(xs, [y - s for y, s in zip(ys, std, strict=True)],
                                [y + s for y, s in zip(ys, std, strict=True)], alpha=0.2)
    if log_y and all(math.isfinite(v) and v > 0 for v in all_values):
        ax.set_yscale("log")


def _stacked(ax: Any, records: list[dict[str, Any]], present: list[tuple[str, str]]) -> None:
    rows = [r for r in records if "step" in r and any(_number(r.get(k)) is not None for k, _ in present)]
    xs = [float(r["step"]) for r in rows]
    stacks = [[_number(r.get(k)) or 0.0 for r in rows] for k, _ in present]
    if len(xs) > 1:
        ax.stackplot(xs, *stacks, labels=[label for _, label in present], alpha=0.8)
    else:
        bottom = 0.0
        for values, (_, label) in zip(stacks, present, strict=True):
            ax.bar(xs, values, bottom=bottom, label=label)
            bottom += values[0]
    ax.set_ylabel("seconds per step")


# ---------------------------------------------------------------------------------------- page
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1300px;padding:1em 2em;
     color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
nav a{margin-right:1em} table{border-collapse:collapse;font-size:.9em} td,th{border:1px solid #ddd;padding:3px 8px;
vertical-align:top;text-align:left} th{background:#f3f3f3} .num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}
figure{margin:0} figure img{width:100%;height:auto;border:1px solid #eee} figcaption{font-size:.8em;color:#555}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em} td pre{margin:0;padding:0;background:none;
white-space:pre-wrap;word-break:break-word;max-width:40em} .note{color:#777;font-size:.9em}
img.sample{width:96px;height:auto;image-rendering:pixelated;border:1px solid #ddd;margin:0 4px 4px 0}
"""

# Sets data-images-loaded="true" on <body> once every <img> has decoded (headless tests read it).
IMAGES_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute("data-images-total", String(imgs.length));
  document.body.setAttribute("data-images-ok", String(ok.length));
  if (imgs.length > 0 && ok.length === imgs.length) document.body.setAttribute("data-images-loaded", "true");
});
"""


def render_page(run_dir: Path, records: list[dict[str, Any]], figures: list[Figure], passk: Path | None,
                config_text: str | None, eval_data: dict[str, Any] | None, samples: list[dict[str, Any]]) -> str:
    name = run_dir.resolve().name
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>reinforge report: {_e(name)}</title><style>{CSS}</style></head><body>",
        f"<h1>reinforge report: {_e(name)}</h1>",
        '<nav><a href="#summary">summary</a><a href="#plots">plots</a><a href="#eval">evaluation</a>'
        '<a href="#samples">samples</a><a href="#config">config</a></nav>',
        _summary_section(run_dir, records, config_text),
        _plots_section(figures, _parse_yaml(config_text)),
        _eval_section(eval_data, passk),
        _samples_section(samples),
        _config_section(config_text),
        f"<script>{IMAGES_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _last(records: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    xs, ys = series(records, key)
    return (xs[-1], ys[-1]) if xs else None


def _summary_section(run_dir: Path, records: list[dict[str, Any]], config_text: str | None) -> str:
    rows: list[tuple[str, str]] = [("run directory", _e(run_dir.resolve()))]
    cfg = _parse_yaml(config_text)
    algo = cfg.get("algo") if isinstance(cfg.get("algo"), dict) else {}
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
    if cfg:
        rows.append(("model / task", f"{_e(model.get('path', '?'))} / {_e(task.get('kind', '?'))}"))
        name = {k: v.get("name") if isinstance(v := algo.get(k), dict) else v
                for k in ("advantage", "policy_loss", "loss_agg")}  # a part: a name or {name, options}
        rows.append(("algorithm", _e(f"preset {cfg.get('preset')}: advantage {name['advantage']}, "
                                     f"policy loss {name['policy_loss']}, loss agg {name['loss_agg']}")))
    steps = [r["step"] for r in records if isinstance(r.get("step"), int | float)]
    rows.append(("steps", _fmt(max(steps)) if steps else "none"))
    if reward := _last(records, "reward/mean"):
        _, ys = series(records, "reward/mean")
        tail = ys[-10:]
        rows.append(("final reward", f"{reward[1]:.4f} (step {reward[0]:.0f}; mean of the last {len(tail)} "
                                     f"steps {sum(tail) / len(tail):.4f})"))
    xs, acc = series(records, "eval/heldout_acc")
    if acc:
        before = f"{acc[0]:.4f} (step {xs[0]:.0f})" if xs[0] == 0 else "n/a (no step-0 evaluation)"
        rows.append(("held-out greedy accuracy", f"before {before} → after {acc[-1]:.4f} (step {xs[-1]:.0f})"))
    cut = [r for r in records if r.get("run/stopped_by_time_limit")]
    if cut:
        rows.append(("stopped by the time limit", f"at step {_fmt(cut[-1]['step'])} of "
                     f"{_fmt(cut[-1].get('run/steps_planned', float('nan')))} planned: the learning-rate schedule "
                     "was cut, so this result depends on the machine's speed (train.time_limit_s)"))
    times = {k: sum(series(records, f"time/{k}_s")[1]) for k in ("step", "generate", "reward", "train")}
    if times["step"] > 0:
        split = ", ".join(f"{k} {100 * times[k] / times['step']:.0f}%" for k in ("generate", "reward", "train"))
        rows.append(("total time", f"{_duration(times['step'])} in training steps ({split}; "
                                   "evaluation and checkpoints not included)"))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<section id="summary"><h2>Summary</h2><table>{body}</table>{_provenance_table(run_dir)}</section>'


def _provenance_table(run_dir: Path) -> str:
    """Where the run came from (provenance.json): every session, the first start and each resume."""
    sessions = provenance.read(run_dir)
    if not sessions:
        return "<p>No provenance.json: a run directory from before reinforge recorded provenance.</p>"
    tables = []
    for i, entry in enumerate(sessions):
        title = "started" if i == 0 else f"resume {i}"
        body = "".join(f"<tr><th>{k}</th><td>{_e(v)}</td></tr>" for k, v in provenance.summary(entry))
        tables.append(f"<h3>Provenance: {title}</h3><table>{body}</table>")
    return "".join(tables)


def _duration(seconds: float) -> str:
    m, s = divmod(seconds, 60)
    h, m = divmod(int(m), 60)
    return f"{h}h {m:02d}m {s:04.1f}s" if h else f"{m}m {s:04.1f}s" if m else f"{s:.1f} s"


def _parse_yaml(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _plots_section(figures: list[Figure], config: dict[str, Any]) -> str:
    drawn = [_img(f.png, f.family.title, f"; not logged: {', '.join(f.missing)}" if f.missing else "")
             for f in figures if f.png is not None]
    skipped = [f for f in figures if f.png is None and f.missing and not f.zero]
    parts = ['<section id="plots"><h2>Training curves</h2>', f'<div class="grid">{"".join(drawn)}</div>']
    if skipped:
        items = "".join(f"<li>{_e(f.family.title)}: none of {_e(', '.join(f.missing))} in metrics.jsonl</li>"
                        for f in skipped)
        parts.append(f'<p class="note">Not plotted (metrics absent):</p><ul class="note skipped">{items}</ul>')
    zero = [(k, f.family.title) for f in figures for k in f.zero]
    if zero:
        items = "".join(f"<li>{_e(k)} ({_e(title)}): {_e(_why_zero(k, config))}</li>" for k, title in zero)
        parts.append(f'<p class="note">Not drawn: 0 at every step, the run did not use what moves them:</p>'
                     f'<ul class="note zero">{items}</ul>')
    parts.append("</section>")
    return "".join(parts)


def _why_zero(key: str, config: dict[str, Any]) -> str:
    reason, applies = ZERO_BECAUSE.get(key, ("", lambda c: False))
    return reason if applies(config) else "0 at every step"


def _get(config: dict[str, Any], dotted: str, default: Any) -> Any:
    for part in dotted.split("."):
        config = config.get(part, {}) if isinstance(config, dict) else {}
    return config if config != {} else default


def _one_update(config: dict[str, Any]) -> bool:
    return int(_get(config, "train.epochs", 1)) * int(_get(config, "train.minibatches", 1)) == 1


