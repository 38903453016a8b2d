"""Layers, by design (docs/development.md, "Layers"): every import in tasks/, flows/, deployments/, bench/ and tests/
— at the top of a module, inside a function or under ``if TYPE_CHECKING`` alike — goes to a module of the same unit
or of a layer its own layer may import, and no modules import each other in a circle. The files are parsed, never
imported, so the test takes a fraction of a second.

A unit is a package of tasks/ (``tasks.registry``), a flat module of tasks/ (``tasks.errors``), flows/,
deployments/, bench/ or tests/. ``LAYERS`` lists them from the bottom, each layer with the layers it may import:
decided by what the layer is for (a server answers with a trained model, it never trains; no stage imports bench/
or tests/), not by where the last import happened to be. Within tasks/ a layer may import only layers below it,
never a unit of its own layer."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("tasks", "flows", "deployments", "bench", "tests")


@dataclass(frozen=True)
class Layer:
    name: str
    units: tuple[str, ...]
    may_import: tuple[str, ...]  # the layers whose units this layer's units may import


BASE = ("the package", "errors", "shared leaves", "storage", "contracts")
STAGES = ("foundations", "making", "inference", "using", "launching", "fanning out", "watching", "serving")
LAYERS: list[Layer] = [
    # Its docstring (the map of tasks/) and its folder: where the project's root is.
    Layer("the package", ("tasks",), ()),
    Layer("errors", ("tasks.errors",), ()),
    Layer(
        "shared leaves",
        ("tasks.retrying", "tasks.progress", "tasks.console", "tasks.memory", "tasks.allocator", "tasks.markdown"),
        ("errors",),
    ),
    Layer("storage", ("tasks.storage",), ("errors", "shared leaves")),
    Layer("contracts", ("tasks.contracts",), ("the package", "errors", "shared leaves", "storage")),
    # What every stage builds on: torch's networks and images, the registry, the fan-out engine, S3 work folders.
    Layer(
        "foundations",
        ("tasks.near_duplicates", "tasks.outages", "tasks.vision", "tasks.registry", "tasks.work_dir", "tasks.fanout"),
        BASE,
    ),
    # Data converted, a model specified, a model trained.
    Layer("making", ("tasks.convert", "tasks.model", "tasks.training"), (*BASE, "foundations")),
    # The one loaded model: knows the registry and torch's networks, never how a model was made.
    Layer("inference", ("tasks.inference",), (*BASE, "foundations")),
    # What is made, used: data checked and split, models scored and evaluated, photos predicted.
    Layer("using", ("tasks.data", "tasks.evaluation", "tasks.predict"), (*BASE, "foundations", "making", "inference")),
    Layer("launching", ("tasks.launch",), (*BASE, "foundations", "making", "using")),
    # Many trainings or scorings over the pool.
    Layer(
        "fanning out",
        ("tasks.score_shards", "tasks.sweep"),
        (*BASE, "foundations", "making", "inference", "using", "launching"),
    ),
    # The served model watched (answers recorded, drift, the labelling queue): the one loaded model's embeddings and
    # the registry, never training.
    Layer("watching", ("tasks.monitoring",), (*BASE, "foundations", "inference")),
    # The endpoint: a registered model answering requests, recording what it answers.
    Layer("serving", ("tasks.serving",), (*BASE, "foundations", "inference", "watching")),
    Layer("flows", ("flows",), (*BASE, *STAGES)),
    Layer("deployments", ("deployments",), (*BASE, *STAGES, "flows")),
    # bench/ and tests/ use everything, and each other's helpers (sample photos, the benchmarks under test).
    Layer("benchmarks", ("bench",), (*BASE, *STAGES, "flows", "deployments", "tests")),
    Layer("tests", ("tests",), (*BASE, *STAGES, "flows", "deployments", "benchmarks")),
]
# Units with a place in the table before their code lands, each with its reason.
PLANNED: dict[str, str] = {}

# Imports that break the rule for now, each with its reason; an allowance no import needs any more fails the test.
ALLOWED_IMPORTS: dict[tuple[str, str], str] = {}
# Import circles that exist for now (their modules), each with its reason; likewise kept honest.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (the deepest one of ours the statement names)
    where: str  # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} → {self.target}"


def module_files() -> dict[str, Path]:
    """Every module of ours by dotted name (a package by its own name, for its __init__.py)."""
    found = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def ours(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest module of ours that ``name`` is or lies in (None: not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(node: ast.Import | ast.ImportFrom, module: str, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = module.split(".")
        if modules[module].name != "__init__.py":
            package = package[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    # ``from a.b import c``: the module a.b.c when there is one, else a name defined in a.b.
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def all_imports() -> list[Import]:
    modules, found = module_files(), []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in imported_names(node, module, modules):
                    target = ours(name, modules)
                    if target is not None and target != module:
                        found.append(Import(module, target, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return list(dict.fromkeys(found))  # ``from a import b, c`` names a module once per line


def unit_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "tasks" and len(parts) > 1 and (ROOT / "tasks" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module if parts[0] == "tasks" else parts[0]


def layer_named() -> dict[str, Layer]:
    return {layer.name: layer for layer in LAYERS}


def layer_of() -> dict[str, Layer]:
    return {unit: layer for layer in LAYERS for unit in layer.units}


def not_allowed(imports: list[Import]) -> list[Import]:
    """The imports from one unit to another that its layer may not import."""
    layer = layer_of()
    return [
        i
        for i in imports
        if unit_of(i.source) != unit_of(i.target)
        and layer[unit_of(i.target)].name not in layer[unit_of(i.source)].may_import
    ]


def circles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, list[str]] = {}
    for i in imports:
        graph.setdefault(i.source, []).append(i.target)
        graph.setdefault(i.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_every_unit_has_one_layer_and_tasks_layers_import_only_below():
    units = {unit_of(module) for module in module_files()}
    listed = [unit for layer in LAYERS for unit in layer.units]
    assert len(listed) == len(set(listed)), "a unit is listed on two layers"
    gone = set(listed) - units - set(PLANNED)
    assert units == set(listed) - set(PLANNED) - gone and not gone, (
        f"not in LAYERS: {sorted(units - set(listed))}; gone: {sorted(gone)}"
    )
    assert not set(PLANNED) & units, f"planned units that exist now, remove them from PLANNED: {set(PLANNED) & units}"
    position = {layer.name: n for n, layer in enumerate(LAYERS)}
    for layer in LAYERS:
        assert set(layer.may_import) <= set(position), f"{layer.name} names a layer that is not in LAYERS"
        if layer.units[0].startswith("tasks"):
            above = [name for name in layer.may_import if position[name] >= position[layer.name]]
            assert not above, f"{layer.name} may import {above}, which are not below it"


def test_every_import_goes_where_its_layer_may_import():
    layer, found = layer_of(), not_allowed(all_imports())
    offending = [i for i in found if (i.source, i.target) not in ALLOWED_IMPORTS]
    stale = set(ALLOWED_IMPORTS) - {(i.source, i.target) for i in found}
    assert not offending, "imports that their layer may not make (LAYERS says which layers each may import):\n" + (
        "\n".join(f"  {i} ({layer[unit_of(i.source)].name} → {layer[unit_of(i.target)].name})" for i in offending)
    )
    assert not stale, f"allowed in ALLOWED_IMPORTS but no longer imported, remove them: {sorted(stale)}"


def test_no_modules_import_each_other_in_a_circle():
    imports = all_imports()
    found = circles(imports)
    offending = [group for group in found if frozenset(group) not in ALLOWED_CIRCLES]
    stale = set(ALLOWED_CIRCLES) - {frozenset(group) for group in found}
    lines = []
    for group in offending:
        members = set(group)
        lines.append("  circle: " + " ↔ ".join(group))
        lines += [f"    {i}" for i in imports if i.source in members and i.target in members]
    assert not offending, "modules that import each other, directly or around a circle:\n" + "\n".join(lines)
    assert not stale, f"allowed in ALLOWED_CIRCLES but gone, remove them: {sorted(map(sorted, stale))}"


def test_the_walk_sees_imports_inside_functions_and_relative_ones(tmp_path):
    imports = all_imports()
    inside = [i for i in imports if i.source == "tasks.data.preflight" and i.target.startswith("tasks.convert")]
    assert inside, "the imports inside tasks/data/preflight.py's functions are seen"
    modules = {"pkg": tmp_path / "__init__.py", "pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    node = ast.parse("from .b import thing").body[0]
    assert imported_names(node, "pkg.a", modules) == ["pkg.b"]
    assert circles([Import("a", "b", "x:1"), Import("b", "c", "x:2"), Import("c", "a", "x:3")]) == [["a", "b", "c"]]
