"""The layering rule of DESIGN.md: dependencies point down only. A module's run-time imports
(type-only ones under `if TYPE_CHECKING:` do not run) never reach a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

import perdure

ROOT = Path(perdure.__file__).parent

# bottom to top; a module may import its own layer and any layer below it
LAYERS: list[tuple[str, ...]] = [
    ("perdure.errors", "perdure.extras", "perdure.nesting", "perdure.nofollow"),
    ("perdure.store",),
    ("perdure.engine",),
    ("perdure.observe", "perdure.triggers"),
    ("perdure.agent",),
    ("perdure.integrations",),
    ("perdure.app",),
    ("perdure.server", "perdure.cli", "perdure.testing"),
    ("perdure", "perdure.__main__"),
]


def layer_of(module: str) -> int:
    best, rank = "", -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, index
    assert rank >= 0, f"{module} belongs to no layer: add it to LAYERS"
    return rank


def module_name(path: Path) -> str:
    parts = ["perdure", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import that runs, at any depth (function bodies too)."""
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.startswith("perdure"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("perdure"):
                if node.module is None or target == package:  # `from . import x`: x is a module
                    found.extend((node.lineno, f"{target}.{a.name}") for a in node.names)
                else:
                    found.append((node.lineno, target))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _resolve(module: str) -> str:
    """`perdure.engine.observers` stays; `perdure.agent.loop.Client` (a name) falls back to
    the deepest existing module."""
    parts = module.split(".")
    while len(parts) > 1:
        candidate = ROOT.joinpath(*parts[1:])
        if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
            break
        parts.pop()
    return ".".join(parts)


def test_no_import_runs_up_a_layer() -> None:
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        source = module_name(path)
        for line, target in runtime_imports(path):
            target = _resolve(target)
            if layer_of(target) > layer_of(source):
                upward.append(f"{path.relative_to(ROOT.parent)}:{line}: {source} imports {target}")
    assert not upward, "imports that run up a layer (DESIGN.md, Layers):\n" + "\n".join(upward)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The walk finds imports inside functions and skips only type-checking blocks."""
    sample = ROOT / "engine" / "worker.py"
    imports = [target for _, target in runtime_imports(sample)]
    assert any(t.startswith("perdure.engine") for t in imports)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from perdure.app import App\n"
        "def f():\n    from perdure.triggers import schedules\n"
    )
    assert [t for _, t in runtime_imports_of(probe)] == ["perdure.triggers.schedules"]


def runtime_imports_of(path: Path) -> list[tuple[int, str]]:
    """`runtime_imports` for a file outside the package (absolute imports only)."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text())

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perdure"):
            found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found
