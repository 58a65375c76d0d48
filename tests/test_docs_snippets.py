"""Every fenced ``python`` block of README.md and docs/*.md runs as pasted.

Each block runs in a fresh namespace, with the working directory a temporary folder holding what
the docs' earlier steps would have made, at the paths the blocks name: tiny runs in
``runs/ptb-random``, ``runs/r1`` and ``runs/r2`` (one vocabulary), an n-gram model in
``runs/kn5.arpa``, and a small corpus found as ``ptb`` ($HLBL_DATA points at it, so nothing
large is read). A block that is a fragment of the reader's own program (names it does not define)
is marked on the line before its fence with ``<!-- not run: REASON -->``: this test skips it,
and allows only a few such blocks, each with its reason.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import tiny_corpus

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!-- not run: (.+\S) -->")
MAX_NOT_RUN = 2  # fragments of a reader's own program; every other block runs


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(first line, code, why it is not run or None)`` for each fenced python block of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            marker = NOT_RUN.fullmatch(lines[i - 1].strip()) if i else None
            out.append((start + 1, "\n".join(lines[start:end]) + "\n", marker.group(1) if marker else None))
            i = end
        i += 1
    return out


BLOCKS = [(p, line, code, why) for p in DOCS for line, code, why in python_blocks(p)]


def test_the_blocks_are_found_and_few_are_not_run():
    names = {p.name for p, *_ in BLOCKS}
    assert {"README.md", "inference.md", "layer.md"} <= names
    skipped = [f"{p.name}:{line}" for p, line, _, why in BLOCKS if why]
    assert len(skipped) <= MAX_NOT_RUN, f"too many blocks marked not run: {skipped}"


def _train(data: Path, out: Path, seed: int) -> None:
    from hlbl.cli import main

    argv = ["train", "--data", str(data), "--out", str(out), "--epochs", "1", "--dim", "8", "--context", "3"]
    assert main([*argv, "--seed", str(seed), "--quiet", "--device", "cpu"]) == 0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The folder the blocks run in (the module docstring)."""
    from hlbl.cli import main

    root = tmp_path_factory.mktemp("snippets")
    data = tiny_corpus(root / "data" / "ptb", n_train=200)
    _train(data, root / "runs" / "r1", 0)
    _train(data, root / "runs" / "r2", 1)
    shutil.copytree(root / "runs" / "r1", root / "runs" / "ptb-random")
    argv = ["ngram", "train", "--data", str(data), "--order", "3", "--out", str(root / "runs" / "kn5.arpa")]
    assert main(argv) == 0
    return root


@pytest.mark.parametrize("path,line,code,why", [pytest.param(*b, id=f"{b[0].name}:{b[1]}") for b in BLOCKS if not b[3]])
def test_the_block_runs_as_pasted(path, line, code, why, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HLBL_DATA", str(workdir / "data"))
    exec(compile(code, f"{path.relative_to(ROOT)}:{line}", "exec"), {"__name__": "__main__"})
    capsys.readouterr()
