"""Recipes: YAML files (or shipped names) with presets and dotted command-line overrides -> ``RunConfig``.

    reinforge train recipes/x.yaml algo.policy_loss.clip_high=0.28 train.steps=50

Unknown keys and bad values are rejected before any work starts, with the dotted name of the
field and the allowed values. The fully resolved config is saved in the run directory.

A part field (``algo.advantage``, ``algo.policy_loss``, ``rollout.replay``, ...) is a name or ``{name,
<option>: value}``; a bare name stands for ``{name: NAME}``, so an option can be set over either form
(``algo.policy_loss.clip_high=0.28``). Naming a *different* part (in an override, or a recipe over its
preset) replaces the old part with its options; naming the same part again (or none) keeps the options
not given.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from reinforge.config.base import InlineSection, Part
from reinforge.config.run import RunConfig
from reinforge.config.task import DEFAULT_TASK_KIND, REPLACED_KEYS, task_kind_model
from reinforge.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
PRESETS_DIR = RECIPES_DIR / "presets"
DEFAULT_RECIPE = "default"
NO_INPUT_ERRORS = ("extra_forbidden", "unknown_option", "moved_option")  # errors shown without "(got ...)"


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        path, owner, kind = _locate(e["loc"])
        field = ".".join(path) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        got = f" (got {e.get('input')!r})" if not isinstance(e.get("input"), dict) else ""
        if e["type"] in NO_INPUT_ERRORS:
            got = ""
        if e["type"] == "extra_forbidden":
            keys = f"; allowed keys here: {', '.join(owner.model_fields)}" if owner else ""
            msg, got = (f"not a field of {kind}" if kind else "unknown key") + keys, ""
        elif e["type"] == "literal_error":
            msg = msg.replace("Input should be", "allowed values:")
        elif e["type"] == "union_tag_invalid":  # task.kind=<unknown>
            discriminator = e["ctx"]["discriminator"].strip("'")
            field, msg = f"{field}.{discriminator}", f"allowed values: {e['ctx']['expected_tags']}"
            got = f" (got {e['ctx']['tag']!r})"
        lines.append(f"  {field}: {msg}{got}")
    return "\n".join(lines)


def _union_members(field: Any) -> dict[str, type[BaseModel]] | None:
    """Tag -> model of a field that is a union discriminated by ``field.discriminator`` (``task``)."""
    if not isinstance(field.discriminator, str):
        return None
    members = [m for m in get_args(field.annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    return {tag: m for m in members for tag in get_args(m.model_fields[field.discriminator].annotation)}


def _locate(loc: tuple) -> tuple[list[str], type[BaseModel] | None, str | None]:
    """An error's location as the recipe's dotted keys (pydantic's union tags dropped), the model that
    owns the last key (None inside lists and dicts), and, when that model is a union member, which
    ("task kind jsonl")."""
    path: list[str] = []
    model: type[BaseModel] | None = RunConfig
    owner, member, kind, union = model, None, None, None
    for part in map(str, loc):
        if union is not None:  # the part after a discriminated union is the tag of the member it tried
            members, discriminator, name = union
            union = None
            if part in members:
                model = member = members[part]
                kind = f"{name} {discriminator} {part}"
                continue
        path.append(part)
        owner = model
        field = model.model_fields.get(part) if model is not None else None
        model = None
        if field is not None and (members := _union_members(field)):
            union = (members, field.discriminator, part)
        elif field is not None and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            model = field.annotation
    return path, owner, kind if owner is member else None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: bad key {key!r}")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _list_index(item: str, key: str, part: str, items: list[Any]) -> int:
    """``part`` as an index into the list at ``key`` (``reward.terms.1``), or a ConfigError."""
    try:
        index = int(part)
    except ValueError:
        raise ConfigError(f"override {item!r}: {key!r} is a list; index it by position, e.g. {key}.0") from None
    if not -len(items) <= index < len(items):
        raise ConfigError(f"override {item!r}: {key!r} has {len(items)} items; no index {index}")
    return index


def _field(path: Sequence[str]) -> Any:
    """The pydantic field the dotted ``path`` names from ``RunConfig`` (None when it names none)."""
    model: Any = RunConfig
    field = None
    for key in path:
        field = model.model_fields.get(key) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        model = field.annotation
    return field


def part_section(path: Sequence[str]) -> type[InlineSection] | None:
    """The section model the dotted ``path`` names when it names a part with inline options and fields of
    its own (a ``PartConfig`` such as rollout.replay, or ``env``)."""
    field = _field(path)
    if field is None:
        return None
    return next((t for t in (field.annotation, *get_args(field.annotation))
                 if isinstance(t, type) and issubclass(t, InlineSection) and getattr(t, "KIND", "")), None)


def part_kind(path: Sequence[str]) -> str | None:
    """The registry key (``registry.KINDS``) of the part the dotted ``path`` names (``advantage`` for
    algo.advantage, ``replay`` for rollout.replay), or None when it names no ``config.base.Part`` field
    or part section."""
    section = part_section(path)
    if section is not None:
        return section.KIND  # type: ignore[attr-defined]
    field = _field(path)
    return next((m.kind for m in field.metadata if isinstance(m, Part)), None) if field is not None else None


def is_part_field(path: Sequence[str]) -> bool:
    """Whether the dotted ``path`` names a part (a ``config.base.Part`` field, e.g. algo.policy_loss, or a
    part section, e.g. rollout.replay)."""
    return part_kind(path) is not None


def merge_part(old: Any, new: Any, own: Collection[str] = ()) -> Any:
    """``new`` written over the part ``old`` (each a name or ``{name, <option>: value}``): a different
    name replaces the old part and its options (a section's ``own`` fields other than name are kept);
    the same name, or none, updates the old options."""
    as_map = [{"name": p} if isinstance(p, str) else p for p in (old, new)]
    if not all(isinstance(p, dict) for p in as_map):
        return new  # not a part's form: validation reports it
    old_map, new_map = as_map
    if "name" in new_map and new_map["name"] != old_map.get("name"):
        kept = {k: v for k, v in old_map.items() if k in own and k != "name" and k not in new_map}
        return {**new_map, **kept} if kept else new
    return {**old_map, **new_map}


def _section_fields(path: Sequence[str]) -> Collection[str]:
    section = part_section(path)
    return section.model_fields if section is not None else ()


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``a.b.c=value`` overrides into a recipe mapping; a list is indexed by position
    (``reward.terms.1.reward_model.path=/models/rm``). Missing sections are created; a part field
    named by a bare string takes an option as ``{name: NAME}`` (``algo.policy_loss.clip_high=0.28``)."""
    for item in overrides:
        path, value = parse_override(item)
        node: Any = data
        for depth, part in enumerate(path[:-1]):
            if isinstance(node, list):
                node = node[_list_index(item, ".".join(path[:depth]), part, node)]
                continue
            nxt = node.setdefault(part, {})
            if isinstance(nxt, str) and is_part_field(path[: depth + 1]):
                nxt = node[part] = {"name": nxt}
            if not isinstance(nxt, dict | list):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = nxt
        if isinstance(node, list):
            node[_list_index(item, ".".join(path[:-1]), path[-1], node)] = value
        elif path[-1] in node and is_part_field(path):
            node[path[-1]] = merge_part(node[path[-1]], value, _section_fields(path))
        elif path[-1] == "name" and (section := part_section(path[:-1])) is not None and node.get("name") != value:
            kept = {k: v for k, v in node.items() if k in section.model_fields}  # another part: its options go
            node.clear()
            node.update(kept, name=value)
        else:
            node[path[-1]] = value
    return data


def resolve_recipe_path(recipe: str | None) -> Path:
    """A recipe file path, or the name of a shipped recipe (``default``)."""
    if recipe is None:
        recipe = DEFAULT_RECIPE
    path = Path(recipe)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / f"{recipe.removesuffix('.yaml')}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise ConfigError(f"recipe {recipe!r} is neither a file nor a shipped recipe (shipped: {', '.join(names)})")


TASK_DATA_PATH_KEYS = ("path", "heldout_path")


def _next_to_recipe(value: Any, recipe_dir: Path) -> str | None:
    """``recipe_dir / value`` made absolute when ``value`` is a relative path (or glob) naming something
    there; None otherwise (the value then stays relative to the working directory)."""
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
        return None
    if any(ch in value for ch in "*?["):
        try:
            found = next(iter(recipe_dir.glob(value)), None) is not None
        except (ValueError, NotImplementedError):  # a pattern pathlib does not take: leave it to the reader
            found = False
    else:
        found = (recipe_dir / value).exists()
    return os.path.normpath((recipe_dir / value).absolute()) if found else None


def _verifier_next_to_recipe(value: Any, recipe_dir: Path) -> str | None:
    """A ``file.py:function`` verifier whose file is next to the recipe, with that file made absolute."""
    if not isinstance(value, str) or ":" not in value:
        return None
    target, _, attr = value.rpartition(":")
    found = _next_to_recipe(target, recipe_dir) if target.endswith(".py") else None
    return f"{found}:{attr}" if found else None


def _resolve_recipe_paths(data: dict[str, Any], recipe_dir: Path) -> None:
    """In place: the recipe's relative paths that name something next to the recipe file become
    absolute: ``model.path``, ``task.path``, ``task.heldout_path`` (files, directories or globs),
    ``file.py:function`` verifiers (``task.verifier``, a reward term's ``verifier``) and a reward
    term's ``reward_model.path``. Any other value is kept as given (relative to the working
    directory, as before)."""
    plugins = data.get("plugins")
    for i, name in enumerate(plugins if isinstance(plugins, list) else []):
        if isinstance(name, str) and name.endswith(".py") and (found := _next_to_recipe(name, recipe_dir)):
            plugins[i] = found
    sections = {key: data.get(key) for key in ("model", "task", "reward")}
    model, task, reward = (v if isinstance(v, dict) else {} for v in sections.values())
    for section, key in [(model, "path"), *((task, k) for k in TASK_DATA_PATH_KEYS)]:
        if (found := _next_to_recipe(section.get(key), recipe_dir)) is not None:
            section[key] = found
    if (found := _verifier_next_to_recipe(task.get("verifier"), recipe_dir)) is not None:
        task["verifier"] = found
    terms = reward.get("terms")
    for term in terms if isinstance(terms, list) else []:
        if not isinstance(term, dict):
            continue
        if (found := _verifier_next_to_recipe(term.get("verifier"), recipe_dir)) is not None:
            term["verifier"] = found
        rm = term.get("reward_model")
        if isinstance(rm, dict) and (found := _next_to_recipe(rm.get("path"), recipe_dir)) is not None:
            rm["path"] = found


def load_config(recipe: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Recipe YAML (or a shipped recipe name, default ``default``) + dotted overrides -> RunConfig.

    Precedence, lowest first: the recipe's own ``preset``, the recipe, a ``preset=NAME`` override
    (switching the algorithm replaces the recipe's keys that the preset sets), the other overrides
    (switching ``task.kind`` drops the recipe's task keys the new kind does not have).
    A relative path written in the recipe (data, model, reward model, ``file.py:function`` verifier)
    is found next to the recipe file when it exists there (shipped recipes use ``data/...``);
    overrides are taken as given.
    """
    path = resolve_recipe_path(str(recipe) if recipe is not None else None)
    return config_from_dict(recipe_data(recipe, overrides), source=str(path))


def recipe_data(recipe: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The recipe mapping ``load_config`` validates: the recipe, its preset and the overrides merged,
    not checked (plug-ins not imported)."""
    path = resolve_recipe_path(str(recipe) if recipe is not None else None)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    _resolve_recipe_paths(data, path.parent)  # the recipe's own paths only: overrides stay relative to the cwd
    overrides = list(overrides or [])
    switched = [o for o in overrides if o.split("=", 1)[0].strip() == "preset"]
    if switched:  # a preset named on the command line switches the algorithm: its keys replace the recipe's
        data = apply_overrides(data, switched[-1:])
        data = deep_merge(data, load_preset(str(data["preset"])))
    _switch_task_kind(data, overrides)
    return apply_overrides(data, [o for o in overrides if o not in switched])


def _switch_task_kind(data: dict[str, Any], overrides: list[str]) -> None:
    """In place: a ``task.kind=`` override that changes the recipe's task kind drops the recipe's task
    keys the new kind does not have (``digits`` of an arithmetic recipe under ``task.kind=jsonl``, or
    any default a saved config.yaml spells out). Keys the overrides set are applied after, and checked."""
    kinds = [value for key, value in map(parse_override, overrides) if key == ["task", "kind"]]
    task = data.get("task")
    if not kinds or not isinstance(task, dict) or task.get("kind", DEFAULT_TASK_KIND) == kinds[-1]:
        return
    model = task_kind_model(str(kinds[-1]))
    if model is None:  # an unknown kind: validation names the allowed ones
        return
    for key in [k for k in task if k not in model.model_fields and k not in REPLACED_KEYS]:
        del task[key]


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"preset: unknown preset {name!r}; allowed: {', '.join(preset_names())}")
    return path


def preset_summary(name: str) -> str:
    """The preset's leading comment: the algorithm, its paper and what it combines."""
    lines = []
    for line in preset_path(name).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)


def load_preset(name: str) -> dict[str, Any]:
    return yaml.safe_load(preset_path(name).read_text()) or {}


def deep_merge(base: dict[str, Any], over: dict[str, Any], _path: tuple[str, ...] = ()) -> dict[str, Any]:
    """``over`` on top of ``base``, section by section (neither is modified); a part field by
    ``merge_part`` (a different part replaces the old one with its options)."""
    out = dict(base)
    for key, value in over.items():
        path = (*_path, key)
        if key in out and is_part_field(path):
            out[key] = merge_part(out[key], value, _section_fields(path))
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value, path)
        else:
            out[key] = value
    return out


def config_from_dict(data: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate a recipe mapping; a ``preset: NAME`` key puts that preset's sections under the recipe's."""
    preset = data.get("preset")
    if preset is not None:
        if not isinstance(preset, str):
            raise ConfigError(f"invalid config ({source}):\n  preset: must be a preset name (got {preset!r})")
        data = deep_merge(load_preset(preset), data)
    from reinforge.plugins import load_plugins

    plugins = data.get("plugins") or []
    load_plugins([plugins] if isinstance(plugins, str) else plugins)  # their parts register before validation
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

