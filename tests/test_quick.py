"""The quick subset (tests/quick.py) names real tests and reaches every module of the package."""

from __future__ import annotations

import ast
from pathlib import Path

from quick import QUICK
from test_structure import import_graph, module_files, module_imports

TESTS = Path(__file__).resolve().parent


def functions_of(path: Path) -> set[str]:
    return {
        node.name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    }


def test_every_quick_entry_names_a_test():
    missing = []
    for entry in QUICK:
        file, _, name = entry.partition("::")
        name = name.partition("[")[0]
        if not (TESTS / file).is_file() or (name and name not in functions_of(TESTS / file)):
            missing.append(entry)
    assert not missing, f"tests/quick.py names tests that do not exist: {missing}"


def lazy_names(source: str) -> set[str]:
    """Modules behind the package's lazy names (``hlbl.NAME``, ``from hlbl import NAME``) in ``source``."""
    import hlbl

    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hlbl":
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == "hlbl" and not node.level:
            names |= {alias.name for alias in node.names}
    return {f"hlbl.{hlbl._LAZY[n]}" for n in names if n in hlbl._LAZY}


def quick_reach() -> set[str]:
    """The modules the files of the quick tests import (a package: the modules it imports; a lazy
    name of ``hlbl``: its module), and the modules these import."""
    modules = module_files()
    graph = import_graph()
    direct: set[str] = set()
    for file in {entry.partition("::")[0] for entry in QUICK}:
        source = (TESTS / file).read_text(encoding="utf-8")
        direct |= module_imports("tests", source, False, modules) | lazy_names(source)
    packages = [m for m in direct if modules[m][1]]
    while packages:  # a package stands for what it imports
        new = graph[packages.pop()] - direct
        direct |= new
        packages += [m for m in new if modules[m][1]]
    return direct.union(*(graph[m] for m in direct))


def test_every_module_is_reached_by_a_quick_test():
    missing = sorted(
        set(module_files()) - quick_reach() - {"hlbl.__main__"}
    )  # (python -m hlbl: test_cli_startup runs it)
    assert not missing, f"no quick test reaches {missing}: add one to tests/quick.py"
