"""The package's shape (docs/architecture.md): no import cycle between its modules, and no test of a
registered part's name outside the module that registers it (the loop asks the part's declaration)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from reinforge.parts import all_kinds

PACKAGE = Path(__file__).resolve().parents[1] / "reinforge"
# A string that is a part's name but also means something else where it is compared (not the part).
OTHER_MEANINGS = {
    ("rewards/reward_model.py", "none"),  # reward.reward_model normalise: none | running
    ("learn/prepare.py", "entropy"),  # the context field an estimator declares it needs, not the loss term
    ("serve/tool_calls.py", "none"),  # OpenAI's tool_choice "none" and the tool parser "none", not a mismatch mode
    # reward.pool, train.dist_backend and reward.on_error "auto", not the rollout engine "auto"
    ("rewards/build.py", "auto"), ("learn/distributed.py", "auto"), ("orchestrate/loop.py", "auto"),
    # model.device "auto" (the GPU when present), not the rollout engine "auto"
    ("config/model.py", "auto"), ("orchestrate/components.py", "auto"),
    # peft's LoRA bias option "none" (model.lora.bias), not a mismatch mode
    ("config/model.py", "none"), ("learn/multi_lora.py", "none"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_on_import(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes that run when the module is imported: none inside a function (or lambda), none under
    ``if TYPE_CHECKING:`` (its ``else`` runs); a class body runs."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        for stmt in child.orelse if isinstance(child, ast.If) and _is_type_checking(child.test) else [child]:
            yield stmt
            yield from _run_on_import(stmt)


def _imports(tree: ast.AST, modules: dict[str, Path], module_level: bool = False) -> set[str]:
    """Every reinforge module this one imports, at the top or inside a function (``module_level``: only
    the imports that run when it is imported)."""
    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in _run_on_import(tree) if module_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {owner(a.name) for a in node.names if a.name.startswith("reinforge")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("reinforge"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(owner(full) if full in modules else owner(node.module))
    return {m for m in found if m}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_the_package():
    modules = _modules()
    graph = {name: _imports(ast.parse(path.read_text()), modules) for name, path in modules.items()}
    assert _cycles(graph) == []
    # the check sees a cycle when there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _package(module: str) -> str:
    """The top-level package (or module) of reinforge a module belongs to: ``reinforge.config.task`` ->
    ``config``, ``reinforge.types`` -> ``types``; ``reinforge`` (the root ``__init__``) is its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _executed(module: str) -> list[str]:
    """What importing ``module`` runs: the ``__init__`` of every package above it, then the module."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _package_edges() -> dict[tuple[str, str], list[str]]:
    """(package, another package it imports at module level) -> the imports that make the edge, each
    ``"module -> module it imports"``. Importing ``reinforge.x.y`` runs ``reinforge/x/__init__.py`` too: an edge
    to ``x``, whose ``__init__``'s own imports are edges of ``x`` that the cycle search follows."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for name, path in sorted(modules.items()):
        for dep in sorted(_imports(ast.parse(path.read_text()), modules, module_level=True)):
            for package in dict.fromkeys(_package(ran) for ran in _executed(dep)):
                if package != _package(name):
                    edges.setdefault((_package(name), package), []).append(f"{name} -> {dep}")
    return edges


def test_no_import_cycle_between_packages():
    """No package of reinforge imports, at module level, one that imports it back (directly or around a
    circle), counting what each package's ``__init__`` imports: the layers of docs/architecture.md. An
    import inside a function (or under ``if TYPE_CHECKING:``) may cross layers."""
    edges = _package_edges()
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    cycles = _cycles(graph)
    found = [" <-> ".join(c) + "".join(f"\n  {why}" for (src, dst), whys in sorted(edges.items())
                                        if src in c and dst in c for why in whys) for c in cycles]
    print("\n".join(found))
    assert cycles == [], "import cycles between packages:\n" + "\n".join(found)
    # the check reads only what runs on import, and an import runs every __init__ above the module
    sample = ast.parse("import reinforge.a\nif TYPE_CHECKING:\n    import reinforge.b\nelse:\n    import reinforge.c\n"
                       "def f():\n    import reinforge.d\nclass K:\n    from reinforge import e\n")
    names = dict.fromkeys(f"reinforge.{m}" for m in "abcde")
    assert _imports(sample, names, module_level=True) == {"reinforge.a", "reinforge.c", "reinforge.e"}  # type: ignore[arg-type]
    assert _executed("reinforge.config.task") == ["reinforge", "reinforge.config", "reinforge.config.task"]


def _layers_table() -> list[tuple[list[str], set[str]]]:
    """The rows of docs/architecture.md's layers table: (packages, the packages they import at module level)."""
    text = (PACKAGE.parent / "docs/architecture.md").read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = line.split("|")[1:-1]
        if len(cells) != 2 or not cells[0].strip().startswith("`"):
            continue
        packages = [name.removesuffix("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", cells[0])]
        rows.append((packages, set(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cells[1])))))
    return rows


