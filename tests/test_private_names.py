"""A module's private names (``_name``) are its own: no module of the package imports another's.

What one module offers another is public (and documented as such); a private name imported across
modules is an interface nobody sees as one, which a refactoring of its own module silently breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hlbl"


def private_imports(src: Path = SRC) -> list[str]:
    """``file:line name`` for every ``from X import _name`` in the package's modules (an alias
    ``import public as _name`` is no private name of another module)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(src)}:{node.lineno} {alias.name}")
    return found


def test_no_module_imports_another_modules_private_name():
    assert private_imports() == []


def test_the_check_finds_a_private_import(tmp_path):
    (tmp_path / "a.py").write_text("def _helper():\n    pass\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import _helper\n\n\nfrom .a import helper as _ok\n")
    assert private_imports(tmp_path) == ["b.py:2 _helper"]
