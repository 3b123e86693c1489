"""The package layering of DESIGN.md, read from the imports of src/tandem with ast.

- core/ imports neither server/ nor protocol/ (not even for type checking);
- ha/ never imports server/: an activation reaches its broker through ha/host.py's Protocol;
- in server/, only the broker imports ha/ (the broker owns its activation), so the two
  packages never import each other both ways;
- the connections and the management operations (server/native.py, server/stomp.py,
  server/admin.py) do not import the broker, not even for type checking: they see it
  through the Protocol of server/context.py.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "tandem"


@dataclass(frozen=True)
class Import:
    source: str  # tandem.server.native
    target: str  # tandem.server.broker (every module an import statement may name)
    line: int
    runtime: bool  # False inside `if TYPE_CHECKING:`


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, root: Path = SRC) -> list[Import]:
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, runtime: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runtime)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(name, alias.name, node.lineno, runtime))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append(Import(name, base, node.lineno, runtime))
            for alias in node.names:  # `from .. import server` names a module too
                found.append(Import(name, f"{base}.{alias.name}", node.lineno, runtime))
        for child in ast.iter_child_nodes(node):
            visit(child, runtime)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def _all_imports() -> list[Import]:
    return [imp for path in sorted(PACKAGE.rglob("*.py")) for imp in imports_of(path)]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _show(bad: list[Import]) -> str:
    return "\n".join(f"{i.source} (line {i.line}) imports {i.target}" for i in sorted(set(bad), key=str))


def test_the_import_parser_sees_relative_runtime_and_type_checking_imports(tmp_path: Path) -> None:
    """The checks below are only as good as this reading of the source."""
    mod = PACKAGE / "server" / "native.py"
    found = imports_of(mod)
    assert any(i.target == "tandem.protocol.native" and i.runtime for i in found), "from ..protocol import native"
    sample = tmp_path / "src" / "tandem" / "ha" / "x.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..server import broker\n"
        "if TYPE_CHECKING:\n    from ..server.native import NativeConnection\n"
        "def f():\n    import tandem.server.stomp\n"
    )
    got = {(i.target, i.runtime) for i in imports_of(sample, tmp_path / "src")}
    assert {("tandem.server.broker", True), ("tandem.server.native", False), ("tandem.server.stomp", True)} <= got


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("tandem.core", "tandem.server"),
        ("tandem.core", "tandem.protocol"),
        ("tandem.ha", "tandem.server"),
    ],
)
def test_package_does_not_import(package: str, forbidden: str) -> None:
    """Not even under TYPE_CHECKING: a type-only import is still a dependency (and a cycle)."""
    bad = [i for i in _all_imports() if _within(i.source, package) and _within(i.target, forbidden)]
    assert not bad, f"{package} must not import {forbidden}:\n{_show(bad)}"


def test_only_the_broker_imports_ha() -> None:
    bad = [
        i
        for i in _all_imports()
        if _within(i.source, "tandem.server") and i.source != "tandem.server.broker" and _within(i.target, "tandem.ha")
    ]
    assert not bad, f"only server/broker.py may import ha/ (it owns the activation):\n{_show(bad)}"


@pytest.mark.parametrize("module", ["tandem.server.native", "tandem.server.stomp", "tandem.server.admin"])
def test_connections_and_admin_do_not_import_the_broker(module: str) -> None:
    bad = [i for i in _all_imports() if i.source == module and _within(i.target, "tandem.server.broker")]
    assert not bad, f"{module} sees the broker through server/context.py, not by importing it:\n{_show(bad)}"


def test_server_and_ha_do_not_import_each_other_both_ways() -> None:
    edges = {
        (i.source.split(".")[1], i.target.split(".")[1])
        for i in _all_imports()
        if _within(i.source, "tandem") and _within(i.target, "tandem") and "." in i.source and "." in i.target
    }
    assert not {("server", "ha"), ("ha", "server")} <= edges, "server/ and ha/ import each other"


def test_the_fault_kit_stands_alone() -> None:
    """tandem.testing (the fault-injection kit) imports nothing else of tandem, and nothing of the
    product imports it: only the chaos suite (tandem.chaos, `tandem chaos`) is built on it."""
    kit = "tandem.testing"
    bad = [
        i
        for i in _all_imports()
        if _within(i.source, kit) != _within(i.target, kit)
        and _within(i.source, "tandem")
        and _within(i.target, "tandem")
        and not (_within(i.source, "tandem.chaos") and _within(i.target, kit))
    ]
    assert not bad, f"{kit} must stand alone:\n{_show(bad)}"
