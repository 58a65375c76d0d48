"""No function or method of the package is over 100 lines: a longer one is split into named pieces.

Numba kernels are exempt (decorated ``njit``/``jit``, however imported): a kernel is one compiled
loop nest whose pieces would each cost a call in its hot loop."""

import ast
import textwrap
from pathlib import Path

import pytest

LIMIT = 100
PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hlbl"
KERNEL_DECORATORS = {"njit", "jit"}  # numba.njit, nb.jit(...), njit(cache=True), ...


def _decorator_name(node: ast.expr) -> str:
    """The last name of a decorator: ``njit`` for ``njit``, ``numba.njit`` or ``nb.njit(cache=True)``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def long_functions(source: str, filename: str = "<source>", limit: int = LIMIT) -> list[str]:
    """``file:line qualified.name (N lines)`` for every function over ``limit`` lines, measured from
    its ``def`` line (decorators excluded) to its last line; numba kernels are skipped."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lines = child.end_lineno - child.lineno + 1
                kernel = any(_decorator_name(d) in KERNEL_DECORATORS for d in child.decorator_list)
                if lines > limit and not kernel:
                    found.append(f"{filename}:{child.lineno} {name} ({lines} lines)")
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return found


def test_no_function_over_the_limit():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 10, f"no package sources under {PACKAGE}"
    offenders = [
        hit
        for path in modules
        for hit in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not offenders, f"functions over {LIMIT} lines (split them):\n" + "\n".join(offenders)


def _function(lines: int, decorator: str = "", indent: str = "") -> str:
    """A function of exactly ``lines`` lines (def line included), optionally decorated."""
    body = [f"{indent}    x{i} = {i}" for i in range(lines - 2)] + [f"{indent}    return 0"]
    head = [f"{indent}@{decorator}"] if decorator else []
    return "\n".join([*head, f"{indent}def f():", *body]) + "\n"


def test_the_check_finds_a_long_function():
    assert long_functions(_function(LIMIT)) == []
    assert long_functions(_function(LIMIT + 1)) == ["<source>:1 f (101 lines)"]
    # decorators do not count, and do not exempt unless they are numba's
    assert long_functions(_function(LIMIT, "functools.cache")) == []
    assert long_functions(_function(LIMIT + 1, "torch.no_grad()")) == ["<source>:2 f (101 lines)"]
    method = "class A:\n    class B:\n" + textwrap.indent(_function(LIMIT + 1), "        ")
    assert long_functions(method, "m.py") == ["m.py:3 A.B.f (101 lines)"]
    nested = "def outer():\n" + _function(LIMIT + 1, indent="    ") + "    return f\n"
    assert long_functions(nested) == ["<source>:1 outer (103 lines)", "<source>:2 outer.f (101 lines)"]


@pytest.mark.parametrize("decorator", ["njit", "njit(cache=True)", "numba.njit", "nb.njit(fastmath=True)", "numba.jit"])
def test_numba_kernels_are_exempt(decorator):
    assert long_functions(_function(LIMIT + 50, decorator)) == []
