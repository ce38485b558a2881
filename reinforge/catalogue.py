"""What the ``reinforge algos``, ``envs``, ``verifiers`` and ``recipes`` listings show: every registered
part, preset and shipped recipe as an ``Item`` (name, kind, one-line summary, paper id), laid out to fit a
terminal (``compact``, 80 columns by default), as a Markdown table (``markdown``), or one in full
(``detail``: formula, settings with defaults and descriptions, needs, paper, the presets that use it).
Everything is read from the registries and the recipe files; nothing here is written by hand."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

PRESET, RECIPE = "preset", "recipe"
# The listings of ``reinforge algos``: the algorithm's parts and the presets (the other kinds have their own).
ALGO_KINDS = ("preset", "advantage", "policy_loss", "loss_agg", "loss_term", "kl_estimator", "mismatch",
              "mixing", "reward_shaper", "task_sampler", "group_sampler", "replay", "budget", "demo_guidance",
              "classic_agent", "rm_loss", "rm_aggregate", "rm_transform", "prm_loss")
SUMMARY_LINES = 2  # a summary wraps onto at most this many lines
_ARXIV = re.compile(r"arXiv:?\s*(\d{4}\.\d{4,5})", re.IGNORECASE)


@dataclass(frozen=True)
class Item:
    """One listed thing: ``kind`` is a registry key (``parts.all_kinds``), ``preset`` or ``recipe``."""

    name: str
    kind: str
    summary: str
    paper: str = ""
    text: dict[str, str] = field(default_factory=dict, compare=False)  # heading -> text, for ``detail``

    @property
    def paper_id(self) -> str:
        """The arXiv id of its paper, else the paper's first words."""
        found = _ARXIV.search(self.paper)
        if found:
            return found.group(1)
        cited = re.search(r"([A-Z][\w-]+) et al\.? (\d{4})", self.paper)
        return f"{cited.group(1)} {cited.group(2)}" if cited else (self.paper.split() or [""])[0].rstrip(",")


