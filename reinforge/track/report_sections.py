"""The report's evaluation, samples and config sections (HTML fragments of reinforge/track/report.py)."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

SAMPLES_PER_STEP = 8  # rows shown from the first and from the last step of samples.jsonl


MAX_TEXT = 2000  # characters of a prompt or completion shown in the samples table


def _number(value: Any) -> float | None:
    """A metric value as a float; JSONL writes non-finite floats as strings ('nan', 'inf')."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value)
    return None


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    v = _number(value)
    if v is None:
        return _e(value)
    if v.is_integer() and abs(v) < 1e9:
        return str(int(v))
    return f"{v:.4g}"


def _img(path: Path, alt: str, note: str = "") -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_e(alt)}">'
            f"<figcaption>{_e(alt)} ({_e(path.name)}){_e(note)}</figcaption></figure>")


def _eval_columns(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Evaluation results by label: ``before``/``after`` (a run's eval.json) or ``models`` (reinforge eval)."""
    source = data.get("models") if isinstance(data.get("models"), dict) else data
    return {str(k): v for k, v in source.items() if isinstance(v, dict) and "greedy_accuracy" in v}


def _eval_rows(columns: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(label, key in the result, key in confidence_intervals_95) for every metric any column has."""
    rows = [("greedy accuracy", "greedy_accuracy", "greedy_accuracy")]
    samples = {c.get("samples") for c in columns.values() if c.get("mean_at_n") is not None}
    if samples:
        rows.append((f"mean@{'/'.join(map(str, sorted(samples)))}", "mean_at_n", "mean@"))
    for kind, label in (("pass_at_k", "pass"), ("maj_at_k", "maj")):
        ks = sorted({int(k) for c in columns.values() for k in (c.get(kind) or {})})
        rows += [(f"{label}@{k}", f"{kind}.{k}", f"{label}@{k}") for k in ks]
    return rows


def _eval_value(result: dict[str, Any], key: str, ci_key: str) -> str:
    if "." in key:
        kind, k = key.split(".")
        value = (result.get(kind) or {}).get(k)
    else:
        value = result.get(key)
    if value is None:
        return "–"
    cis = result.get("confidence_intervals_95") or {}
    if ci_key == "mean@":
        ci_key = f"mean@{result.get('samples')}"
    ci = cis.get(ci_key)
    text = _fmt(value)
    if isinstance(ci, list | tuple) and len(ci) == 2:
        text += f" <small>[{_fmt(ci[0])}, {_fmt(ci[1])}]</small>"
    return text


def _breakdown_table(columns: dict[str, dict[str, Any]]) -> str:
    """Per-group scores (task metadata such as ``difficulty``): greedy accuracy and mean@n by column."""
    keys = list(dict.fromkeys(k for c in columns.values() for k in (c.get("breakdown") or {})))
    if not keys:
        return ""
    rows = []
    for key in keys:
        groups = list(dict.fromkeys(g for c in columns.values() for g in (c.get("breakdown") or {}).get(key, {})))
        for group in groups:
            cells, prompts = [], set()
            for c in columns.values():
                metrics = (c.get("breakdown") or {}).get(key, {}).get(group)
                if metrics is None:
                    cells.append("<td>–</td>")
                    continue
                prompts.add(int(metrics.get("prompts", 0)))
                text = _fmt(metrics.get("greedy_accuracy"))
                mean = metrics.get(f"mean@{c.get('samples')}")
                if mean is not None:
                    text += f" / {_fmt(mean)}"
                cells.append(f'<td class="num">{text}</td>')
            n = "/".join(map(str, sorted(prompts)))
            rows.append(f"<tr><th>{_e(key)} = {_e(group)} <small>({n} prompts)</small></th>{''.join(cells)}</tr>")
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    return (f'<h3>By task metadata</h3><table class="eval breakdown"><tr><th>group: greedy / mean@n</th>{head}</tr>'
            f"{''.join(rows)}</table>")


def _eval_section(data: dict[str, Any] | None, passk: Path | None) -> str:
    parts = ['<section id="eval"><h2>Evaluation</h2>']
    if data is None:
        parts.append('<p class="note">No eval.json in the run directory (set eval.final_samples to get '
                     "pass@k / maj@k before and after training).</p>")
    else:
        columns = _eval_columns(data)
        if columns:
            head = "".join(f"<th>{_e(c)}</th>" for c in columns)
            meta = "".join(f"<td>{_e(c.get('num_prompts', '?'))} prompts, {_e(c.get('samples', '?'))} samples, "
                           f"T={_e(c.get('temperature', '?'))}</td>" for c in columns.values())
            body = "".join(
                f"<tr><th>{_e(label)}</th>" + "".join(f'<td class="num">{_eval_value(c, key, ci)}</td>'
                                                      for c in columns.values()) + "</tr>"
                for label, key, ci in _eval_rows(columns))
            parts.append(f'<table class="eval"><tr><th>metric (95% CI)</th>{head}</tr>'
                         f"<tr><th>setting</th>{meta}</tr>{body}</table>")
            parts.append(_breakdown_table(columns))
            parts.append(_examples_table(columns))
        else:
            parts.append('<p class="note">eval.json has no greedy_accuracy results; raw content below.</p>')
        raw = json.dumps(data, indent=2, sort_keys=False)
        parts.append(f"<details><summary>eval.json</summary><pre>{_e(raw)}</pre></details>")
    if passk is not None:
        parts.append(f'<div class="grid">{_img(passk, "pass@k curves before and after training")}</div>')
    parts.append("</section>")
    return "".join(parts)


# A picture in eval.json is shown only as an inline PNG/JPEG/GIF/WebP data URL: nothing the page loads from elsewhere.
SAFE_IMAGE_URL = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}")


def _pictures(urls: Any) -> str:
    """``<img>`` tags of a sample's pictures (safe data URLs only; anything else is named, not loaded)."""
    tags = []
    for url in urls if isinstance(urls, list) else []:
        if isinstance(url, str) and SAFE_IMAGE_URL.fullmatch(url):
            tags.append(f'<img class="sample" src="{url}" alt="the prompt\'s picture">')
        else:
            tags.append('<span class="note">(a picture that is no inline image data URL: not shown)</span>')
    return "".join(tags)


def _examples_table(columns: dict[str, dict[str, Any]]) -> str:
    """Each column's greedy completions of its first prompts (``examples``), their pictures beside them."""
    parts = []
    for label, c in columns.items():
        rows = [r for r in c.get("examples") or [] if isinstance(r, dict)]
        if not rows:
            continue
        with_pictures = any(r.get("images") for r in rows)
        head = ("<tr><th>task</th>" + ("<th>pictures</th>" if with_pictures else "")
                + "<th>prompt</th><th>answer</th><th>greedy completion</th><th>correct</th></tr>")
        body = "".join(
            f"<tr><td>{_e(r.get('task_id', ''))}</td>" + (f"<td>{_pictures(r.get('images'))}</td>" if with_pictures else "")
            + f"<td><pre>{_e(_clip(r.get('prompt')))}</pre></td><td>{_e(r.get('answer', ''))}</td>"
            f"<td><pre>{_e(_clip(r.get('completion')))}</pre></td><td>{'yes' if r.get('correct') else 'no'}</td></tr>"
            for r in rows)
        parts.append(f'<h3>Greedy completions: {_e(label)}</h3><table class="samples examples">{head}{body}</table>')
    return "".join(parts)


def _clip(text: Any) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + f"… [{len(s) - MAX_TEXT} more characters]"


def _samples_section(samples: list[dict[str, Any]]) -> str:
    parts = ['<section id="samples"><h2>Sample completions</h2>']
    if not samples:
        parts.append('<p class="note">No samples.jsonl (or it is empty).</p></section>')
        return "".join(parts)
    parts.append(f'<p class="note">From samples.jsonl: the first and the last step, up to {SAMPLES_PER_STEP} each.</p>')
    head = "<tr><th>step</th><th>task</th><th>reward</th><th>finish</th><th>prompt</th><th>completion</th></tr>"
    body = "".join(
        f'<tr><td class="num">{_e(r.get("step", ""))}</td><td>{_e(r.get("task_id", ""))}</td>'
        f'<td class="num">{_fmt(r.get("reward", ""))}</td><td>{_e(r.get("finish_reason", ""))}</td>'
        f"<td><pre>{_e(_clip(r.get('prompt')))}</pre></td><td><pre>{_e(_clip(r.get('completion')))}</pre></td></tr>"
        for r in samples)
    parts.append(f'<table class="samples">{head}{body}</table></section>')
    return "".join(parts)


def _config_section(config_text: str | None) -> str:
    if config_text is None:
        return '<section id="config"><h2>Resolved config</h2><p class="note">No config.yaml.</p></section>'
    return f'<section id="config"><h2>Resolved config</h2><pre class="config">{_e(config_text)}</pre></section>'