def test_packages_import_what_the_layers_table_says():
    """Each package imports at module level exactly the packages its row of the layers table names, all in
    rows above it; every package has a row."""
    imported: dict[str, set[str]] = {}
    for src, dst in _package_edges():
        if dst != "reinforge":  # the root __init__, run by every import (it imports nothing at module level)
            imported.setdefault(src, set()).add(dst)
    rows = _layers_table()
    documented = {package: names for packages, names in rows for package in packages}
    wrong = [f"{p}: imports {sorted(imported.get(p, set()))}, the table says {sorted(documented.get(p, set()))}"
             for p in sorted(set(imported) | set(documented)) if imported.get(p, set()) != documented.get(p)]
    assert wrong == [], "\n".join(wrong)
    assert {_package(m) for m in _modules()} - {"reinforge"} == set(documented)
    above: set[str] = set()
    for packages, names in rows:
        assert names <= above, f"{packages} import {sorted(names - above)}, not in a row above"
        above |= set(packages)


_REGISTERED = """
import json
from reinforge.registry import KINDS
def where(e):
    return getattr(getattr(e.fn, "make", e.fn), "__module__", "")
print(json.dumps({key: {"all": r.names(), "algo": [e.name for e in r.entries() if where(e).startswith("reinforge.algo")]}
                  for key, r in KINDS.items()}))
"""


def _registered_in_fresh_process(setup: str) -> dict[str, dict[str, list[str]]]:
    """Per kind, the names registered after ``setup`` in a new interpreter, and those of them defined in algo/."""
    out = subprocess.run([sys.executable, "-c", setup + "\n" + _REGISTERED], cwd=PACKAGE.parent, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def test_importing_algo_alone_registers_every_algorithm_part():
    """``import reinforge.algo`` registers what ``all_kinds()`` does of every kind algo/ defines, and every part
    an algo/ module registers into another kind: no algo module waits for ``reinforge.parts`` to be imported."""
    alone = _registered_in_fresh_process("import reinforge.algo")
    every = _registered_in_fresh_process("import reinforge.parts; reinforge.parts.all_kinds()")
    assert {"advantage", "policy_loss", "loss_agg", "kl_estimator", "loss_term", "mixing", "mismatch",
            "reward_shaper"} <= set(alone)
    for key, names in alone.items():
        assert set(names["all"]) == set(every[key]["all"]), key
    assert {k: set(v["algo"]) for k, v in every.items() if v["algo"]} == \
        {k: set(v["algo"]) for k, v in alone.items() if v["algo"]}


def test_rollout_and_train_share_model_code_only_through_models():
    """rollout/ and learn/ do not import each other; models/ (the code both use) imports neither."""
    modules = _modules()
    graph = {name: _imports(ast.parse(path.read_text()), modules) for name, path in modules.items()}

    def under(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    rules = [("reinforge.rollout", "reinforge.learn"), ("reinforge.learn", "reinforge.rollout"),
             ("reinforge.models", "reinforge.rollout"), ("reinforge.models", "reinforge.learn"),
             ("reinforge.models", "reinforge.orchestrate")]
    found = [f"{a} imports {b}" for a, deps in graph.items() for src, dst in rules if under(a, src)
             for b in deps if under(b, dst)]
    assert found == []


def _name_tests(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every comparison (==, !=, in, not in) with a string constant that is a part's name,
    and of every set of part names (``{"a", "b"}``, ``frozenset(("a", "b"))``: a membership test kept for later)."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Set):
            operands = [node]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset"):
            operands = [a for a in node.args if not isinstance(a, ast.Set)]  # a set literal is seen on its own
        else:
            continue
        for operand in operands:
            constants = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            for c in constants:
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names:
                    hits.append((node.lineno, c.value))
    return hits


def test_no_code_outside_a_registry_module_tests_a_part_name():
    kinds = all_kinds()
    names = {name for registry in kinds.values() for name in registry.names()}
    registry_modules = {
        Path(getattr(getattr(e.fn, "make", e.fn), "__code__", None).co_filename).resolve()
        for registry in kinds.values() for e in registry.entries() if hasattr(getattr(e.fn, "make", e.fn), "__code__")
    } | {PACKAGE / "algo/mismatch.py", PACKAGE / "data/samplers.py"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.resolve() in registry_modules:
            continue
        rel = str(path.relative_to(PACKAGE))
        for line, name in _name_tests(ast.parse(path.read_text()), names):
            if (rel, name) not in OTHER_MEANINGS:
                found.append(f"reinforge/{rel}:{line} tests part name {name!r}")
    assert found == [], "\n".join(found)
    assert _name_tests(ast.parse('if cfg.algo.advantage == "gae": pass'), names) == [(1, "gae")]
    assert _name_tests(ast.parse('CPU_BOUND = frozenset({"math_verify"})'), names) == [(1, "math_verify")]
    assert _name_tests(ast.parse('CPU_BOUND = frozenset(("math_verify",))'), names) == [(1, "math_verify")]


# A flat family of small registered parts may share one file past 400 lines (one screen per family, the
# table that opens its docstring); each of its functions stays under 60 lines.
FLAT_FAMILIES = {"algo/policy_losses.py", "algo/advantage_estimators.py"}


def test_modules_and_functions_stay_small():
    """House rule: no module over 400 lines (a flat family of registered parts: 600), no function over 60
    (shared/tools/sizes.py measures the same)."""
    too_long = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") + 1 > (600 if path.relative_to(PACKAGE).as_posix() in FLAT_FAMILIES else 400):
            too_long.append(f"{path.relative_to(PACKAGE)}: {text.count(chr(10)) + 1} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []
