"""The package's layers only look down, and no module imports itself back through another.

Data flows one way: load model → capture through the core → statistics / probes / detectors →
render / report / prune → command line. The same list is in the README's architecture section.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "attnviz"

#: bottom to top; a module may import its own layer and the layers below, never one above
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"common"}),
    ("files", {"outputs"}),
    ("core", {"core"}),
    ("models", {"models", "toy"}),
    ("capture", {"captures"}),
    ("analysis", {"stats", "heads", "compare", "patching", "circuit"}),
    ("output", {"render", "atlas", "prune"}),
    ("cli", {"cli", "__main__"}),
]
LAYER_OF = {part: index for index, (_, parts) in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every ``attnviz`` module ``path`` imports, at the top or inside a function.

    Imports under ``if TYPE_CHECKING:`` are left out: they exist for annotations only, never run.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("attnviz"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnviz") and node.level == 0:
            for alias in node.names:  # ``from attnviz.outputs import files`` imports the module attnviz.outputs.files
                candidate = f"{node.module}.{alias.name}"
                as_path = PACKAGE.parent / candidate.replace(".", "/")
                found.add(candidate if as_path.with_suffix(".py").is_file() or as_path.is_dir() else node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    return {module_name(path): imported_modules(path) for path in PACKAGE.rglob("*.py")}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYER_OF.get(parts[1]) if len(parts) > 1 else None  # the package root re-exports everything


def test_no_loose_modules():
    """Every module lives in its layer's package: only ``__init__`` and ``__main__`` sit at the top."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert loose == [], f"move these into a layer's package: {loose}"


def test_every_module_has_a_layer():
    unplaced = sorted({module.split(".")[1] for module in import_graph() if "." in module} - set(LAYER_OF))
    assert unplaced == [], f"give these a layer in LAYERS (and the README): {unplaced}"


def test_imports_only_look_down():
    upward = [
        f"{module} ({LAYERS[layer(module)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
        for module, targets in import_graph().items()
        for target in targets
        if layer(module) is not None and layer(target) is not None and layer(target) > layer(module)
    ]
    assert upward == []


def test_no_import_cycles():
    """No cycle between modules, counting imports inside functions (which would only hide one)."""
    graph = import_graph()
    # a package's __init__ may re-export its own submodules; an edge from a submodule to its own
    # package is what would close a cycle, so those count
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def package_of(module: str) -> str | None:
    """``attnviz.common`` for ``attnviz.common.texts``; None for the package root."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def test_no_package_cycles():
    """No cycle between packages either: ``common`` importing ``outputs`` while ``outputs`` imports ``common``
    is a cycle even when no single module closes it."""
    edges: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        source = package_of(module)
        for target in targets:
            target_package = package_of(target)
            if source is not None and target_package is not None and target_package != source:
                edges.setdefault(source, set()).add(target_package)

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            for following in sorted(edges.get(path[-1], ())):
                if following == goal:
                    return [*path, following]
                if following not in seen:
                    seen.add(following)
                    stack.append([*path, following])
        return None

    cycles = sorted({" -> ".join(path) for package in edges if (path := reaches(package, package)) is not None})
    assert cycles == []


def lazy_packages() -> list[str]:
    return sorted(
        module_name(path)
        for path in PACKAGE.rglob("__init__.py")
        if "lazy_exports(" in path.read_text(encoding="utf-8")
    )


def test_lazy_exports_resolve_to_what_they_name():
    """Every public name of a lazy package imports, and none is hidden by a submodule of the same name."""
    import importlib

    assert {"attnviz.core", "attnviz.heads", "attnviz.prune", "attnviz.stats", "attnviz.toy"} <= set(lazy_packages())
    for package_name in lazy_packages():
        package = importlib.import_module(package_name)
        folder = PACKAGE.parent / package_name.replace(".", "/")
        submodules = {path.stem for path in folder.glob("*.py")} | {
            path.name for path in folder.iterdir() if path.is_dir()
        }
        for name, module in package._EXPORTS.items():
            assert name not in submodules, f"{package_name}.{name} is also a submodule: the import would hide it"
            assert getattr(package, name) is getattr(importlib.import_module(module), name)
        assert set(package.__all__) - {"__version__"} == set(package._EXPORTS)