_NOT_AN_END = ("al", "Dr", "e.g", "i.e", "vs", "cf", "Fig", "eq")


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (a period before a space and a capital, not after an
    abbreviation such as "et al." or "Dr."), on one line, without its period."""
    flat = " ".join((text or "").split())
    for m in re.finditer(r"\.(\s+(?=[A-Z(`])|$)", flat):
        word = flat[: m.start()].rsplit(" ", 1)[-1]
        if word not in _NOT_AN_END and not re.fullmatch(r"[A-Z]", word):
            return flat[: m.start()]
    return flat


def part_items(kinds: Iterable[str] | None = None) -> list[Item]:
    """Every registered part of ``kinds`` (registry keys; all of them by default)."""
    from reinforge.parts import all_kinds

    registries = all_kinds()
    out = []
    for kind in kinds if kinds is not None else registries:
        if kind not in registries:
            continue
        for e in registries[kind].entries():
            out.append(Item(e.name, kind, first_sentence(e.description or _doc(e.fn) or e.formula), e.paper,
                            _part_text(e)))
    return out


def _doc(fn: Any) -> str:
    """The docstring of a registered function or class (not of an instance: a spec's is its class's)."""
    return (fn.__doc__ or "") if inspect.isfunction(fn) or inspect.isclass(fn) else ""


def _part_text(entry: Any) -> dict[str, str]:
    text = {"formula": entry.formula, "description": entry.description, "paper": entry.paper,
            "needs": ", ".join(sorted(entry.needs)), "settings": _settings_text(entry.settings)}
    if _doc(entry.fn):
        text["notes"] = " ".join(_doc(entry.fn).split())
    return {k: v for k, v in text.items() if v}


def _settings_text(settings: type | None) -> str:
    if settings is None:
        return ""
    rows = []
    for name, f in settings.model_fields.items():
        rows.append(f"{name} = {f.default!r}" + (f": {f.description}" if f.description else ""))
    return "\n".join(rows)


def preset_items() -> list[Item]:
    from reinforge.config import preset_names, preset_summary

    out = []
    for name in preset_names():
        summary = preset_summary(name)
        algorithm, _, rest = summary.partition(":")
        out.append(Item(name, PRESET, first_sentence(rest.partition(").")[2] or rest) or algorithm, summary,
                        {"preset": summary, "parts": _preset_parts(name)}))
    return out


def _preset_parts(name: str) -> str:
    from reinforge.config import config_from_dict

    a = config_from_dict({"preset": name}, source=f"preset {name}").algo
    parts = [f"{k} = {_recipe_form(getattr(a, k))}" for k in ("advantage", "policy_loss", "loss_agg")]
    kl = f"kl = {a.kl.estimator} x {a.kl.coef:g} in the {a.kl.placement}" if a.kl.coef > 0 else "kl = off"
    return "\n".join([*parts, kl, *(f"loss_term = {t.name}" for t in a.loss_terms)])


def _recipe_form(part: Any) -> str:
    form = part.recipe_form() if hasattr(part, "recipe_form") else str(part)
    if isinstance(form, dict):
        return form["name"] + " (" + ", ".join(f"{k}={v}" for k, v in form.items() if k != "name") + ")"
    return form


def presets_using(name: str) -> list[str]:
    """The presets whose advantage, policy loss, aggregation or loss terms are part ``name``."""
    from reinforge.config import config_from_dict, preset_names

    out = []
    for preset in preset_names():
        a = config_from_dict({"preset": preset}, source=f"preset {preset}").algo
        names = {str(a.advantage), str(a.policy_loss), str(a.loss_agg), *(t.name for t in a.loss_terms)}
        if name in names:
            out.append(preset)
    return out


def recipe_items() -> list[Item]:
    """The shipped recipes (``reinforge train NAME``) with their leading comment."""
    from reinforge.config.recipes import RECIPES_DIR

    out = []
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        lines = path.read_text().splitlines()
        lead = lines[: next((k for k, line in enumerate(lines) if not line.startswith("#")), len(lines))]
        comment = " ".join(line.lstrip("# ").strip() for line in lead)
        out.append(Item(path.stem, RECIPE, first_sentence(comment), "", {"recipe": comment,
                                                                        "file": f"reinforge/recipes/{path.name}"}))
    return out


def search(items: Sequence[Item], word: str) -> list[Item]:
    """Items whose name, summary, paper or text contains ``word`` (case-insensitive)."""
    w = word.lower()
    return [i for i in items if w in " ".join([i.name, i.summary, i.paper, *i.text.values()]).lower()]


def compact(items: Sequence[Item], width: int = 80) -> list[str]:
    """One line per item, grouped by kind under a heading: name, paper id and the summary cut to fit."""
    lines: list[str] = []
    name_w = min(24, max((len(i.name) for i in items), default=4))
    paper_w = min(12, max((len(i.paper_id) for i in items), default=0))
    for kind in dict.fromkeys(i.kind for i in items):
        lines += ["", f"{kind}:"] if lines else [f"{kind}:"]
        for i in (i for i in items if i.kind == kind):
            head = f"  {_cut(i.name, name_w):<{name_w}}  {_cut(i.paper_id, paper_w):<{paper_w}}  "
            room = max(width - len(head), 20)
            summary = textwrap.wrap(i.summary, room, break_long_words=True) or [""]
            if len(summary) > SUMMARY_LINES:
                summary = [*summary[: SUMMARY_LINES - 1], _cut(" ".join(summary[SUMMARY_LINES - 1:]), room)]
            lines.append((head + summary[0]).rstrip())
            lines += [" " * len(head) + rest for rest in summary[1:]]
    return lines


def markdown(items: Sequence[Item]) -> str:
    rows = ["| name | kind | paper | summary |", "|---|---|---|---|"]
    rows += [f"| `{i.name}` | {i.kind} | {i.paper_id} | {i.summary.replace('|', '/')} |" for i in items]
    return "\n".join(rows)


def detail(item: Item, width: int = 80) -> list[str]:
    """``item`` in full: each part of its text under a heading, wrapped to ``width``."""
    lines = [f"{item.name} ({item.kind})", ""]
    for heading, text in item.text.items():
        lines.append(f"{heading}:")
        for paragraph in text.splitlines():
            lines += textwrap.wrap(paragraph, width, initial_indent="  ", subsequent_indent="    ",
                                   break_long_words=True, break_on_hyphens=False) or [""]
    if item.kind not in (PRESET, RECIPE):
        using = presets_using(item.name)
        if using:
            lines += ["presets:", *textwrap.wrap(", ".join(using), width, initial_indent="  ", subsequent_indent="  ")]
    return lines


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def print_algos_full() -> None:
    """Every preset and registered part in wide tables: formula, paper and settings with their defaults."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from reinforge.config import config_from_dict, preset_names, preset_summary
    from reinforge.parts import all_kinds

    console = Console()
    presets = Table(title="presets (recipe key `preset: NAME`, or `reinforge train preset=NAME`)", title_justify="left")
    for column in ("name", "advantage", "policy loss", "aggregation", "KL", "paper and notes"):
        presets.add_column(column, style="bold" if column == "name" else None)
    for name in preset_names():
        a = config_from_dict({"preset": name}, source=f"preset {name}").algo
        kl = f"{a.kl.estimator} x {a.kl.coef:g} in {a.kl.placement}" if a.kl.coef > 0 else "-"
        parts = [_changed_options(kind, getattr(a, kind)) for kind in ("advantage", "policy_loss", "loss_agg")]
        presets.add_row(*map(escape, (name, *parts, kl, preset_summary(name))))
    console.print(presets)
    for kind, registry in all_kinds().items():
        table = Table(title=f"{kind} ({registry.kind})", show_lines=False, title_justify="left")
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("formula" if any(e.formula for e in registry.entries()) else "description")
        table.add_column("paper")
        table.add_column("settings (defaults)")
        for e in registry.entries():
            # escaped: a formula such as `[/ ... ]` or `x[i]` is text, not Rich markup
            table.add_row(*map(escape, (e.name, e.formula or e.description, e.paper, _options(e.options()) or "-")))
        console.print(table)


