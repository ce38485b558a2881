"""``reinforge eval --report PAGE``: the evaluation as one self-contained HTML page: each model's metrics with
their 95% intervals, the breakdown by task metadata, and the greedy completions of the first held-out prompts
with their pictures beside them (inline PNG data URLs, ``EvalResult.examples``), the same sections a run's
report shows (reinforge/track/report_sections.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reinforge.track.report import CSS, IMAGES_SCRIPT
from reinforge.track.report_sections import _e, _eval_section


def render_eval_page(result: dict[str, Any]) -> str:
    """The page of ``reinforge eval``'s result (what it writes to ``--out``: ``task``, ``samples``, ``models``)."""
    title = f"reinforge eval: {result.get('task', '?')}"
    setting = (f"{len(result.get('models') or {})} model(s), {result.get('samples', '?')} samples per prompt at "
               f"T={result.get('temperature', '?')}, seed {result.get('seed', '?')}")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>", f'<p class="note">{_e(setting)}</p>',
        _eval_section({"models": {k: {"temperature": result.get("temperature"), **v}
                                  for k, v in (result.get("models") or {}).items()}}, None),
        f"<script>{IMAGES_SCRIPT}</script>", "</body></html>",
    ]) + "\n"


def write_eval_page(result: dict[str, Any], out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_eval_page(result), encoding="utf-8")
    return out
