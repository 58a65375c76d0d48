"""The package's shape: the modules of ``src/hlbl`` import one another without a cycle.

A cycle makes the import order matter (a module half-initialised when the other asks for a name)
and is usually dodged by an import inside a function, which hides the dependency instead of
removing it; so the graph counts imports at every level, not only the module-level ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "hlbl"


def module_files(src: Path = SRC, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's ``__init__``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(nodes):
    """Every import statement in ``nodes`` at any depth (functions, classes, try blocks), except
    in the body of ``if TYPE_CHECKING:``, which never runs."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.orelse)
        else:
            yield from _import_nodes(ast.iter_child_nodes(node))


def _known(name: str, modules) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of ``modules``."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in modules:
            return prefix
    return None


def module_imports(name: str, source: str, is_package: bool, modules) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports. ``from .pkg import x`` is an edge
    to ``pkg.x`` when that is a module, else to ``pkg``: the package's ``__init__`` gives x."""
    here = name if is_package else name.rpartition(".")[0]  # the package relative imports start from
    found = set()
    for node in _import_nodes([ast.parse(source)]):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = ".".join(here.split(".")[: len(here.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        found |= {m for m in (_known(t, modules) for t in targets) if m is not None and m != name}
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    files = module_files(src, package)
    return {
        name: module_imports(name, path.read_text(encoding="utf-8"), is_package, files)
        for name, (path, is_package) in files.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as ``[a, b, ..., a]``, or None. Depth-first in sorted order, so the
    same graph always reports the same cycle."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        on_path.discard(path.pop())
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "hlbl.model" in graph and "hlbl.tree" in graph["hlbl.model"]  # the graph is the package's
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import thing\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (pkg / "c.py").write_text("from .sub import thing\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": set(),  # the TYPE_CHECKING import does not count
        "pkg.c": {"pkg.sub"},
        "pkg.sub": {"pkg.sub.b"},
        "pkg.sub.b": {"pkg.a"},
    }
    assert find_cycle(graph) is None
    (pkg / "a.py").write_text("import pkg.c\n")
    cycle = find_cycle(import_graph(tmp_path, "pkg"))
    assert cycle == ["pkg.a", "pkg.c", "pkg.sub", "pkg.sub.b", "pkg.a"]


def architecture_layers(doc: Path = SRC.parent / "docs" / "architecture.md") -> list[set[str]]:
    """The rows of docs/architecture.md's module table, top to bottom, as sets of top-level names."""
    rows = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = line.split("|")
        if len(cells) > 3 and "`" in cells[2]:
            rows.append({name.strip("/").split("/")[0] for name in cells[2].split("`")[1::2]})
    return rows


def layer_violations(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Imports from a module to one in a lower row of the table (``hlbl.x.y`` counts as ``x``)."""
    row = {name: i for i, names in enumerate(layers) for name in names}

    def top(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None

    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if top(a) in row and top(b) in row and row[top(b)] > row[top(a)]
    )


def test_modules_import_only_from_their_row_of_the_architecture_table_or_rows_above():
    layers = architecture_layers()
    assert len(layers) >= 8 and {"run", "train", "output", "cli"} <= set().union(*layers)
    assert layer_violations(import_graph(), layers) == []


def test_the_layer_check_flags_an_import_from_a_lower_row():
    graph = {"hlbl.tree": {"hlbl.run.x"}, "hlbl.run": {"hlbl.tree"}}
    assert layer_violations(graph, [{"tree"}, {"run"}]) == ["hlbl.tree -> hlbl.run.x"]


# ---- one door to a run: only hlbl.run names the files of a run directory ------------------------

RUN_FILE_NAMES = ("run.json", "metrics.jsonl", "state.json")


def run_file_readers(src: Path = SRC, package: str = PACKAGE, owner: str = "hlbl.run") -> list[str]:
    """Where a module other than ``owner`` names a run's own files in code (a string that is one of
    :data:`RUN_FILE_NAMES`, as in ``path / "run.json"``): such a module reads the run directory
    itself rather than through :class:`hlbl.run.Run`. Prose (docstrings, messages) may name them."""
    found = []
    for name, (path, _) in module_files(src, package).items():
        if name == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in RUN_FILE_NAMES:
                found.append(f"{path.relative_to(src)}:{node.lineno}: {node.value}")
    return found


def test_only_the_run_module_reads_a_run_directorys_files():
    assert run_file_readers() == []


def test_the_run_file_check_finds_a_reader(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "run.py").write_text('NAME = "run.json"\n')
    (tmp_path / "pkg" / "other.py").write_text('def f(p):\n    """Reads run.json."""\n    return p / "state.json"\n')
    assert run_file_readers(tmp_path, "pkg", "pkg.run") == ["pkg/other.py:3: state.json"]


def test_every_module_is_in_the_architecture_table():
    """A module missing from the table would escape the layer check above."""
    listed = set().union(*architecture_layers())
    tops = {name.split(".")[1] for name in module_files() if "." in name}
    assert sorted(tops - listed) == []