def _options(options: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in options.items())


def _changed_options(kind: str, part: object) -> str:
    """``name (option=value, ...)`` of a preset's part, with the options it sets away from their defaults."""
    from reinforge.parts import all_kinds

    defaults = all_kinds()[kind].entry(str(part)).options()
    form = part.recipe_form() if hasattr(part, "recipe_form") else str(part)
    changed = {k: v for k, v in form.items() if k != "name" and v != defaults[k]} if isinstance(form, dict) else {}
    return f"{part} ({_options(changed)})" if changed else str(part)


def print_listing(make_items, name: str | None, kind: str | None, word: str | None, as_markdown: bool) -> None:  # type: ignore[no-untyped-def]
    """Print ``make_items()``, filtered by ``kind`` and ``word``: one entry in full, a Markdown table or a list."""
    import difflib
    import shutil

    import typer

    from reinforge.errors import ConfigError

    items, width = make_items(), shutil.get_terminal_size((80, 24)).columns
    if kind is not None:
        kinds = list(dict.fromkeys(i.kind for i in items))
        if kind not in kinds:
            raise ConfigError(f"--kind {kind}: allowed: {', '.join(kinds)}")
        items = [i for i in items if i.kind == kind]
    items = search(items, word) if word else items
    if name is not None:
        found = [i for i in items if i.name == name]
        if not found:
            close = difflib.get_close_matches(name, [i.name for i in items], n=3)
            raise ConfigError(f"no entry named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
        typer.echo("\n\n".join("\n".join(detail(i, width)) for i in found))
    elif as_markdown:
        typer.echo(markdown(items))
    else:
        typer.echo("\n".join(compact(items, width)) if items else "nothing matches")
